"""``quartermaster scheduler``: the outbox relay and the admission leader loop.

Every scheduler process relays the outbox (relays share rows with SKIP
LOCKED); one at a time leads the admission cycle. The leader runs a cycle when
woken (Redis pub/sub ``qm:admission:wake:<broker db>``, given by the relay for
``admission.wake`` rows) and at least every ``QM_CYCLE_INTERVAL`` seconds, so a
lost hint costs at most one interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from psycopg.types.json import Jsonb
from sqlalchemy import Engine, text

from service.app.admission import AdmissionCycle, CycleReport
from service.app.uow import SqlUnitOfWork
from service.engine import CycleResult, EngineConfig, LocalQueueUsage
from service.eventstore.port import ConcurrencyConflict
from service.ledger.publisher import CheckpointPublisher
from workers.fleet import FleetLoop
from workers.leader import Deposed, LeaderLease
from workers.metrics import SchedulerMetrics
from workers.outbox import Relay, Send, pending_count
from workers.records import WAKE_TOPIC
from workers.settings import WorkerSettings
from workers.statistics import StatisticsKeeper
from workers.tasks import wake_channel

log = logging.getLogger(__name__)

#: How often a waiting scheduler looks at its stop flag.
_SLICE = 0.25

_LOAD_USAGE = text("SELECT local_queue, consumed, last_update FROM admission_usage")
_SAVE_USAGE = (
    "INSERT INTO admission_usage (local_queue, consumed, last_update) "
    "VALUES (%(lq)s, %(consumed)s, %(at)s) ON CONFLICT (local_queue) DO UPDATE "
    "SET consumed = EXCLUDED.consumed, last_update = EXCLUDED.last_update"
)


class Waker:
    """Wake-up hints from Redis; silence (or Redis down) is just a timeout."""

    def __init__(self, url: str, channel: str | None = None) -> None:
        self._url = url
        self._channel = channel or wake_channel(url)
        #: How the subscription shows in Redis's CLIENT LIST.
        self.name = f"qm-wake:{socket.gethostname()}:{os.getpid()}"
        self._client: redis.Redis | None = None
        self._pubsub: Any = None

    def listen(self) -> None:
        """Subscribe now, before the first cycle: a hint sent before the
        subscription would be lost (the first cycle covers what came before)."""
        try:
            self._subscribe()
        except (redis.RedisError, OSError):
            self.close()  # wait() tries again

    def _subscribe(self) -> None:
        if self._pubsub is None:
            # The client is kept as long as its subscription: a client made
            # by ``from_url`` closes its whole connection pool when it is
            # collected, the subscription's connection included, and the
            # hints published until a read happened to reconnect were lost.
            self._client = redis.Redis.from_url(self._url, client_name=self.name)
            pubsub: Any = self._client.pubsub
            self._pubsub = pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(self._channel)

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Until a hint arrives (then drain the burst: one cycle for all of
        it), ``timeout`` passes or ``stop`` is set."""
        deadline = time.monotonic() + timeout
        try:
            self._subscribe()
            woken = False
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                message = self._pubsub.get_message(timeout=0 if woken else min(left, _SLICE))
                if message is not None:
                    woken = True
                elif woken:
                    return True
            return woken
        except (redis.RedisError, OSError):
            self.close()
            stop.wait(max(0.0, deadline - time.monotonic()))
            return False

    def close(self) -> None:
        pubsub, client = self._pubsub, self._client
        self._pubsub = self._client = None
        with contextlib.suppress(redis.RedisError, OSError):
            if pubsub is not None:
                pubsub.close()
            if client is not None:
                client.close()


class WakeHint:
    """How the relay wakes the admission leader, wherever it runs: the pub/sub
    message the ``admission.wake`` consumer would send. Redis unreachable
    raises, so that the relay leaves the rows for its next pass."""

    def __init__(self, url: str, channel: str | None = None) -> None:
        self._channel = channel or wake_channel(url)
        self._url = url
        self._client: redis.Redis | None = None

    def __call__(self) -> None:
        if self._client is None:
            self._client = redis.Redis.from_url(self._url)
        try:
            self._client.publish(self._channel, "relay")
        except (redis.RedisError, OSError):
            self._client = None
            raise


class AdmissionLeader:
    """Runs cycles while it holds the lease; fences every commit."""

    def __init__(
        self,
        engine: Engine,
        settings: WorkerSettings,
        config: EngineConfig | None = None,
        holder: str | None = None,
    ) -> None:
        self.lease = LeaderLease(engine, "admission", holder)
        self.cycle = AdmissionCycle(
            engine, lambda: SqlUnitOfWork(engine), config or settings.engine_config()
        )
        self._engine = engine
        self._settings = settings
        self._usage: dict[str, LocalQueueUsage] = {}
        self._saved_at = 0.0

    def step(self) -> CycleReport | None:
        """One cycle if leading (acquiring the lease first if free)."""
        if not self.lease.leading:
            if self.lease.try_acquire() is None:
                return None
            self._usage = self._load_usage()
            # Another leader may have preempted since: the budgets come from the ledger.
            self.cycle.budgets = None
        elif not self.lease.check():
            return None
        try:
            report = self.cycle.run(self._guard, self._usage, self._save_usage)
        except Deposed:
            log.warning("deposed: another scheduler leads admission now")
            self.lease.release()
            return None
        self._usage = dict(report.result.local_queue_usage)
        return report

    def _guard(self, uow: SqlUnitOfWork) -> None:
        self.lease.fence(uow.connection)

    def _load_usage(self) -> dict[str, LocalQueueUsage]:
        with self._engine.connect() as conn:
            return {
                lq: LocalQueueUsage(consumed=dict(consumed), last_update=float(at))
                for lq, consumed, at in conn.execute(_LOAD_USAGE)
            }

    def _save_usage(self, uow: SqlUnitOfWork, result: CycleResult) -> None:
        """Persist the fair-sharing history once per sampling interval (the
        leader keeps it in memory in between; a successor resumes from here)."""
        interval = self.cycle.config.admission_fair_sharing.usage_sampling_interval_seconds
        now = time.monotonic()
        if now - self._saved_at < interval:
            return
        self._saved_at = now
        uow.events.defer(
            _SAVE_USAGE,
            [
                {"lq": lq, "consumed": Jsonb(dict(u.consumed)), "at": u.last_update}
                for lq, u in sorted(result.local_queue_usage.items())
            ],
        )


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        settings: WorkerSettings,
        send: Send,
        *,
        config: EngineConfig | None = None,
        holder: str | None = None,
        relay: bool = True,
        fleet: bool = True,
    ) -> None:
        self.leader = AdmissionLeader(engine, settings, config, holder)
        self.relay = (
            Relay(
                engine,
                send,
                poll_interval=settings.relay_poll_interval,
                hints={WAKE_TOPIC: WakeHint(settings.broker_url)},
            )
            if relay
            else None
        )
        self.waker = Waker(settings.broker_url)
        # The periodic resync of member clusters, run by the admission leader
        # only (one writer of heartbeats and requeues at a time, by design;
        # a second would only fail its expected versions).
        self.metrics = SchedulerMetrics()
        self.fleet = (
            FleetLoop(engine, settings, on_sync=self.metrics.observe_sync) if fleet else None
        )
        # Periodic ledger checkpoints, signed by the admission leader only.
        self.checkpoints = CheckpointPublisher(
            engine, settings.ledger_signing_key, settings.ledger_checkpoint_interval
        )
        # Planner statistics of fast-growing tables, kept by the leader only.
        self.statistics = StatisticsKeeper(engine)
        self._interval = settings.cycle_interval
        self._spacing = settings.cycle_spacing
        self.stop = threading.Event()
        self.cycles = 0
        self.last: CycleReport | None = None
        self._engine = engine

    def run(self) -> None:
        self.waker.listen()
        relay_thread = None
        if self.relay is not None:
            relay_thread = threading.Thread(target=self.relay.run, name="outbox-relay", daemon=True)
            relay_thread.start()
        fleet_thread = None
        if self.fleet is not None:
            fleet_thread = self._while_leading(self.fleet.run, "fleet")
        checkpoint_thread = self._while_leading(self.checkpoints.run, "ledger-checkpoints")
        statistics_thread = self._while_leading(self.statistics.run, "planner-statistics")
        try:
            while not self.stop.is_set():
                self._tick()
        finally:
            self.checkpoints.halt()
            self.statistics.stop.set()
            if self.relay is not None:
                self.relay.stop.set()
            if self.fleet is not None:
                self.fleet.halt()
            if relay_thread is not None:
                relay_thread.join(5)
            if fleet_thread is not None:
                fleet_thread.join(10)
            checkpoint_thread.join(10)
            statistics_thread.join(10)
            self.leader.lease.release()
            self.waker.close()

    def _while_leading(
        self, run: Callable[[Callable[[], bool]], None], name: str
    ) -> threading.Thread:
        """A daemon thread of ``run(active)``, active while this process leads."""
        thread = threading.Thread(
            target=run, args=(lambda: self.leader.lease.leading,), name=name, daemon=True
        )
        thread.start()
        return thread

    def _tick(self) -> None:
        began = time.monotonic()
        try:
            self.metrics.outbox_depth.set(pending_count(self._engine))
            report = self.leader.step()
        except ConcurrencyConflict:
            log.info("a workload changed under the cycle; running again")
            return
        except Exception:
            log.exception("admission cycle failed")
            self.stop.wait(self._interval)
            return
        self.metrics.leading(self.leader.lease.leading)
        if report is None:
            self.stop.wait(self._interval)
            return
        self.cycles += 1
        self.last = report
        self.metrics.observe(report)
        if report.writes.admitted or report.writes.preempted or report.writes.evicted:
            log.info(
                "cycle: %d admitted, %d preempted, %d evicted, %d pending, %.3fs",
                report.writes.admitted,
                report.writes.preempted,
                report.writes.evicted,
                len(report.result.pending),
                report.seconds,
            )
        # Spaced: a cycle reads, decides and checks every live workload (its
        # cost grows with the gangs held, not with those it admits), so one
        # per wake-up (every relayed batch of submissions) cost the scheduler
        # most of its CPU under steady submissions. The next begins at least
        # ``cycle_spacing`` after this one began, and after a pause as long
        # as this one took (cycles hold the scheduler's CPU half the time at
        # most, sync and the relay the rest). Hints that come meanwhile wait
        # in the subscription: one cycle for all of them.
        ended = time.monotonic()
        self.stop.wait(max(0.0, began + self._spacing - ended, ended - began))
        self.waker.wait(self._interval, self.stop)
