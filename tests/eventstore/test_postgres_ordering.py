"""Postgres-specific guarantees: a tailing reader never skips a late commit,
and the database itself keeps events append-only."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from service.app.uow import SqlUnitOfWork
from service.eventstore import ANY_VERSION, ConcurrencyConflict, OutboxMessage
from service.eventstore.postgres import PostgresEventStore
from tests.eventstore.contract import new

WRITERS, EVENTS_PER_WRITER, ROLLBACK_RATE = 16, 25, 0.10


def test_tailing_reader_sees_exactly_the_committed_events_in_order(engine: sa.Engine) -> None:
    committed: list[uuid.UUID] = []
    committed_lock = threading.Lock()
    rolled_back = 0
    done = threading.Event()

    def writer(w: int) -> None:
        nonlocal rolled_back
        rng = random.Random(w)
        for i in range(EVENTS_PER_WRITER):
            event = new(writer=w, seq=i)
            with SqlUnitOfWork(engine, accept=None) as uow:
                time.sleep(rng.random() * 0.002)
                uow.events.append(f"w{w}-stream", ANY_VERSION, [event])
                # Hold the transaction open a little: commits arrive late and
                # out of the order in which the writers started.
                time.sleep(rng.random() * 0.002)
                if rng.random() < ROLLBACK_RATE:
                    with committed_lock:
                        rolled_back += 1
                    continue  # leaving the block rolls back
                uow.commit()
            with committed_lock:
                committed.append(event.event_id)

    seen: list[tuple[int, uuid.UUID]] = []

    def reader() -> None:
        store, last = PostgresEventStore(engine), 0
        while True:
            finished = done.is_set()  # read the flag *before* the final poll
            batch = store.read_all(last, limit=50)
            seen.extend((e.position, e.event_id) for e in batch)
            if batch:
                last = batch[-1].position
            elif finished:
                return
            else:
                time.sleep(0.0005)

    tail = threading.Thread(target=reader)
    tail.start()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    tail.join(timeout=30)

    positions = [p for p, _ in seen]
    assert rolled_back > 0, "the test must exercise rollbacks"
    assert positions == list(range(1, len(committed) + 1)), "in order, none skipped, none twice"
    assert sorted(i for _, i in seen) == sorted(committed)


def test_events_and_outbox_commit_together_or_not_at_all(engine: sa.Engine) -> None:
    message = OutboxMessage(uuid.uuid4(), "workload.submitted", {"name": "train-1"})
    with SqlUnitOfWork(engine, accept=None) as uow:
        uow.events.append("workload-a", 0, [new()])
        uow.publish([message])
        # no commit: everything is rolled back
    with SqlUnitOfWork(engine, accept=None) as uow:
        uow.events.append("workload-b", 0, [new()])
        uow.publish([message])
        uow.commit()
    with engine.connect() as conn:
        outbox = conn.exec_driver_sql("SELECT message_id, topic FROM outbox").all()
        streams = conn.exec_driver_sql("SELECT stream, position FROM events").all()
    assert outbox == [(message.message_id, "workload.submitted")]
    assert streams == [("workload-b", 1)], "the rolled-back append left no hole either"


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET type = 'Forged'",
        "UPDATE events SET position = position + 1000",
        "UPDATE events SET position = NULL",
        "DELETE FROM events",
        "TRUNCATE events",
        "UPDATE ledger_entries SET kind = 'forged'",
        "DELETE FROM ledger_entries",
        "TRUNCATE ledger_entries",
    ],
)
def test_database_refuses_to_change_history(engine: sa.Engine, statement: str) -> None:
    PostgresEventStore(engine).append("a-1", 0, [new()])
    _one_ledger_entry(engine)
    with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
        conn.exec_driver_sql(statement)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM events").scalar() == 1
        assert conn.exec_driver_sql("SELECT count(*) FROM ledger_entries").scalar() == 1


@pytest.mark.parametrize("table", ["events", "ledger_entries"])
@pytest.mark.parametrize("verb", ["UPDATE", "DELETE"])
def test_app_role_has_no_privilege_to_change_history(
    engine: sa.Engine, table: str, verb: str
) -> None:
    statement = {
        "UPDATE": f"UPDATE {table} SET {_any_column(table)}",
        "DELETE": f"DELETE FROM {table}",
    }
    with pytest.raises(DBAPIError, match="permission denied"), engine.begin() as conn:
        # Triggers off, so only the missing privilege can stop the statement.
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        conn.exec_driver_sql("SET LOCAL ROLE quartermaster_app")
        conn.exec_driver_sql(statement[verb])
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL ROLE quartermaster_app")
        conn.exec_driver_sql(f"SELECT count(*) FROM {table}")  # reading is allowed


def _any_column(table: str) -> str:
    return "type = type" if table == "events" else "kind = kind"


def _one_ledger_entry(engine: sa.Engine) -> None:
    from datetime import UTC, datetime

    from service.ledger import NewLedgerEntry

    with SqlUnitOfWork(engine, accept=None) as uow:
        uow.record([NewLedgerEntry(uuid.uuid4(), "test", {"x": 1}, datetime.now(UTC))])
        uow.commit()


def test_one_unit_of_work_appends_to_many_streams_in_one_staged_commit(
    engine: sa.Engine,
) -> None:
    with SqlUnitOfWork(engine, accept=None) as uow:
        for s in range(50):
            uow.events.append(f"many-{s}", 0, [new(), new()])
        results = uow.commit()
    positions = [p for r in results for p in r.positions]
    assert sorted(positions) == list(range(1, 101))
    assert [r.version for r in results] == [2] * 50
    with SqlUnitOfWork(engine, accept=None) as uow:
        uow.events.append("many-7", 0, [new() for _ in range(40)])  # stale: many-7 is at 2
        with pytest.raises(ConcurrencyConflict):
            uow.commit()
    # The failed commit's connection staged again without trouble.
    with SqlUnitOfWork(engine, accept=None) as uow:
        uow.events.append("many-7", 2, [new() for _ in range(40)])
        assert uow.commit()[0].version == 42


def test_a_rival_that_takes_a_version_after_we_read_it_is_a_conflict_on_its_stream(
    engine: sa.Engine,
) -> None:
    """A staged commit reads the versions before the sequencer lock: a rival
    that writes the same version meanwhile (here held uncommitted, then
    committed) makes the unique key refuse our COPY, and the conflict names
    the stream it happened on, not just the unit's first."""
    rival = engine.connect()
    rival.exec_driver_sql(
        "INSERT INTO events (position, stream, version, event_id, type, data, metadata) "
        "VALUES (1000000, 'raced-b', 1, gen_random_uuid(), 'Rival', '{}', '{}')"
    )
    outcome: list[BaseException | list[object]] = []

    def ours() -> None:
        try:
            with SqlUnitOfWork(engine, accept=None) as uow:
                uow.events.append("calm-a", 0, [new() for _ in range(20)])
                uow.events.append("raced-b", 0, [new() for _ in range(20)])
                outcome.append(list(uow.commit()))
        except BaseException as error:  # handed to the test thread
            outcome.append(error)

    thread = threading.Thread(target=ours)
    thread.start()
    time.sleep(0.5)  # our COPY now waits on the rival's uncommitted key
    assert thread.is_alive()
    rival.commit()
    rival.close()
    thread.join(10)
    [error] = outcome
    assert isinstance(error, ConcurrencyConflict)
    assert (error.stream, error.expected) == ("raced-b", 0)
    store = PostgresEventStore(engine)
    assert store.stream_version("calm-a") == 0
    assert store.head_position() == 0


def test_a_small_unit_appends_to_several_streams_in_one_statement(engine: sa.Engine) -> None:
    """Below the COPY threshold, a unit's appends to several streams go in one
    statement: numbered in the unit's order, each stream's versions checked
    (a stale one named in the conflict)."""
    store = PostgresEventStore(engine)
    store.append("few-b", 0, [new(), new()])
    with SqlUnitOfWork(engine, accept=None) as uow:
        uow.events.append("few-a", 0, [new(i=0), new(i=1)])
        uow.events.append("few-b", 2, [new(i=2)])
        uow.events.append("few-log", ANY_VERSION, [new(i=3), new(i=4), new(i=5)])
        results = uow.commit()
    assert [(r.stream, r.version, r.positions) for r in results] == [
        ("few-a", 2, (3, 4)),
        ("few-b", 3, (5,)),
        ("few-log", 3, (6, 7, 8)),
    ]
    assert [e.data.get("i") for e in store.read_all(2)] == [0, 1, 2, 3, 4, 5]
    with SqlUnitOfWork(engine, accept=None) as uow:
        uow.events.append("few-c", 0, [new()])
        uow.events.append("few-a", 1, [new()])  # stale: few-a is at 2
        with pytest.raises(ConcurrencyConflict) as raised:
            uow.commit()
    assert (raised.value.stream, raised.value.expected, raised.value.actual) == ("few-a", 1, 2)
    assert store.head_position() == 8 and store.stream_version("few-c") == 0
