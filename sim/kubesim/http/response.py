"""Answers on the wire: headers as the real server sends them (``Audit-Id``,
``Warning``), and lists spliced from the objects' already-encoded JSON."""

from __future__ import annotations

import os
from typing import Any

import orjson

from sim.kubesim.api import Resource
from sim.kubesim.http.request import Send

__all__ = ["JSON", "list_head", "respond", "spliced", "start_stream"]

JSON = b"application/json"


def _audit_id() -> bytes:
    """A random (version 4) UUID, as ``uuid.uuid4`` makes it, without its object."""
    h = os.urandom(16).hex()
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}".encode()


async def start_stream(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", JSON), (b"cache-control", b"no-cache, private")],
        }
    )


async def respond(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_type: bytes = JSON,
    headers: dict[str, str] | None = None,
    warnings: list[str] | None = None,
) -> None:
    raw = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"audit-id", _audit_id()),
        (b"cache-control", b"no-cache, private"),
    ]
    for key, value in (headers or {}).items():
        raw.append((key.lower().encode(), value.encode()))
    for warning in dict.fromkeys(warnings or ()):
        raw.append((b"warning", f'299 - "{warning}"'.encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def list_head(resource: Resource, rv: int, token: str, remaining: int | None) -> dict[str, Any]:
    """A list's kind, apiVersion and metadata (its items follow)."""
    metadata: dict[str, Any] = {"resourceVersion": str(rv)}
    if token:
        metadata["continue"] = token
    if remaining is not None:
        metadata["remainingItemCount"] = remaining
    return {
        "kind": resource.rtype.list_kind,
        "apiVersion": resource.api_version,
        "metadata": metadata,
    }


def spliced(head: dict[str, Any], name: bytes, parts: list[bytes | None]) -> bytes:
    """``head`` with a last member ``name`` whose value is the array of the JSON ``parts``:
    the bytes orjson writes for the whole (compact, members in order)."""
    opening = orjson.dumps(head)[:-1]
    separator = b"," if len(head) else b""
    items = b",".join(part for part in parts if part is not None)
    return opening + separator + b'"' + name + b'":[' + items + b"]}"
