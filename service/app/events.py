"""The event log as clients see it: filtered by namespace, workload, kind or
type, after a position; secrets and token hashes never leave the service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, column, literal, select, table
from sqlalchemy.dialects.postgresql import JSONB

from service.app.auth import Principal, Role
from service.app.visibility import object_for
from service.eventstore.postgres import wait_durable

_events = table(
    "events",
    column("position"),
    column("stream"),
    column("version"),
    column("event_id"),
    column("type"),
    column("data", JSONB),
    column("metadata", JSONB),
    column("recorded_at"),
)
_HIDDEN_KEYS = ("secret", "token_hash")


@dataclass(frozen=True)
class EventFilter:
    namespace: str | None = None
    workload: str | None = None
    kind: str | None = None
    type: str | None = None


def _visible(principal: Principal) -> Any:
    conditions = []
    if Role.ADMIN not in principal.roles:
        conditions.append(~_events.c.stream.like("token-%"))
    if not principal.roles - {Role.SUBMITTER} and "*" not in principal.namespaces:
        conditions.append(_events.c.data["namespace"].astext.in_(sorted(principal.namespaces)))
    return and_(literal(True), *conditions)


def _public(data: dict[str, Any], principal: Principal) -> dict[str, Any]:
    """No secrets; other namespaces' workloads unnamed (:mod:`service.app.visibility`)."""
    return object_for({k: v for k, v in data.items() if k not in _HIDDEN_KEYS}, principal)


class EventQueries:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def after(
        self, principal: Principal, position: int, wanted: EventFilter, limit: int
    ) -> list[dict[str, Any]]:
        query = select(_events).where(_events.c.position > position, _visible(principal))
        data = _events.c.data
        if wanted.namespace is not None:
            query = query.where(data["namespace"].astext == wanted.namespace)
        if wanted.workload is not None:
            query = query.where(
                data["kind"].astext == "Workload", data["name"].astext == wanted.workload
            )
        if wanted.kind is not None:
            query = query.where(data["kind"].astext == wanted.kind)
        if wanted.type is not None:
            query = query.where(_events.c.type == wanted.type)
        query = query.order_by(_events.c.position).limit(limit)
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
            if rows:
                wait_durable(conn)
        return [
            {
                "position": r.position,
                "stream": r.stream,
                "version": r.version,
                "id": str(r.event_id),
                "type": r.type,
                "data": _public(dict(r.data), principal),
                "metadata": dict(r.metadata),
                "recordedAt": r.recorded_at.isoformat(),
            }
            for r in rows
        ]

    def head(self, durable: bool = False) -> int:
        """The newest position; ``durable`` when it is handed to a client
        (see service.eventstore.postgres.wait_durable)."""
        with self._engine.connect() as conn:
            value = conn.exec_driver_sql("SELECT position FROM event_head WHERE id = 1").scalar()
            if durable:
                wait_durable(conn)
        return int(value or 0)


__all__ = ["EventFilter", "EventQueries"]
