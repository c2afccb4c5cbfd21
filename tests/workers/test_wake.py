"""The admission leader's wake-up hints over a real Redis pub/sub."""

from __future__ import annotations

import gc
import threading

import redis

from workers.scheduler import WakeHint, Waker


def _subscribed(client: redis.Redis, waker: Waker) -> int:
    """This waker's subscribed connections (pub/sub channels are server-wide:
    other tests' schedulers may listen on the same channel meanwhile)."""
    return sum(
        1 for c in client.client_list() if c.get("name") == waker.name and int(c.get("sub", 0)) > 0
    )


def test_subscription_outlives_garbage_collection(broker: str) -> None:
    """``listen`` subscribes before the first cycle, and that subscription
    must still be there for the first hint, however long the cycle took: a
    collected client used to close the subscription's connection, and the
    hints published meanwhile reached no one."""
    waker = Waker(broker)
    probe = redis.Redis.from_url(broker)
    try:
        waker.listen()
        gc.collect()
        assert _subscribed(probe, waker) == 1
        WakeHint(broker)()
        assert waker.wait(2.0, threading.Event()) is True
    finally:
        waker.close()
        probe.close()


def test_silence_is_a_timeout_and_a_burst_is_one_wake(broker: str) -> None:
    waker = Waker(broker)
    hint = WakeHint(broker)
    try:
        waker.listen()
        assert waker.wait(0.3, threading.Event()) is False
        for _ in range(5):
            hint()
        assert waker.wait(2.0, threading.Event()) is True
        assert waker.wait(0.3, threading.Event()) is False  # the burst was drained
    finally:
        waker.close()


def test_close_ends_the_subscription(broker: str) -> None:
    waker = Waker(broker)
    probe = redis.Redis.from_url(broker)
    try:
        waker.listen()
        assert _subscribed(probe, waker) == 1
        waker.close()
        assert _subscribed(probe, waker) == 0
    finally:
        probe.close()
