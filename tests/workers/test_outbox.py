"""The outbox relay and its consumers against a real Celery worker process:
a crash anywhere between commit and effect loses nothing and repeats nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa

from service.app.uow import SqlUnitOfWork
from service.eventstore.port import OutboxMessage
from tests.workers.conftest import celery_worker, wait_for
from tests.workers.probe import TOPIC
from workers.consumers import dead_letter_stream
from workers.outbox import Relay, Send, pending_count, relay_once


class Crash(Exception):
    pass


def _publish(engine: sa.Engine, *payloads: dict[str, Any], topic: str = TOPIC) -> list[UUID]:
    ids = [uuid4() for _ in payloads]
    with SqlUnitOfWork(engine) as uow:
        uow.publish([OutboxMessage(i, topic, p) for i, p in zip(ids, payloads, strict=True)])
        uow.commit()
    return ids


def _effects(engine: sa.Engine, message_id: UUID) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM events WHERE stream = :s"),
                {"s": f"probe-{message_id}"},
            ).scalar_one()
        )


def _processed(engine: sa.Engine, message_id: UUID) -> tuple[int, str | None] | None:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT deliveries, outcome FROM processed_messages WHERE message_id = :id"),
            {"id": message_id},
        ).first()
    return (int(row[0]), row[1]) if row else None


def test_a_crash_between_publish_and_mark_repeats_nothing(
    engine: sa.Engine, database_url: str, broker: str, send: Send
) -> None:
    ids = _publish(engine, *({"n": n} for n in range(5)))

    def crash() -> None:
        raise Crash

    with celery_worker(database_url, broker):
        # Sent to the broker, then the relay dies before marking: all five
        # stay unpublished, and go out again with the same ids.
        with pytest.raises(Crash):
            relay_once(engine, send, before_mark=crash)
        assert pending_count(engine) == 5
        assert relay_once(engine, send).sent == 5
        assert pending_count(engine) == 0
        for message_id in ids:
            wait_for(lambda m=message_id: _processed(engine, m) == (2, "done"), 60)
    for message_id in ids:
        assert _effects(engine, message_id) == 1


def test_worker_killed_before_its_commit_does_the_effect_once(
    engine: sa.Engine, database_url: str, broker: str, send: Send, tmp_path: Path
) -> None:
    marker = tmp_path / "pid"
    (message_id,) = _publish(engine, {"stall_before_commit": str(marker)})
    with celery_worker(database_url, broker):
        relay_once(engine, send)
        pid = int(wait_for(lambda: marker.exists() and marker.read_text(), 60))
        os.kill(pid, signal.SIGKILL)  # the pool process, mid-transaction
        wait_for(lambda: _processed(engine, message_id) == (2, "done"), 60)
    assert _effects(engine, message_id) == 1


def test_worker_killed_after_its_commit_does_not_repeat_the_effect(
    engine: sa.Engine, database_url: str, broker: str, send: Send, tmp_path: Path
) -> None:
    marker = tmp_path / "pid"
    (message_id,) = _publish(engine, {"stall_after_commit": str(marker)})
    with celery_worker(database_url, broker):
        relay_once(engine, send)
        pid = int(wait_for(lambda: marker.exists() and marker.read_text(), 60))
        assert _processed(engine, message_id) == (1, "done")
        os.kill(pid, signal.SIGKILL)  # committed, not yet acknowledged
        # reject_on_worker_lost requeues it; the redelivery finds it processed.
        wait_for(lambda: _processed(engine, message_id) == (2, "done"), 60)
    assert _effects(engine, message_id) == 1


def _dead_letters(engine: sa.Engine, topic: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(r)
            for r in conn.execute(
                sa.text("SELECT data FROM events WHERE stream = :s ORDER BY position"),
                {"s": dead_letter_stream(topic)},
            ).scalars()
        ]


def test_failing_and_unknown_messages_end_as_dead_letters(
    engine: sa.Engine, database_url: str, broker: str, send: Send
) -> None:
    (failing,) = _publish(engine, {"fail": True})
    (unknown,) = _publish(engine, {"x": 1}, topic="test.nobody")
    with celery_worker(database_url, broker):
        relay_once(engine, send)
        wait_for(lambda: _processed(engine, failing) == (3, "dead"), 60)
        wait_for(lambda: _processed(engine, unknown) == (1, "dead"), 60)
    (dead,) = _dead_letters(engine, TOPIC)
    assert dead["message_id"] == str(failing)
    assert dead["deliveries"] == 3
    assert "probe asked to fail" in dead["error"]
    assert _effects(engine, failing) == 0
    (nobody,) = _dead_letters(engine, "test.nobody")
    assert "no consumer" in nobody["error"]


def test_messages_the_broker_lost_are_sent_again(
    engine: sa.Engine, database_url: str, broker: str, send: Send
) -> None:
    (message_id,) = _publish(engine, {"n": 1})
    lost: list[UUID] = []
    relay_once(engine, lambda m, t, p: lost.append(m))  # Redis forgets it
    assert lost == [message_id] and pending_count(engine) == 0
    with celery_worker(database_url, broker):
        assert relay_once(engine, send, republish_after=0.0).republished == 1
        wait_for(lambda: _processed(engine, message_id) == (1, "done"), 60)
        assert relay_once(engine, send, republish_after=0.0).republished == 0
    assert _effects(engine, message_id) == 1


def test_the_relay_hears_a_commit_at_once_not_at_its_next_poll(engine: sa.Engine) -> None:
    sent: list[UUID] = []
    # A poll an hour apart: within the wait's ceiling only a notification
    # can bring the relay's next pass.
    relay = Relay(engine, lambda m, t, p: sent.append(m), poll_interval=3600.0)
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        wait_for(lambda: _listening(engine), 60, "the relay's LISTEN")
        (message_id,) = _publish(engine, {"n": 1})
        wait_for(lambda: sent == [message_id], 60, "the message sent on its commit's NOTIFY")
    finally:
        relay.stop.set()
        thread.join(30)
    assert not thread.is_alive()


def test_the_relay_takes_a_burst_of_commits_in_few_passes_and_sweeps_now_and_then(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit notifies; passes begin ``spacing`` apart and take the
    notifications that came meanwhile, so a burst is a few passes, not one
    each; the sweep for messages the broker lost is not every pass."""
    from workers import outbox

    passes: list[float | None] = []
    real = outbox.relay_once

    def counting(*args: Any, **kwargs: Any) -> Any:
        passes.append(kwargs.get("republish_after"))
        return real(*args, **kwargs)

    monkeypatch.setattr(outbox, "relay_once", counting)
    sent: list[UUID] = []
    relay = Relay(engine, lambda m, t, p: sent.append(m), poll_interval=30.0, spacing=0.2)
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        time.sleep(0.3)  # listening
        ids = [i for n in range(40) for i in _publish(engine, {"n": n})]
        wait_for(lambda: sorted(sent) == sorted(ids), 60)
    finally:
        relay.stop.set()
        thread.join(30)
    assert len(passes) < 20, f"{len(passes)} passes for 40 commits"
    assert passes[0] == 300.0 and all(p is None for p in passes[1:])


def _listening(engine: sa.Engine) -> bool:
    """Whether a session of this database LISTENs on the outbox channel."""
    with engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN qm_outbox%%'"
            ).scalar_one()
        )
