"""The admission leader's wake-up hints over a real Redis pub/sub."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from uuid import uuid4

import pytest
import redis

from workers.scheduler import WakeHint, Waker


@pytest.fixture
def channel() -> Iterator[str]:
    """A channel of this test's own: pub/sub channels are server-wide, and
    other tests' schedulers publish and listen on the real one meanwhile."""
    yield f"qm:test:wake:{uuid4()}"


def _subscribed(client: redis.Redis, waker: Waker) -> int:
    """This waker's subscribed connections."""
    return sum(
        1 for c in client.client_list() if c.get("name") == waker.name and int(c.get("sub", 0)) > 0
    )


def test_subscription_outlives_garbage_collection(broker: str, channel: str) -> None:
    """``listen`` subscribes before the first cycle, and that subscription
    must still be there for the first hint, however long the cycle took: a
    collected client used to close the subscription's connection, and the
    hints published meanwhile reached no one."""
    waker = Waker(broker, channel)
    probe = redis.Redis.from_url(broker)
    try:
        waker.listen()
        gc.collect()
        assert _subscribed(probe, waker) == 1
        WakeHint(broker, channel)()
        assert waker.wait(2.0, threading.Event()) is True
    finally:
        waker.close()
        probe.close()


def test_silence_is_a_timeout_and_a_burst_is_one_wake(broker: str, channel: str) -> None:
    waker = Waker(broker, channel)
    hint = WakeHint(broker, channel)
    try:
        waker.listen()
        assert waker.wait(0.3, threading.Event()) is False
        for _ in range(5):
            hint()
        assert waker.wait(2.0, threading.Event()) is True
        assert waker.wait(0.3, threading.Event()) is False  # the burst was drained
    finally:
        waker.close()


def test_close_ends_the_subscription(broker: str, channel: str) -> None:
    waker = Waker(broker, channel)
    probe = redis.Redis.from_url(broker)
    try:
        waker.listen()
        assert _subscribed(probe, waker) == 1
        waker.close()
        assert _subscribed(probe, waker) == 0
    finally:
        probe.close()


def test_a_leader_hears_only_its_own_broker_database(broker: str) -> None:
    """Pub/sub channels are server-wide: the default channel names the
    broker's database, so a deployment (or a test process) on another
    database of the same Redis server does not wake this one's leader."""
    base, _, db = broker.rpartition("/")
    neighbour = f"{base}/{int(db) % 15 + 1}"  # another of the server's databases 1..15
    waker = Waker(broker)
    try:
        waker.listen()
        WakeHint(neighbour)()
        assert waker.wait(0.5, threading.Event()) is False
        WakeHint(broker)()
        assert waker.wait(5.0, threading.Event()) is True
    finally:
        waker.close()
