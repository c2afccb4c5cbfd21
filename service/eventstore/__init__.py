"""Append-only event store: a port, an in-memory fake and a Postgres adapter."""

from service.eventstore.port import (
    ANY_VERSION,
    AppendResult,
    ConcurrencyConflict,
    DuplicateEventMismatch,
    EventMetadata,
    EventRecorder,
    EventStoreError,
    NewEvent,
    OutboxMessage,
    RecordedEvent,
)

__all__ = [
    "ANY_VERSION",
    "AppendResult",
    "ConcurrencyConflict",
    "DuplicateEventMismatch",
    "EventMetadata",
    "EventRecorder",
    "EventStoreError",
    "NewEvent",
    "OutboxMessage",
    "RecordedEvent",
]
