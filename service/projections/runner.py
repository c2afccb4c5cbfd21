"""Projections: a read model's apply function replayed over the event log.

The commands keep the read models inline (service/projections/resources.py);
a rebuild clears a projection's tables and replays the log from position 0
through the same function in one transaction, moving its tracking row with
it, so readers see the old model or the new one, never half of one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Connection, Engine, Table, delete

from service.eventstore.port import RecordedEvent
from service.eventstore.postgres import PostgresEventRecorder

_ENSURE = (
    "INSERT INTO projection_tracking (name, position) VALUES (%(name)s, 0) "
    "ON CONFLICT (name) DO NOTHING"
)
# FOR UPDATE: two rebuilds of one projection take turns instead of both
# clearing and filling its tables.
_LOCK = "SELECT position FROM projection_tracking WHERE name = %(name)s FOR UPDATE"
_MOVE = "UPDATE projection_tracking SET position = %(position)s WHERE name = %(name)s"


class Projection(Protocol):
    name: str
    tables: tuple[Table, ...]

    def apply(self, conn: Connection, events: Sequence[RecordedEvent]) -> None: ...


class UnknownProjection(KeyError):
    pass


@dataclass(frozen=True, slots=True)
class CatchUp:
    name: str
    applied: int
    position: int


class ProjectionRunner:
    def __init__(
        self,
        engine: Engine,
        projections: Sequence[Projection],
        batch_size: int = 1000,
        progress: Callable[[CatchUp], None] | None = None,
    ) -> None:
        self._engine = engine
        self._projections: Mapping[str, Projection] = {p.name: p for p in projections}
        self._batch = batch_size
        self._progress = progress

    @property
    def names(self) -> list[str]:
        return sorted(self._projections)

    def _get(self, name: str) -> Projection:
        try:
            return self._projections[name]
        except KeyError:
            raise UnknownProjection(name) from None

    def rebuild(self, name: str) -> CatchUp:
        """Clear the read model and replay the whole log into it, atomically."""
        projection, total = self._get(name), 0
        with self._engine.begin() as conn:
            self._ensure(conn, projection)
            conn.exec_driver_sql(_LOCK, {"name": name})
            for table in projection.tables:
                conn.execute(delete(table))
            conn.exec_driver_sql(_MOVE, {"name": name, "position": 0})
            while True:
                applied, position = self._step(conn, projection)
                total += applied
                if self._progress and applied:
                    self._progress(CatchUp(name, total, position))
                if applied < self._batch:
                    return CatchUp(name, total, position)

    def position(self, name: str) -> int:
        with self._engine.connect() as conn:
            value = conn.exec_driver_sql(
                "SELECT position FROM projection_tracking WHERE name = %(name)s", {"name": name}
            ).scalar()
        return int(value or 0)

    def _ensure(self, conn: Connection, projection: Projection) -> None:
        conn.exec_driver_sql(_ENSURE, {"name": projection.name})

    def _step(self, conn: Connection, projection: Projection) -> tuple[int, int]:
        self._ensure(conn, projection)
        position = int(conn.exec_driver_sql(_LOCK, {"name": projection.name}).scalar_one())
        events = PostgresEventRecorder(conn).read_all(position, self._batch)
        if not events:
            return 0, position
        projection.apply(conn, events)
        position = events[-1].position
        conn.exec_driver_sql(_MOVE, {"name": projection.name, "position": position})
        return len(events), position
