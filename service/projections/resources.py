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
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb
from sqlalchemy import Connection, Table
from sqlalchemy.dialects.postgresql import insert

from service.domain.events import API_TOKENS, RESOURCES, applied_to
from service.eventstore.port import RecordedEvent
from service.jsonio import dumps
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


#: How the unit of work queues a statement into its commit pipeline
#: (``PostgresEventRecorder.defer``): psycopg ``%(name)s`` parameters, per row.
Defer = Callable[[str, Sequence[Mapping[str, Any]]], None]

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
# Ordered idempotent updates: a row only ever moves to a newer version.
_ON_CONFLICT = (
    "ON CONFLICT (kind, namespace, name) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS[3:])
    + " WHERE resources.resource_version < EXCLUDED.resource_version"
)
_INSERT = f"INSERT INTO resources ({', '.join(_COLUMNS)}) "
_UPSERT = _INSERT + f"VALUES ({', '.join(f'%({c})s' for c in _COLUMNS)}) " + _ON_CONFLICT
# New Workloads in one statement: one JSON array that Postgres reads as a
# record set, instead of one execution per row (psycopg's per-row pipeline
# work cost the API more CPU per submission than anything else it did;
# Postgres's cost is the same either way). Same columns, same conflict rule.
_UPSERT_NEW_WORKLOADS = (
    _INSERT
    + "SELECT 'Workload', r.namespace, r.name, r.uid, r.version, 1, r.labels, r.annotations, "
    "r.spec, r.status, NULL, %(now)s, %(now)s, false "
    "FROM jsonb_to_recordset(%(rows)s) AS r(namespace text, name text, uid uuid, "
    "version bigint, labels jsonb, annotations jsonb, spec jsonb, status jsonb) " + _ON_CONFLICT
)


def _params(row: Mapping[str, Any]) -> dict[str, Any]:
    return {c: Jsonb(row[c]) if c in _JSON else row[c] for c in _COLUMNS}


def upsert_resources(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write ``resource_row`` rows now, on ``conn``."""
    if rows:
        conn.exec_driver_sql(_UPSERT, [_params(row) for row in rows])


def defer_resources(defer: Defer, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write ``resource_row`` rows in the commit pipeline (``defer``: the
    unit of work's ``events.defer``): no round trip of their own."""
    defer(_UPSERT, [_params(row) for row in rows])


def defer_new_workloads(defer: Defer, rows: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """Write new Workloads' rows (generation 1, created and updated ``now``)
    in the commit pipeline, all in one statement. Each row: namespace, name,
    uid, version, labels, annotations, spec, status."""
    defer(_UPSERT_NEW_WORKLOADS, [{"now": now, "rows": Jsonb(list(rows), dumps=dumps)}])


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
