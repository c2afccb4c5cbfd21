"""The API's read models, kept inline and rebuildable.

Each resource event carries the object's whole state after the change
(``ResourceChanged``: kind, namespace, name, uid, generation, labels,
annotations, spec, status, encrypted secret; ``ResourceDeleted``: the same
with ``deleted``). Applying one is an upsert guarded by the stream version,
so applying an event twice, or an older one after a newer, changes nothing:
the command handler applies it inline in the transaction that appends it,
and a rebuild replays the whole log through the very same function.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb
from sqlalchemy import Connection, Table
from sqlalchemy.dialects.postgresql import insert

from service.domain.events import API_TOKENS, RESOURCES, applied_to
from service.eventstore.port import RecordedEvent
from service.projections.schema import api_tokens, resources

#: What this projection applies, as the registry declares it: every event
#: on an object's stream (it carries the object's whole state) and the tokens'.
RESOURCE_EVENTS = applied_to(RESOURCES)
TOKEN_EVENTS = applied_to(API_TOKENS)


def resource_row(data: Mapping[str, Any], version: int, at: datetime) -> dict[str, Any]:
    secret = data.get("secret")
    return {
        "kind": data["kind"],
        "namespace": data.get("namespace") or "",
        "name": data["name"],
        "uid": UUID(str(data["uid"])),
        "resource_version": version,
        "generation": int(data.get("generation", 1)),
        "labels": dict(data.get("labels") or {}),
        "annotations": dict(data.get("annotations") or {}),
        "spec": dict(data.get("spec") or {}),
        "status": dict(data.get("status") or {}),
        "secret": base64.b64decode(secret) if secret else None,
        "created_at": datetime.fromisoformat(str(data["created_at"])),
        "updated_at": at,
        "deleted": bool(data.get("deleted", False)),
    }


def upsert_resources(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Apply rows now, on ``conn``; the same statement a unit of work defers
    into its commit pipeline (``UPSERT_SQL`` with ``upsert_params``)."""
    if rows:
        conn.exec_driver_sql(UPSERT_SQL, [upsert_params(row) for row in rows])


_COLUMNS = (
    "kind",
    "namespace",
    "name",
    "uid",
    "resource_version",
    "generation",
    "labels",
    "annotations",
    "spec",
    "status",
    "secret",
    "created_at",
    "updated_at",
    "deleted",
)
_JSON = frozenset({"labels", "annotations", "spec", "status"})
UPSERT_SQL = (
    f"INSERT INTO resources ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join(f'%({c})s' for c in _COLUMNS)}) "
    "ON CONFLICT (kind, namespace, name) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS[3:])
    + " WHERE resources.resource_version < EXCLUDED.resource_version"
)


def upsert_params(row: Mapping[str, Any]) -> dict[str, Any]:
    """A resource row as psycopg parameters for ``UPSERT_SQL``: the same
    upsert as ``upsert_resources``, for the commit pipeline."""
    return {c: Jsonb(row[c]) if c in _JSON else row[c] for c in _COLUMNS}


def token_row(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": UUID(str(data["id"])),
        "name": data["name"],
        "role": data["role"],
        "namespaces": list(data.get("namespaces") or []),
        "token_hash": bytes.fromhex(str(data["token_hash"])),
        "created_at": datetime.fromisoformat(str(data["created_at"])),
        "revoked": bool(data.get("revoked", False)),
        "expires_at": datetime.fromisoformat(str(data["expires_at"]))
        if data.get("expires_at")
        else None,
    }


def upsert_tokens(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        return
    statement = insert(api_tokens)
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=[api_tokens.c.id], set_={"revoked": statement.excluded.revoked}
        ),
        list(rows),
    )


class Resources:
    """``projections rebuild resources``: the read models from the log."""

    name = "resources"
    tables: tuple[Table, ...] = (resources, api_tokens)

    def apply(self, conn: Connection, events: Sequence[RecordedEvent]) -> None:
        latest: dict[tuple[str, str, str], dict[str, Any]] = {}
        tokens: dict[UUID, dict[str, Any]] = {}
        for event in events:
            if event.type in RESOURCE_EVENTS:
                row = resource_row(event.data, event.version, event.metadata.occurred_at)
                latest[(row["kind"], row["namespace"], row["name"])] = row
            elif event.type in TOKEN_EVENTS:
                token = token_row(event.data)
                tokens[token["id"]] = token
        upsert_resources(conn, list(latest.values()))
        upsert_tokens(conn, list(tokens.values()))
