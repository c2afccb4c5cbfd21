"""A request as the stand-in reads it: the ASGI message, the resource it names, its verb,
body and write options (``fieldManager``, ``dryRun``, ``fieldValidation``)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import yaml

from service.jsonio import loads
from sim.kubesim import errors
from sim.kubesim.api import APPLY_PATCH, APPLY_PATCH_CBOR, Context, Resource
from sim.kubesim.auth import User
from sim.kubesim.errors import Cause
from sim.kubesim.store import clone

__all__ = [
    "Receive",
    "Request",
    "Scope",
    "Send",
    "Target",
    "body_object",
    "body_of",
    "content_type_of",
    "delete_options",
    "read_request",
    "selectable_fields",
    "verb_of",
    "wants_table",
    "write_context",
]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("1", "true")


@dataclass(slots=True)
class Target:
    """What a resource URL names."""

    resource: Resource
    namespace: str
    name: str
    subresource: str


async def read_request(scope: Scope, receive: Receive) -> Request:
    chunks = []
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    query = dict(_query(scope["query_string"]))
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    return Request(scope["method"], scope["path"], query, headers, b"".join(chunks))


@functools.lru_cache(maxsize=1024)
def _query(raw: bytes) -> dict[str, str]:
    """A query string's parameters (the last of repeated ones); remembered, as clients send
    the same few again and again: callers take a copy."""
    return {k: v[-1] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}


def verb_of(request: Request, target: Target) -> str:
    method = request.method
    if method == "GET":
        if target.name:
            return "get"
        return "watch" if request.flag("watch") else "list"
    if method == "POST" and not target.name:
        return "create"
    if method == "PUT" and target.name:
        return "update"
    if method == "PATCH" and target.name:
        return "patch"
    if method == "DELETE":
        return "delete" if target.name else "deletecollection"
    raise errors.method_not_allowed(
        f"the server does not allow this method on the requested resource ({method})"
    )


def wants_table(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "as=Table" in accept and "g=meta.k8s.io" in accept


def selectable_fields(resource: Resource) -> tuple[str, ...]:
    return ("metadata.name", "metadata.namespace", *resource.rtype.field_selectors)


def _parse(raw: bytes, content_type: str) -> Any:
    if not raw:
        raise errors.bad_request("the request body is empty")
    try:
        if "yaml" in content_type:
            # Clients mostly send JSON, which is YAML too, and the JSON parser is far faster.
            if raw.lstrip()[:1] in (b"{", b"["):
                try:
                    return loads(raw)
                except ValueError:
                    pass  # not JSON after all: read as YAML below
            # Copied: YAML anchors make one node appear in several places, and a body
            # is stored as it is (ApiCore's ``owned``): no part of it may alias another.
            return clone(yaml.load(raw, Loader=yaml.CSafeLoader))
        return loads(raw)
    except (ValueError, yaml.YAMLError) as error:
        raise errors.bad_request(f"the body of the request could not be decoded: {error}") from None


def body_of(request: Request, content_type: str) -> Any:
    if content_type == APPLY_PATCH:
        return _parse(request.body, "yaml")
    return _parse(request.body, content_type)


def body_object(request: Request) -> dict[str, Any]:
    body = _parse(request.body, request.headers.get("content-type", "application/json"))
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return body


def content_type_of(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip()


def write_context(request: Request, user: User) -> Context:
    manager = request.query.get("fieldManager", "")
    if not manager:
        if request.method == "PATCH" and content_type_of(request) in (
            APPLY_PATCH,
            APPLY_PATCH_CBOR,
        ):
            # ValidatePatchOptions: controllers must name themselves for apply.
            raise errors.invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                [
                    Cause(
                        "FieldValueRequired",
                        "Required value: is required for apply patch",
                        "fieldManager",
                    )
                ],
            )
        manager = request.headers.get("user-agent", "unknown").split("/")[0][:128]
    dry_run = request.query.get("dryRun", "")
    if dry_run and dry_run != "All":
        raise errors.bad_request(f'dryRun: Unsupported value: "{dry_run}": supported values: "All"')
    validation = request.query.get("fieldValidation", "")
    if validation and validation not in ("Strict", "Warn", "Ignore"):
        raise errors.bad_request(
            f'fieldValidation: Unsupported value: "{validation}": '
            'supported values: "Ignore", "Strict", "Warn"'
        )
    return Context(
        user=user.name,
        groups=user.groups,
        manager=manager,
        dry_run=dry_run == "All",
        field_validation=validation,
    )


def delete_options(request: Request) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if request.body:
        try:
            parsed = loads(request.body)
        except ValueError:
            raise errors.bad_request("the body of the request could not be decoded") from None
        if isinstance(parsed, dict):
            options = parsed
    if request.query.get("propagationPolicy"):
        options["propagationPolicy"] = request.query["propagationPolicy"]
    orphan = options.get("orphanDependents", request.query.get("orphanDependents"))
    if orphan in (True, "true") and not options.get("propagationPolicy"):
        options["propagationPolicy"] = "Orphan"
    policy = options.get("propagationPolicy")
    if policy and policy not in ("Orphan", "Background", "Foreground"):
        raise errors.bad_request(f'propagationPolicy: Unsupported value: "{policy}"')
    return options
