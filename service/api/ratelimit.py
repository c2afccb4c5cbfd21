"""Rate limits shared by every API process, and load shed early (issue 18,
finding 9).

Buckets are keyed on who is asking: the authenticated principal when its
token is known without I/O (``KnownCredentials``: every request after its
first), else the client's address, so that made-up tokens and spellings of
the scheme share one bucket. They live in Redis: a token bucket, refilled
from Redis's own clock so that API processes' clocks need not agree, one
script call (one round trip) per request that may be allowed. A refusal
says when the bucket will next hold a token; until then this process
refuses that key without asking Redis, so that a tenant far over its limit
costs a round trip per token, not per request. When Redis cannot be
reached (or answers too late ``LATE_ANSWERS`` times in a row), each process
falls back to its own buckets (the limit is then per process) and says so
once; it tries Redis again every ``RETRY_SECONDS``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Buckets(Protocol):
    rate: float
    burst: int

    async def take(self, key: str) -> tuple[bool, float, float]:
        """(allowed, tokens left, seconds until one more token)."""
        ...


@dataclass
class _Bucket:
    tokens: float
    updated: float


class LocalBuckets:
    """A token bucket per key in this process: ``rate`` per second,
    ``burst`` at most."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take_now(self, key: str) -> tuple[bool, float, float]:
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) > 100_000:
                    self._buckets.clear()
                bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return True, bucket.tokens, 0.0
            return False, bucket.tokens, (1 - bucket.tokens) / self.rate

    async def take(self, key: str) -> tuple[bool, float, float]:
        return self.take_now(key)


# KEYS[1]: the bucket; ARGV: rate per second, burst. A hash of tokens and
# the time they were counted, expiring once it would be full again.
_TOKEN_BUCKET = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local held = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(held[1]) or burst
local at = tonumber(held[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 't', tokens, 'at', now)
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {allowed, tostring(tokens)}
"""


class RedisBuckets:
    """Token buckets in Redis, shared by every API process; this process's
    own (``LocalBuckets``) while Redis cannot be reached."""

    RETRY_SECONDS = 5.0
    PREFIX = "qm:ratelimit:"
    #: Answers later than the timeout in a row before this process limits
    #: alone. One late answer is most often this process's own event loop
    #: running late on a busy machine, not Redis: that request is limited
    #: here, the next asks Redis again.
    LATE_ANSWERS = 3

    def __init__(self, url: str, rate: float, burst: int, timeout: float = 0.25) -> None:
        import redis.asyncio as redis
        from redis.exceptions import TimeoutError as Late

        self._late_error = Late
        self._late = 0
        self.rate = rate
        self.burst = burst
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, **_no_client_setinfo()
        )
        self._script = self._client.register_script(_TOKEN_BUCKET)
        self._local = LocalBuckets(rate, burst)
        self._retry_at = 0.0
        self._falling_back = False
        self._refusing = Refusals()

    async def take(self, key: str) -> tuple[bool, float, float]:
        if self._falling_back and time.monotonic() < self._retry_at:
            return self._local.take_now(key)
        asked = time.monotonic()
        wait = self._refusing.wait(key, asked)
        if wait > 0:
            return False, 0.0, wait
        try:
            allowed, left = await self._script(
                keys=[self.PREFIX + key], args=[self.rate, self.burst]
            )
        except Exception as error:  # any failure of Redis's: limit here instead
            if isinstance(error, self._late_error) and self._late + 1 < self.LATE_ANSWERS:
                self._late += 1
                return self._local.take_now(key)
            self._late = 0
            self._retry_at = time.monotonic() + self.RETRY_SECONDS
            if not self._falling_back:
                self._falling_back = True
                log.warning(
                    "rate limits: Redis unreachable (%s: %s); limiting per API process "
                    "until it answers",
                    type(error).__name__,
                    error,
                )
            return self._local.take_now(key)
        self._late = 0
        if self._falling_back:
            self._falling_back = False
            log.warning("rate limits: Redis answers again; limits are shared by every process")
        tokens = float(left)
        if allowed:
            return True, tokens, 0.0
        wait = (1 - tokens) / self.rate
        # Redis counted the bucket after ``asked``: it holds no token before
        # ``asked + wait`` whatever the other processes do (they only take).
        self._refusing.until(key, asked + wait)
        return False, tokens, wait


def _no_client_setinfo() -> dict[str, Any]:
    """No CLIENT SETINFO on connecting: for it redis-py reads its own
    package's metadata each time, two thirds of a connection's CPU (2.4 ms
    of it on the bench box), and a timed-out call costs its connection."""
    try:
        import redis.driver_info  # noqa: F401  # redis-py >= 7: the one switch
    except ImportError:
        return {"lib_name": None, "lib_version": None}
    return {"driver_info": None}


class Refusals:
    """Keys refused until a time (monotonic seconds): how long this process
    answers them without asking Redis."""

    MAX_KEYS = 100_000

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def wait(self, key: str, now: float) -> float:
        """Seconds ``key`` is still refused for, or 0."""
        until = self._until.get(key)
        if until is None:
            return 0.0
        if now < until:
            return until - now
        del self._until[key]
        return 0.0

    def until(self, key: str, at: float) -> None:
        if len(self._until) >= self.MAX_KEYS:
            self._until.clear()  # at worst, Redis is asked once more per key
        self._until[key] = at


class KnownCredentials:
    """The principal each bearer credential was last authenticated as, for
    keying its rate limit only, for ``SECONDS``: the authenticator caches a
    token for a second, and without this a token over its limit would fall
    back each second to its client address's bucket (shared with every
    client behind that address) and pass to the routes, looked up again, for
    as long as that takes. A revoked token stays keyed on its former
    principal here, which limits it, never admits it."""

    SECONDS = 600.0
    MAX_CREDENTIALS = 100_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._known: dict[bytes, tuple[str, float]] = {}

    @staticmethod
    def _digest(credential: str) -> bytes:
        return hashlib.sha256(credential.encode()).digest()

    def learn(self, credential: str, principal_key: str) -> None:
        if len(self._known) >= self.MAX_CREDENTIALS:
            self._known.clear()  # at worst, a token's next request is keyed on its address
        self._known[self._digest(credential)] = (principal_key, self._clock() + self.SECONDS)

    def principal_key(self, credential: str) -> str | None:
        known = self._known.get(self._digest(credential))
        if known is None or known[1] <= self._clock():
            return None
        return known[0]


def retry_after(wait: float) -> int:
    return max(1, math.ceil(wait))


class RefusedAccessLines(logging.Filter):
    """Leaves out uvicorn's access line of each refused request (429) but
    the first of every ``SECONDS``, whose line is followed by how many were
    left out since (said when the next refusal comes; the metrics count
    every one at once). A tenant at ten times its limit was otherwise most
    of the log, and writing each line a third of uvicorn's CPU for a
    request (0.13 of 0.33 ms on the bench box)."""

    SECONDS = 10.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._since: float | None = None
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args  # uvicorn's: client, method, path, HTTP version, status
        if not (isinstance(args, tuple) and len(args) == 5 and args[4] == 429):
            return True
        now = self._clock()
        if self._since is not None and now - self._since < self.SECONDS:
            self._left_out += 1
            return False
        if self._since is not None and self._left_out:
            log.warning(
                "rate limits: %d more requests refused (429) in %.0f s; their access lines "
                "are left out",
                self._left_out,
                now - self._since,
            )
        self._since, self._left_out = now, 0
        return True


def summarise_refusals(logger: str = "uvicorn.access") -> None:
    """Put ``RefusedAccessLines`` on ``logger`` (once)."""
    target = logging.getLogger(logger)
    if not any(isinstance(f, RefusedAccessLines) for f in target.filters):
        target.addFilter(RefusedAccessLines())
