"""The stream index: every stream, its category, version and last event.

The first read model; the API lists resources of a kind from it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Table
from sqlalchemy.dialects.postgresql import insert

from service.eventstore.port import RecordedEvent
from service.projections.schema import stream_index


class StreamIndex:
    name = "stream_index"
    tables: tuple[Table, ...] = (stream_index,)

    def apply(self, conn: Connection, events: Sequence[RecordedEvent]) -> None:
        latest: dict[str, RecordedEvent] = {}
        for event in events:
            latest[event.stream] = event
        rows = [
            {
                "stream": e.stream,
                "category": e.category,
                "version": e.version,
                "last_type": e.type,
                "last_position": e.position,
                "updated_at": e.recorded_at,
            }
            for e in latest.values()
        ]
        statement = insert(stream_index)
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=[stream_index.c.stream],
                set_={
                    "version": statement.excluded.version,
                    "last_type": statement.excluded.last_type,
                    "last_position": statement.excluded.last_position,
                    "updated_at": statement.excluded.updated_at,
                },
            ),
            rows,
        )
