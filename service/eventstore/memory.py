"""In-memory event store: the port's reference adapter.

One lock serialises appends, so positions are gap-free and readers see them in
order trivially. It passes the contract suite (tests/eventstore/contract.py)
beside the Postgres adapter, which keeps that suite about the port and not
about Postgres.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from uuid import UUID

from service.eventstore.port import (
    ANY_VERSION,
    AppendResult,
    ConcurrencyConflict,
    NewEvent,
    RecordedEvent,
    check_batch,
    resolve_duplicates,
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class InMemoryEventStore:
    def __init__(self, clock: Callable[[], datetime] = _utcnow) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._log: list[RecordedEvent] = []
        self._streams: dict[str, list[RecordedEvent]] = {}
        self._by_id: dict[UUID, RecordedEvent] = {}

    def append(
        self, stream: str, expected_version: int, events: Sequence[NewEvent]
    ) -> AppendResult:
        check_batch(stream, events)
        with self._lock:
            found = {
                e.event_id: (r.stream, r.version, r.position)
                for e in events
                if (r := self._by_id.get(e.event_id)) is not None
            }
            replay = resolve_duplicates(stream, events, found)
            if replay is not None:
                return replay
            current = len(self._streams.get(stream, ()))
            if expected_version not in (ANY_VERSION, current):
                raise ConcurrencyConflict(stream, expected_version, current)
            return self._write(stream, current, events)

    def _write(self, stream: str, current: int, events: Sequence[NewEvent]) -> AppendResult:
        now = self._clock()
        recorded = [
            RecordedEvent(
                position=len(self._log) + offset + 1,
                stream=stream,
                version=current + offset + 1,
                event_id=event.event_id,
                type=event.type,
                data=event.data,
                metadata=event.metadata,
                recorded_at=now,
            )
            for offset, event in enumerate(events)
        ]
        self._log.extend(recorded)
        self._streams.setdefault(stream, []).extend(recorded)
        self._by_id.update({r.event_id: r for r in recorded})
        return AppendResult(stream, recorded[-1].version, tuple(r.position for r in recorded))

    def read_stream(self, stream: str, after_version: int = 0) -> list[RecordedEvent]:
        with self._lock:
            return list(self._streams.get(stream, ())[after_version:])

    def read_all(self, after_position: int, limit: int = 1000) -> list[RecordedEvent]:
        with self._lock:
            return self._log[after_position : after_position + limit]

    def stream_version(self, stream: str) -> int:
        with self._lock:
            return len(self._streams.get(stream, ()))

    def head_position(self) -> int:
        with self._lock:
            return len(self._log)
