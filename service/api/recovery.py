"""What a write whose COMMIT was cut short left, read back for its answer.

Each function makes the ``Recover`` of one kind of write
(service/api/indoubt.py): given the 32-bit ids of the write's transactions
that committed, it finds the rows they wrote (by ``xmin``, beside a
condition an index serves, but in the small checkpoint table) and builds
the result the write would have returned, or None when nothing of it
committed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, select, text

from service.app.auth import IssuedToken, Role, hash_token
from service.app.errors import AppError
from service.app.kinds import KINDS, Kind
from service.app.resources import stream_name, to_object
from service.app.submissions import ItemResult, Obj, Submission
from service.app.submissions.service import scale_object
from service.projections.resources import resource_row
from service.projections.schema import api_tokens

WORKLOADS = KINDS["workloads"]
Recover = Callable[[Connection, Sequence[int]], Any]
"""What a write left, read back: from the 32-bit ids of its transactions
that committed (maybe none), its result as the write would have returned
it, or None when nothing of it committed."""

# What a write appended to one stream, if one of its transactions did.
_WRITTEN = text(
    "SELECT version, type, data, metadata FROM events WHERE stream = :stream "
    "AND xmin::text::bigint = ANY(:xmins) ORDER BY version DESC LIMIT 1"
)
# The submissions' events that committed transactions wrote.
_SUBMITTED = text(
    "SELECT stream, version, data FROM events WHERE stream = ANY(:streams) "
    "AND type = 'WorkloadSubmitted' AND xmin::text::bigint = ANY(:xmins)"
)
# A small table (a checkpoint a minute at most): read whole.
_CHECKPOINT = text(
    "SELECT note FROM ledger_checkpoints WHERE xmin::text::bigint = ANY(:xmins) "
    "ORDER BY tree_size DESC LIMIT 1"
)


class NotCommitted(AppError):
    """Known not to have committed, and not run again."""

    status, kind, title = 503, "database-unavailable", "Database unavailable"


def resource(kind: Kind, namespace: str, name: Any) -> Recover:
    """An object's create, replace, patch, delete or (a Workload's) cancel:
    the object as the event it wrote left it."""
    stream = (
        stream_name(kind.kind, namespace if kind.namespaced else "", name)
        if isinstance(name, str)
        else None
    )

    def recover(conn: Connection, xmins: Sequence[int]) -> Obj | None:
        if not xmins or stream is None:
            return None
        row = conn.execute(_WRITTEN, {"stream": stream, "xmins": list(xmins)}).first()
        if row is None:
            return None
        at = datetime.fromisoformat(row.metadata["occurred_at"])
        return to_object(kind, resource_row(row.data, row.version, at))

    return recover


def scale(namespace: str, name: str) -> Recover:
    """A scale: the workload's ``Scale`` as the last event it wrote left it
    (a scale down writes its released units' events after its own)."""
    workload = resource(WORKLOADS, namespace, name)

    def recover(conn: Connection, xmins: Sequence[int]) -> Obj | None:
        obj = workload(conn, xmins)
        return None if obj is None else scale_object(obj)

    return recover


def name_of(body: Any) -> Any:
    """``metadata.name`` of a body, whatever the body is."""
    metadata = body.get("metadata") if isinstance(body, Mapping) else None
    return metadata.get("name") if isinstance(metadata, Mapping) else None


def issued_token(secret: str) -> Recover:
    """A token's issue: the token as issued, its secret the one the route
    chose (only its hash is stored)."""

    def recover(conn: Connection, xmins: Sequence[int]) -> IssuedToken | None:
        if not xmins:
            return None
        row = conn.execute(
            select(api_tokens).where(api_tokens.c.token_hash == hash_token(secret))
        ).first()
        if row is None:
            return None
        return IssuedToken(
            row.id,
            row.name,
            Role(row.role),
            list(row.namespaces),
            secret,
            row.created_at,
            row.expires_at,
        )

    return recover


def revoked_token(token_id: UUID) -> Recover:
    """A token's revocation: its id, once its TokenRevoked event committed."""

    def recover(conn: Connection, xmins: Sequence[int]) -> UUID | None:
        if not xmins:
            return None
        row = conn.execute(_WRITTEN, {"stream": f"token-{token_id}", "xmins": list(xmins)}).first()
        return token_id if row is not None and row.type == "TokenRevoked" else None

    return recover


def checkpoint() -> Recover:
    """A checkpoint signed on demand: its note, once stored."""

    def recover(conn: Connection, xmins: Sequence[int]) -> str | None:
        if not xmins:
            return None
        note = conn.execute(_CHECKPOINT, {"xmins": list(xmins)}).scalar()
        return None if note is None else str(note)

    return recover


def _created(conn: Connection, streams: Sequence[str], xmins: Sequence[int]) -> dict[str, Obj]:
    """The Workloads the committed transactions created, by stream, as
    their 201s carried them (the WorkloadSubmitted event holds what
    SubmissionService._append answered with)."""
    if not xmins or not streams:
        return {}
    rows = conn.execute(_SUBMITTED, {"streams": list(streams), "xmins": list(xmins)}).all()
    found = {}
    for stream, version, data in rows:
        row = {
            **data,
            "resource_version": version,
            "created_at": datetime.fromisoformat(data["created_at"]),
        }
        found[stream] = to_object(WORKLOADS, row)
    return found


def submitted(submissions: Sequence[Submission]) -> Recover:
    """A group commit's batch: each submission's created object, or None."""
    streams = [stream_name("Workload", s.namespace, s.workload.metadata.name) for s in submissions]

    def recover(conn: Connection, xmins: Sequence[int]) -> list[Obj | None]:
        created = _created(conn, streams, xmins)
        return [created.get(stream) for stream in streams]

    return recover


def bulk(namespace: str, items: Sequence[Any]) -> Recover:
    """A bulk submission: a result per item, created (201, its object) if a
    committed transaction created it, else refused as not committed (503:
    submit it again); None when no item was created."""
    names = [name_of(item) for item in items]
    streams = {
        stream_name("Workload", namespace, name): index
        for index, name in enumerate(names)
        if isinstance(name, str)
    }

    def recover(conn: Connection, xmins: Sequence[int]) -> list[ItemResult] | None:
        created = _created(conn, list(streams), xmins)
        if not created:
            return None
        by_index = {streams[stream]: obj for stream, obj in created.items()}
        lost = NotCommitted("the database went away before this item committed; submit it again")
        return [
            ItemResult(i, name if isinstance(name, str) else None, 201, None, by_index[i])
            if i in by_index
            else ItemResult(i, name if isinstance(name, str) else None, lost.status, lost)
            for i, name in enumerate(names)
        ]

    return recover
