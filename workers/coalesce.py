"""One reconcile pass per member cluster at a time, fleet-wide.

Passes are asked for often — by every admission cycle that decided something
for a cluster (a ``reconcile.cluster`` message, taken by any Celery worker),
by the fleet loop's resync and by watch events — and a pass costs what runs
on the cluster (list it, read the centre, plan). Two at once on one cluster
do the same work twice and apply the same jobs twice (seen in bench/e2e.py:
two workers dispatching the same jobs side by side).

So a pass runs under a Postgres advisory lock per cluster, held by a session
of its own (so that a worker killed in the middle frees it at once), and a
request that finds the lock held only leaves a note in Redis — one more pass
wanted — which the holder reads before it lets go, and again after (a note
left between its last look and its unlock is not lost). Redis holds only
this hint: lost, it costs at most a resync interval; unreachable, every
request runs its own pass, as before.

A pass that follows another of the same cluster in one run waits until
``spacing`` seconds after the previous one began (``QM_RECONCILE_SPACING``):
under a steady stream of admissions passes otherwise ran back to back, each
for the few gangs admitted during the one before, and every pass lists the
member and reads the centre whole; spaced, one pass carries out the
decisions of several cycles. The notes left meanwhile are taken after the
wait. The first pass of a run never waits: a Celery task that slept before
it was one more task in flight when the broker restarted (kombu then fails
the ack of a task that ends before it reconnects, and the worker exits).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable

import redis
from sqlalchemy import Connection, Engine, text

log = logging.getLogger(__name__)

WANTED = "qm:reconcile:wanted:{cluster}"
#: The advisory lock's class (the two-key form: apart from the leader's one-key locks).
_CLASS = zlib.crc32(b"quartermaster:reconcile") & 0x7FFFFFFF
_TRY = text("SELECT pg_try_advisory_lock(:class, hashtext(:cluster))")
_UNLOCK = text("SELECT pg_advisory_unlock(:class, hashtext(:cluster))")


class Coalescer:
    def __init__(self, engine: Engine, redis_url: str, spacing: float = 0.0) -> None:
        self._engine = engine
        self._url = redis_url
        self._client: redis.Redis | None = None
        self._spacing = spacing
        #: When this process last began a pass of each cluster (monotonic).
        self._began: dict[str, float] = {}

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self._url, socket_timeout=2.0)
        return self._client

    def run(self, cluster: str, one_pass: Callable[[], object], budget: float | None = None) -> int:
        """Ask for a pass of ``cluster``: run it here (and any asked for
        meanwhile) unless another process holds the cluster, which then runs
        it. Returns how many passes ran here.

        ``budget``: begin no further pass this many seconds after the first
        began, and leave the note to the next ask (or the fleet loop's next
        resync). Under steady admissions notes never stop coming: unbounded,
        one Celery task ran for as long as the load lasted (and a broker
        restart found it running), and the fleet loop held one cluster while
        the others went unsynced."""
        key = WANTED.format(cluster=cluster)
        try:
            self._redis().incr(key)
        except (redis.RedisError, OSError):
            self._client = None
            log.warning("no Redis to coalesce passes of %s: running one", cluster)
            one_pass()
            return 1
        ran = 0
        params = {"class": _CLASS, "cluster": cluster}
        options = {"isolation_level": "AUTOCOMMIT"}
        until = None if budget is None else time.monotonic() + budget

        def more() -> bool:
            return not ran or until is None or time.monotonic() < until

        with self._engine.connect().execution_options(**options) as conn:
            while more() and conn.execute(_TRY, params).scalar_one():
                try:
                    while (
                        more()
                        and (not ran or self._space(cluster))
                        and ((wanted := self._take(key)) or (wanted is None and not ran))
                    ):
                        ran += 1
                        self._began[cluster] = time.monotonic()
                        one_pass()
                        if wanted is None:  # Redis went away: this pass is the last
                            break
                finally:
                    _unlock(conn, params)
                if not self._wanted(key):
                    break
        return ran

    def _space(self, cluster: str) -> bool:
        """Wait (holding the cluster) until ``spacing`` after this process's
        last pass of it began; always true, for the loop's condition."""
        began = self._began.get(cluster)
        if began is not None and self._spacing > 0:
            time.sleep(max(0.0, began + self._spacing - time.monotonic()))
        return True

    def _take(self, key: str) -> bool | None:
        """Whether a pass is wanted (the note consumed); ``None``: cannot tell."""
        try:
            return bool(self._redis().getdel(key))
        except (redis.RedisError, OSError):
            self._client = None
            return None

    def _wanted(self, key: str) -> bool:
        try:
            return bool(self._redis().exists(key))
        except (redis.RedisError, OSError):
            self._client = None
            return False


def _unlock(conn: Connection, params: dict[str, object]) -> None:
    try:
        conn.execute(_UNLOCK, params)
    except Exception:
        # The session is gone, and with it the lock.
        log.warning("could not release the reconcile lock", exc_info=True)
        conn.invalidate()


__all__ = ["WANTED", "Coalescer"]
