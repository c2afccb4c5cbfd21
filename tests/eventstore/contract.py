"""The event store contract: every adapter passes these same tests.

A subclass provides a ``store`` fixture (an object with the EventRecorder
methods, each call in its own transaction).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from service.eventstore import (
    ANY_VERSION,
    ConcurrencyConflict,
    DuplicateEventMismatch,
    EventMetadata,
    NewEvent,
)

META = EventMetadata(
    actor="alice",
    occurred_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
    request_id="req-1",
    correlation_id=uuid.UUID(int=7),
    causation_id=uuid.UUID(int=8),
)


def new(type_: str = "Happened", **data: Any) -> NewEvent:
    return NewEvent(uuid.uuid4(), type_, data, META)


def run_released_together(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads that all start at one barrier."""
    barrier = threading.Barrier(count)

    def task(i: int) -> Any:
        barrier.wait()
        try:
            return work(i)
        except Exception as error:  # collected and inspected by the caller
            return error

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(task, range(count)))


class EventStoreContract:
    def test_append_to_new_stream_numbers_versions_and_positions(self, store: Any) -> None:
        result = store.append("order-1", 0, [new(n=1), new(n=2)])
        assert (result.version, result.positions, result.duplicate) == (2, (1, 2), False)
        assert store.stream_version("order-1") == 2
        assert store.head_position() == 2

    def test_read_stream_returns_events_with_metadata(self, store: Any) -> None:
        first, second = new("Opened", who="bob"), new("Closed")
        store.append("order-1", 0, [first, second])
        store.append("order-2", 0, [new()])
        events = store.read_stream("order-1")
        assert [(e.version, e.type, e.event_id) for e in events] == [
            (1, "Opened", first.event_id),
            (2, "Closed", second.event_id),
        ]
        assert events[0].data == {"who": "bob"}
        assert events[0].metadata == META
        assert events[0].category == "order"
        assert [e.version for e in store.read_stream("order-1", after_version=1)] == [2]

    def test_stale_expected_version_is_a_conflict(self, store: Any) -> None:
        store.append("order-1", 0, [new()])
        with pytest.raises(ConcurrencyConflict) as raised:
            store.append("order-1", 0, [new()])
        assert (raised.value.expected, raised.value.actual) == (0, 1)
        with pytest.raises(ConcurrencyConflict):
            store.append("order-1", 5, [new()])
        assert store.stream_version("order-1") == 1

    def test_any_version_appends_without_check(self, store: Any) -> None:
        store.append("log-1", ANY_VERSION, [new()])
        result = store.append("log-1", ANY_VERSION, [new(), new()])
        assert result.version == 3

    def test_reappending_an_event_id_returns_the_original_position(self, store: Any) -> None:
        event = new()
        store.append("a-1", 0, [new()])
        original = store.append("b-1", 0, [event])
        # A retry after a lost acknowledgement carries the old expected version.
        again = store.append("b-1", 0, [event])
        assert again.positions == original.positions == (2,)
        assert again.duplicate is True
        assert store.head_position() == 2
        assert len(store.read_stream("b-1")) == 1

    def test_a_batch_mixing_stored_and_new_ids_is_refused(self, store: Any) -> None:
        event = new()
        store.append("a-1", 0, [event])
        with pytest.raises(DuplicateEventMismatch):
            store.append("a-1", 1, [event, new()])
        with pytest.raises(DuplicateEventMismatch):
            store.append("other-1", 0, [event])
        assert store.head_position() == 1

    def test_empty_batch_is_refused(self, store: Any) -> None:
        with pytest.raises(ValueError):
            store.append("a-1", 0, [])

    def test_read_all_pages_in_position_order(self, store: Any) -> None:
        for i in range(5):
            store.append(f"s-{i}", 0, [new(i=i)])
        assert [e.data["i"] for e in store.read_all(0, limit=3)] == [0, 1, 2]
        assert [e.position for e in store.read_all(3)] == [4, 5]
        assert store.read_all(5) == []

    def test_two_writers_of_a_thousand_events_each(self, store: Any) -> None:
        def writer(w: int) -> None:
            for i in range(1000):
                store.append(f"writer{w}-{i}", 0, [new(writer=w, seq=i)])

        run_released_together(2, writer)
        events = store.read_all(0, limit=5000)
        assert [e.position for e in events] == list(range(1, 2001))
        for w in (0, 1):
            mine = [e.data["seq"] for e in events if e.data["writer"] == w]
            assert mine == list(range(1000))

    @pytest.mark.parametrize("size", [1, 40], ids=["single", "large"])
    @pytest.mark.parametrize("writers", [2, 4, 16])
    def test_of_n_appends_at_one_version_exactly_one_wins(
        self, store: Any, writers: int, size: int
    ) -> None:
        store.append("other-1", 0, [new()])
        store.append("contended-1", 0, [new()])
        outcomes = run_released_together(
            writers,
            lambda i: store.append("contended-1", 1, [new(writer=i, k=k) for k in range(size)]),
        )
        winners = [o for o in outcomes if not isinstance(o, Exception)]
        losers = [o for o in outcomes if isinstance(o, Exception)]
        assert len(winners) == 1
        assert all(isinstance(o, ConcurrencyConflict) for o in losers)
        assert {o.stream for o in losers} <= {"contended-1"}
        assert store.stream_version("contended-1") == 1 + size
        assert [e.position for e in store.read_all(0, limit=100)] == list(range(1, 3 + size))

    # Batches of STAGE_THRESHOLD (32) events or more take the Postgres
    # adapter's COPY path: rows encoded as COPY text, numbered under the lock.

    def test_large_batches_are_numbered_gap_free_in_order(self, store: Any) -> None:
        store.append("small-1", 0, [new(i=-1)])
        big = store.append("big-1", 0, [new(i=i) for i in range(100)])
        assert (big.version, big.positions) == (100, tuple(range(2, 102)))
        more = store.append("big-1", 100, [new(i=100 + i) for i in range(40)])
        assert (more.version, more.positions) == (140, tuple(range(102, 142)))
        events = store.read_stream("big-1")
        assert [e.data["i"] for e in events] == list(range(140))
        assert [e.version for e in events] == list(range(1, 141))
        assert events[0].metadata == META

    def test_large_batches_keep_every_character(self, store: Any) -> None:
        tricky = [
            "back\\slash",
            "tab\there",
            "new\nline",
            "cr\rhere",
            '"quoted"',
            "ünï\u2028ç😀",
            "\\.",
        ]
        batch = [new(i=i, text=tricky[i % len(tricky)], nested={"k\t": ["\\n"]}) for i in range(40)]
        store.append("chars\\1", 0, batch)
        events = store.read_stream("chars\\1")
        assert [e.data for e in events] == [e.data for e in batch]
        assert [e.event_id for e in events] == [e.event_id for e in batch]

    def test_a_large_batch_at_a_stale_version_is_a_conflict(self, store: Any) -> None:
        store.append("big-1", 0, [new() for _ in range(50)])
        with pytest.raises(ConcurrencyConflict) as raised:
            store.append("big-1", 10, [new() for _ in range(50)])
        assert (raised.value.expected, raised.value.actual) == (10, 50)
        assert store.head_position() == 50
        result = store.append("log-1", ANY_VERSION, [new() for _ in range(40)])
        assert (result.version, result.positions[0]) == (40, 51)

    def test_reappending_a_large_batch_returns_the_original_positions(self, store: Any) -> None:
        batch = [new(i=i) for i in range(64)]
        original = store.append("big-1", 0, batch)
        again = store.append("big-1", 0, batch)
        assert again.duplicate is True and again.positions == original.positions
        assert store.head_position() == 64

    def test_large_batches_from_concurrent_writers_stay_gap_free(self, store: Any) -> None:
        def writer(w: int) -> None:
            for i in range(10):
                store.append(f"w{w}-{i}", 0, [new(w=w, i=i, k=k) for k in range(40)])

        run_released_together(4, writer)
        events = store.read_all(0, limit=5000)
        assert [e.position for e in events] == list(range(1, 1601))
        for w in range(4):
            mine = [(e.data["i"], e.data["k"]) for e in events if e.data["w"] == w]
            assert mine == [(i, k) for i in range(10) for k in range(40)]
