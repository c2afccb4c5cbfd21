"""The fleet loop: every member cluster synced, then reconciled, each pass
in its own unit of work; and the connector that turns a Cluster row into a
rate-limited client.

The scheduler runs the loop while it leads (the periodic resync, which
catches whatever a lost outbox hint or a failed pass left); the
``reconcile.cluster`` consumer (workers/tasks.py) reconciles one cluster as
soon as an admission cycle commits decisions for it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Engine

from service.app.crypto import SecretBox
from service.app.uow import SqlUnitOfWork
from service.eventstore.port import ConcurrencyConflict
from workers.clusters import Member, MemberError, configuration
from workers.reconcile import Report, reconcile
from workers.records import ClusterRow, clusters
from workers.settings import WorkerSettings
from workers.sync import SyncReport, sync

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class Connector:
    """One Member per cluster, rebuilt when its spec or credentials change."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._settings = settings
        self._box = SecretBox(settings.secret_key)
        self._members: dict[str, tuple[str, Member]] = {}
        self._lock = threading.Lock()

    def __call__(self, row: ClusterRow) -> Member:
        stamp = json.dumps([row.uid, row.spec, (row.secret or b"").hex()], sort_keys=True)
        with self._lock:
            cached = self._members.get(row.name)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            secret = json.loads(self._box.open(row.secret)) if row.secret else None
            s = self._settings
            member = Member(
                row.name,
                configuration(row.spec, secret),
                qps=s.member_qps,
                burst=s.member_burst,
                timeout=(s.member_connect_timeout, s.member_read_timeout),
            )
            if cached is not None:
                cached[1].close()
            self._members[row.name] = (stamp, member)
            return member

    def close(self) -> None:
        with self._lock:
            for _, member in self._members.values():
                member.close()
            self._members.clear()


def reconcile_once(
    engine: Engine, cluster: str, connect: Connector, settings: WorkerSettings, clock: Clock
) -> Report:
    with SqlUnitOfWork(engine) as uow:
        report = reconcile(
            engine, uow, cluster, connect, delete_wait=settings.delete_wait, clock=clock
        )
        uow.commit()
    return report


def sync_once(
    engine: Engine, cluster: str, connect: Connector, settings: WorkerSettings, clock: Clock
) -> SyncReport:
    with SqlUnitOfWork(engine) as uow:
        report = sync(
            engine,
            uow,
            cluster,
            connect,
            lease=settings.cluster_lease,
            heartbeat_interval=settings.heartbeat_interval,
            pods_ready=settings.pods_ready_timeout > 0,
            clock=clock,
        )
        uow.commit()
    return report


class FleetLoop:
    """Sync then reconcile every cluster, every ``resync_interval``."""

    def __init__(
        self,
        engine: Engine,
        settings: WorkerSettings,
        connect: Connector | None = None,
        clock: Clock = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.connect = connect or Connector(settings)
        self.clock = clock
        self.stop = threading.Event()
        self.passes = 0

    def step(self) -> None:
        with self.engine.connect() as conn:
            names = [c.name for c in clusters(conn) if not c.deleted]
        for name in names:
            if self.stop.is_set():
                return
            self._one(name)
        self.passes += 1

    def _one(self, name: str) -> None:
        try:
            report = sync_once(self.engine, name, self.connect, self.settings, self.clock)
            if not report.reachable:
                return
            reconcile_once(self.engine, name, self.connect, self.settings, self.clock)
        except ConcurrencyConflict:
            log.info("%s changed during its pass; next pass redoes it", name)
        except MemberError as error:
            log.warning("%s: %s", name, error)
        except Exception:
            log.exception("fleet pass of %s failed", name)

    def run(self, active: Callable[[], bool] = lambda: True) -> None:
        while not self.stop.is_set():
            if not active():  # not the leader (yet): look again soon
                self.stop.wait(min(self.settings.resync_interval, 0.25))
                continue
            self.step()
            self.stop.wait(self.settings.resync_interval)
        self.connect.close()


__all__ = ["Connector", "FleetLoop", "reconcile_once", "sync_once"]
