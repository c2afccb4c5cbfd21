"""The fleet loop: every member cluster synced, then reconciled, each pass
in its own unit of work, and deleted clusters collected (workers/collect.py);
and the connector that turns a Cluster row into a rate-limited client.

The scheduler runs the loop while it leads (the periodic resync, which
catches whatever a lost outbox hint or a failed pass left); the
``reconcile.cluster`` consumer (workers/tasks.py) reconciles one cluster as
soon as an admission cycle commits decisions for it.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Engine

from service.app.crypto import SecretBox
from service.app.uow import SqlUnitOfWork
from service.eventstore.port import ConcurrencyConflict
from workers.clusters import Member, MemberError, configuration
from workers.coalesce import Coalescer
from workers.collect import CollectPolicy, CollectReport, collect, due, waiting
from workers.fence import FencePolicy
from workers.reconcile import Report, reconcile
from workers.records import ClusterRow, clusters
from workers.settings import WorkerSettings
from workers.sync import SyncReport, sync
from workers.watch import ClusterWatch, watched

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class Connector:
    """One Member per cluster, rebuilt when its spec or credentials change."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._settings = settings
        self._box = SecretBox(settings.secret_key, settings.secret_key_previous)
        self._members: dict[str, tuple[str, Member]] = {}
        self._lock = threading.Lock()

    def __call__(self, row: ClusterRow) -> Member:
        stamp = json.dumps([row.uid, row.spec, (row.secret or b"").hex()], sort_keys=True)
        with self._lock:
            cached = self._members.get(row.name)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            try:
                secret = json.loads(self._box.open(row.secret)) if row.secret else None
                config = configuration(row.spec, secret)
            except Exception as error:
                # The type only, and no chained cause: a decryption, JSON or
                # kubeconfig error can quote the credentials, in a message or
                # in a traceback's locals.
                raise MemberError(
                    f"{row.name}: credentials unusable ({type(error).__name__})"
                ) from None
            s = self._settings
            member = Member(
                row.name,
                config,
                qps=s.member_qps,
                burst=s.member_burst,
                timeout=(s.member_connect_timeout, s.member_read_timeout),
            )
            if cached is not None:
                cached[1].close()
            self._members[row.name] = (stamp, member)
            return member

    def forget(self, name: str) -> None:
        """Close and drop ``name``'s client (a deleted cluster, collected)."""
        with self._lock:
            cached = self._members.pop(name, None)
        if cached is not None:
            cached[1].close()

    def close(self) -> None:
        with self._lock:
            for _, member in self._members.values():
                member.close()
            self._members.clear()


def reconcile_once(
    engine: Engine,
    cluster: str,
    connect: Connector,
    settings: WorkerSettings,
    clock: Clock,
    strays: bool = True,
) -> Report:
    with SqlUnitOfWork(engine) as uow:
        report = reconcile(
            engine,
            uow,
            cluster,
            connect,
            delete_wait=settings.delete_wait,
            clock=clock,
            strays=strays,
        )
        uow.commit()
    return report


def sync_once(
    engine: Engine, cluster: str, connect: Connector, settings: WorkerSettings, clock: Clock
) -> SyncReport:
    return sync(
        engine,
        lambda: SqlUnitOfWork(engine),
        cluster,
        connect,
        lease=settings.cluster_lease,
        heartbeat_interval=settings.heartbeat_interval,
        pods_ready=settings.pods_ready_timeout > 0,
        fencing=FencePolicy.of(settings),
        clock=clock,
    )


class FleetLoop:
    """Sync then reconcile every cluster, every ``resync_interval``; and a
    cluster at once when a watch on it reports a change (workers/watch.py)."""

    def __init__(
        self,
        engine: Engine,
        settings: WorkerSettings,
        connect: Connector | None = None,
        clock: Clock = lambda: datetime.now(UTC),
        watch: bool = True,
        on_sync: Callable[[SyncReport], None] | None = None,
        on_collect: Callable[[CollectReport], None] | None = None,
    ) -> None:
        self.engine = engine
        self.on_sync = on_sync
        self.on_collect = on_collect
        self.collect_policy = CollectPolicy.of(settings)
        self.settings = settings
        self.connect = connect or Connector(settings)
        self.coalescer = Coalescer(engine, settings.broker_url, settings.reconcile_spacing)
        self.clock = clock
        self.stop = threading.Event()
        self.passes = 0
        #: Passes of one cluster that a watch event caused.
        self.woken = 0
        self.watch = watch
        self.watches: dict[str, tuple[Member, ClusterWatch]] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def halt(self) -> None:
        self.stop.set()
        self._wake.set()

    def wake(self, cluster: str) -> None:
        with self._lock:
            self._dirty.add(cluster)
        self._wake.set()

    def step(self) -> None:
        """A full pass: every cluster (and its watches started or renewed),
        then the collections of deleted clusters that are due."""
        with self.engine.connect() as conn:
            every = clusters(conn)
        rows = [c for c in every if not c.deleted]
        if self.watch:
            self._watch(rows)
        for row in rows:
            if self.stop.is_set():
                return
            self._one(row.name)
        self._collect(waiting(every))
        self.passes += 1

    def _collect(self, rows: list[ClusterRow]) -> None:
        now = self.clock()
        for row in rows:
            if self.stop.is_set() or not due(row, now):
                continue
            try:
                report = collect(
                    self.engine,
                    lambda: SqlUnitOfWork(self.engine),
                    row,
                    self.connect,
                    self.collect_policy,
                    now,
                )
            except Exception as error:  # the type only: a message could quote credentials
                log.error("collection of deleted cluster %s failed: %s", row.name, type(error))
                continue
            if self.on_collect is not None:
                self.on_collect(report)
            if report.final:
                self.connect.forget(row.name)

    def _watch(self, rows: list[ClusterRow]) -> None:
        names = {row.name for row in rows}
        for name in [n for n in self.watches if n not in names]:
            self.watches.pop(name)[1].close()
        for row in rows:
            try:
                member = self.connect(row)
            except Exception:
                log.exception("cannot connect to %s", row.name)
                continue
            current = self.watches.get(row.name)
            kinds = watched(row.backend)
            if current is not None and current[0] is member and current[1].kinds == kinds:
                continue
            if current is not None:
                current[1].close()
            watch = ClusterWatch(member, functools.partial(self.wake, row.name), kinds)
            self.watches[row.name] = (member, watch)

    def _take(self) -> list[str]:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        return sorted(dirty)

    def _one(self, name: str) -> None:
        try:
            report = sync_once(self.engine, name, self.connect, self.settings, self.clock)
            if self.on_sync is not None:
                self.on_sync(report)
            if not report.reachable:
                return
            # One pass: the other clusters' syncs wait meanwhile (a budget of a
            # resync interval, passes spaced, held each cluster for a second
            # under steady admissions, and finished gangs were seen, and their
            # quota released, three seconds late). Passes wanted meanwhile are
            # the reconcile consumer's, or the next resync's.
            self.coalescer.run(
                name,
                lambda: reconcile_once(self.engine, name, self.connect, self.settings, self.clock),
                budget=0.0,
            )
        except ConcurrencyConflict:
            log.info("%s changed during its pass; next pass redoes it", name)
        except MemberError as error:
            log.warning("%s: %s", name, error)
        except Exception:
            log.exception("fleet pass of %s failed", name)

    def run(self, active: Callable[[], bool] = lambda: True) -> None:
        due = 0.0
        try:
            while not self.stop.is_set():
                if not active():  # not the leader (yet): look again soon
                    self._close_watches()
                    self.stop.wait(min(self.settings.resync_interval, 0.25))
                    due = 0.0
                    continue
                self._wake.clear()
                if time.monotonic() >= due:
                    self._take()
                    try:
                        self.step()
                    except Exception:
                        # The database restarting (or anything else) must not
                        # end the loop: a leader whose fleet loop died would
                        # never sync, requeue or reconcile again.
                        log.exception("fleet pass failed; the next one retries")
                    due = time.monotonic() + self.settings.resync_interval
                else:
                    for name in self._take():
                        self._one(name)
                        self.woken += 1
                self._wake.wait(max(0.0, due - time.monotonic()))
        finally:
            self._close_watches()
            self.connect.close()

    def _close_watches(self) -> None:
        for name, (_, watch) in self.watches.items():
            try:
                watch.close()
            except Exception:
                log.warning("closing the watches of %s failed", name, exc_info=True)
        self.watches.clear()


__all__ = ["Connector", "FleetLoop", "reconcile_once", "sync_once"]
