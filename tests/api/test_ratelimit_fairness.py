"""A tenant far over its rate limit costs the others nothing it could avoid
(issue 18, finding 9): it stays on its own bucket, never on the one its
client address shares with others, and its refusals cost Redis a round
trip per token, not per request. Real Postgres and Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from service.api.ratelimit import RedisBuckets, RefusedAccessLines
from service.app.auth import TokenService
from service.runtime.embedded import embedded_redis
from tests.api.conftest import ADMIN_TOKEN, serve, setup_quota


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


def test_one_late_answer_from_redis_keeps_the_limit_shared(
    own_redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop running late on a busy machine times out a call Redis would
    have answered: that request is limited here, and the next ones by Redis
    again, not by a fresh bucket of this process's for seconds."""
    pause_ms = 2000

    async def run() -> tuple[list[bool], list[bool]]:
        buckets = RedisBuckets(own_redis, 0.01, 2, timeout=0.1)
        first = [(await buckets.take("k"))[0] for _ in range(2)]
        redis.Redis.from_url(own_redis).client_pause(pause_ms)
        await buckets.take("k")  # later than its timeout: limited here
        await asyncio.sleep(pause_ms / 1000 + 0.1)
        return first, [(await buckets.take("k"))[0] for _ in range(2)]

    with caplog.at_level(logging.WARNING, "service.api.ratelimit"):
        first, after = asyncio.run(run())
    assert first == [True, True]
    assert after == [False, False]
    assert not [r for r in caplog.records if r.name == "service.api.ratelimit"]


def test_a_tenant_over_its_limit_never_spends_its_address_bucket(
    database_url: str, redis_url: str
) -> None:
    """Each time the authenticator's cache of a token ends (every second), a
    flooding tenant's requests used to fall back to its client address's
    bucket until one was looked up again; once that bucket was spent, every
    other client behind the address was refused its first request."""
    redis.Redis.from_url(redis_url).flushdb()
    limits: dict[str, Any] = {
        "rate_limit_per_second": 2,
        "rate_limit_burst": 8,  # the set-up's five requests among them
        "rate_limit_anonymous_per_second": 0.01,
        "rate_limit_anonymous_burst": 4,
        "rate_limit_redis_url": redis_url,
    }
    with serve(database_url, **limits) as (url, _):
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
        ) as admin:
            setup_quota(admin, namespace="noisy", cq="cq-noisy")
            tokens = [
                admin.post(
                    "/v1/tokens",
                    json={"name": name, "role": "submitter", "namespaces": [name]},
                ).json()["token"]
                for name in ("noisy", "quiet")
            ]
        noisy, quiet = (
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {t}"}, timeout=60)
            for t in tokens
        )
        with noisy, quiet:
            path = "/v1/namespaces/noisy/workloads"
            statuses, details = [], set()
            until = time.monotonic() + 4 * TokenService.CACHE_SECONDS + 0.5
            while time.monotonic() < until:
                answer = noisy.get(path)
                statuses.append(answer.status_code)
                if answer.status_code == 429:
                    details.add(answer.json()["detail"].split(" is limited")[0])
            first_of_another = quiet.get("/v1/namespaces/quiet/workloads")
    assert first_of_another.status_code == 200, first_of_another.text
    assert details == {"this principal"}
    assert set(statuses) == {200, 429}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_refusals_access_lines_are_summed_not_written_each() -> None:
    """A flood of 429s writes its first access line and then one count per
    ``SECONDS``, not a line each; other answers' lines are all written."""
    now = [0.0]
    access = logging.getLogger("tests.ratelimit.access")
    access.propagate = False
    access.setLevel(logging.INFO)
    lines, said = _Lines(), _Lines()
    access.addHandler(lines)
    logging.getLogger("service.api.ratelimit").addHandler(said)
    access.addFilter(RefusedAccessLines(clock=lambda: now[0]))
    try:
        for step in range(300):  # 30 s of a refusal each 0.1 s, and a 200 each 1 s
            now[0] = step / 10
            access.info('%s - "%s %s HTTP/%s" %d', "10.0.0.1:1", "GET", "/v1/x", "1.1", 429)
            if step % 10 == 0:
                access.info('%s - "%s %s HTTP/%s" %d', "10.0.0.2:1", "GET", "/v1/y", "1.1", 200)
    finally:
        logging.getLogger("service.api.ratelimit").removeHandler(said)
        access.removeHandler(lines)
        access.filters.clear()
    refused = [line for line in lines.lines if line.endswith(" 429")]
    assert len(refused) == 3, refused  # at 0, 10 and 20 s
    assert len(lines.lines) - len(refused) == 30
    summary = "rate limits: 99 more requests refused (429) in 10 s; their access lines are left out"
    assert said.lines == [summary] * 2
