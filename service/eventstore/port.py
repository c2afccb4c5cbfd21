"""The event store port: what every adapter promises.

Streams are named ``<category>-<id>`` (``clusterqueue-team-a``,
``workload-ns/train-42``). A stream's version is the number of events in it;
``expected_version`` 0 means "the stream must not exist yet". Every event also
gets a *global position*: gap-free, strictly increasing, and visible to readers
strictly in position order, so that a tailing reader never skips an event that
commits late. Adapters differ in how they keep that promise; each says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Protocol
from uuid import UUID

ANY_VERSION: Final = -1
"""Pass as ``expected_version`` to append without a concurrency check."""

JSON = Mapping[str, Any]

Accept = Callable[[str, str], None]
"""``accept(stream, event_type)`` raises on an append the caller's event
registry does not declare (the store itself stores any type)."""


@dataclass(frozen=True, slots=True)
class EventMetadata:
    """Who caused an event and why; stored with every event."""

    actor: str
    occurred_at: datetime
    request_id: str | None = None
    correlation_id: UUID | None = None
    causation_id: UUID | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "occurred_at": self.occurred_at.isoformat(),
            "request_id": self.request_id,
            "correlation_id": str(self.correlation_id) if self.correlation_id else None,
            "causation_id": str(self.causation_id) if self.causation_id else None,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> EventMetadata:
        correlation = raw.get("correlation_id")
        causation = raw.get("causation_id")
        return cls(
            actor=str(raw["actor"]),
            occurred_at=datetime.fromisoformat(str(raw["occurred_at"])),
            request_id=raw.get("request_id"),
            correlation_id=UUID(correlation) if correlation else None,
            causation_id=UUID(causation) if causation else None,
        )


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event not yet stored. ``event_id`` is made by the client: appending
    the same id again is a no-op that answers with the original position."""

    event_id: UUID
    type: str
    data: JSON
    metadata: EventMetadata


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    position: int
    stream: str
    version: int
    event_id: UUID
    type: str
    data: JSON
    metadata: EventMetadata
    recorded_at: datetime

    @property
    def category(self) -> str:
        return self.stream.split("-", 1)[0]


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Positions of the appended events, in order; ``duplicate`` when every
    event had been appended before and nothing was written."""

    stream: str
    version: int
    positions: tuple[int, ...]
    duplicate: bool = False

    @property
    def last_position(self) -> int:
        return self.positions[-1]


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A message to publish once the transaction that wrote it commits."""

    message_id: UUID
    topic: str
    payload: JSON = field(default_factory=dict)


class EventStoreError(Exception):
    """Base of every error the event store raises on purpose."""


class ConcurrencyConflict(EventStoreError):
    """Another writer appended to the stream since ``expected_version`` was read."""

    def __init__(self, stream: str, expected: int, actual: int | None) -> None:
        self.stream = stream
        self.expected = expected
        self.actual = actual
        found = "unknown" if actual is None else str(actual)
        super().__init__(f"stream {stream!r}: expected version {expected}, found {found}")


class DuplicateEventMismatch(EventStoreError):
    """Some, not all, of a batch's event ids were appended before, or to another
    stream: a client reused ids for a different append."""


class EventRecorder(Protocol):
    """Appends and reads inside whatever transaction the adapter was given."""

    def append(
        self,
        stream: str,
        expected_version: int,
        events: Sequence[NewEvent],
    ) -> AppendResult: ...

    def read_stream(self, stream: str, after_version: int = 0) -> list[RecordedEvent]: ...

    def read_all(self, after_position: int, limit: int = 1000) -> list[RecordedEvent]: ...

    def stream_version(self, stream: str) -> int: ...

    def head_position(self) -> int: ...


def check_batch(stream: str, events: Sequence[NewEvent]) -> None:
    """Refuse batches that no adapter could store sensibly."""
    if not stream or len(stream) > 512:
        raise ValueError("stream name must be 1..512 characters")
    if not events:
        raise ValueError("append needs at least one event")
    ids = [event.event_id for event in events]
    if len(set(ids)) != len(ids):
        raise DuplicateEventMismatch("a batch repeats an event_id")


def resolve_duplicates(
    stream: str,
    events: Sequence[NewEvent],
    found: Mapping[UUID, tuple[str, int, int]],
) -> AppendResult | None:
    """Given already-stored ``event_id -> (stream, version, position)``, answer
    an idempotent replay, or ``None`` when the batch is new."""
    if not found:
        return None
    if len(found) != len(events) or any(found[e.event_id][0] != stream for e in events):
        raise DuplicateEventMismatch(
            f"stream {stream!r}: batch mixes new and already-appended event ids"
        )
    rows = [found[e.event_id] for e in events]
    return AppendResult(
        stream=stream,
        version=max(version for _, version, _ in rows),
        positions=tuple(position for _, _, position in rows),
        duplicate=True,
    )
