"""A tenant far over its rate limit costs the others nothing it could avoid
(issue 18, finding 9): it stays on its own bucket, never on the one its
client address shares with others, and its refusals cost Redis a round
trip per token, not per request. Real Postgres and Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from service.api.ratelimit import RedisBuckets
from service.runtime.embedded import embedded_redis


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis server of this test's own: its command counts are ours alone."""
    with embedded_redis(tmp_path / "redis") as url:
        yield url


def _script_calls(url: str) -> int:
    stats = redis.Redis.from_url(url).info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha")
    )


def test_a_refused_key_is_answered_here_until_its_bucket_can_hold_a_token(own_redis: str) -> None:
    rate, burst, asks = 2.0, 2, 300

    async def flood() -> tuple[list[tuple[bool, float, float]], float]:
        buckets = RedisBuckets(own_redis, rate, burst)
        start = time.monotonic()
        answers = [await buckets.take("principal:noisy") for _ in range(asks)]
        elapsed = time.monotonic() - start
        # The last refusal's wait is no longer than the shared bucket's:
        # once it has passed, a token is there.
        last_wait = next(wait for allowed, _, wait in reversed(answers) if not allowed)
        await asyncio.sleep(last_wait + 0.01)
        answers.append(await buckets.take("principal:noisy"))
        return answers, elapsed

    before = _script_calls(own_redis)
    answers, elapsed = asyncio.run(flood())
    calls = _script_calls(own_redis) - before
    allowed = sum(a for a, _, _ in answers[:-1])
    tokens = burst + rate * elapsed
    assert allowed <= tokens + 1, (allowed, elapsed)
    assert all(wait > 0 for a, _, wait in answers if not a)
    # A round trip per token granted, and one per refill to learn it is
    # spent again: not one per refused request.
    assert calls <= 2 * tokens + 3 < asks, (calls, elapsed)
    assert answers[-1][0], answers[-1]


def test_refusals_answered_here_are_still_shared_by_every_process(own_redis: str) -> None:
    async def both() -> list[bool]:
        first, second = RedisBuckets(own_redis, 0.01, 3), RedisBuckets(own_redis, 0.01, 3)
        seen = []
        for _ in range(4):
            seen += [(await first.take("k"))[0], (await second.take("k"))[0]]
        return seen

    assert sum(asyncio.run(both())) == 3
