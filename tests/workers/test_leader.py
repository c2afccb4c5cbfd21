"""One admission leader at a time, and a deposed one cannot commit."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from service.app.bootstrap import Services
from service.app.uow import SqlUnitOfWork
from tests.workers.conftest import (
    ADMIN,
    setup_fleet,
    wait_for,
    worker_settings,
    workload,
    workload_status,
)
from workers.leader import Deposed
from workers.scheduler import AdmissionLeader, Scheduler
from workers.sync import SyncReport


def _leader(services: Services, database_url: str, redis_url: str, holder: str) -> AdmissionLeader:
    return AdmissionLeader(services.engine, worker_settings(database_url, redis_url), holder=holder)


def _terminate_lock_session(engine: sa.Engine, leader: AdmissionLeader) -> None:
    """End the leader's lock session and wait until its backend is gone: only
    then is its advisory lock free (pg_terminate_backend alone only signals)."""
    session = leader.lease._session
    assert session is not None
    with engine.connect() as conn:
        ended = conn.execute(
            sa.text("SELECT pg_terminate_backend(:pid, :ms)"),
            {"pid": session.info.backend_pid, "ms": 60_000},
        ).scalar_one()
    assert ended, "the lock session outlived a minute's wait"


def _admissions(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT stream, count(*) FROM events "
                "WHERE type = 'WorkloadAdmitted' GROUP BY stream"
            )
        ).all()
    return {stream: int(n) for stream, n in rows}


def test_one_leader_and_a_deposed_leader_cannot_commit(
    services: Services, database_url: str, broker: str
) -> None:
    setup_fleet(services, gpu_quota=32)
    services.submissions.submit(ADMIN, "team-a", workload("a"))
    a = _leader(services, database_url, broker, "A")
    b = _leader(services, database_url, broker, "B")
    try:
        report = a.step()
        assert report is not None and report.writes.admitted == 1
        assert b.step() is None  # the lock is A's
        # A's session dies (partition, restart) but A does not notice yet.
        _terminate_lock_session(services.engine, a)
        assert a.lease.epoch == 1
        assert b.step() is not None
        assert b.lease.epoch == 2
        services.submissions.submit(ADMIN, "team-a", workload("c"))
        with pytest.raises(Deposed):
            a.cycle.run(a._guard)  # A's commit is fenced off
        assert workload_status(services.engine, "team-a", "c")["state"] == "Pending"
        assert a.step() is None and not a.lease.leading  # A notices, steps down
        b.step()
        assert workload_status(services.engine, "team-a", "c")["state"] == "Admitted"
        assert set(_admissions(services.engine).values()) == {1}
    finally:
        a.lease.release()
        b.lease.release()


def test_a_successor_waits_for_the_commit_in_flight(
    services: Services, database_url: str, broker: str
) -> None:
    setup_fleet(services, gpu_quota=32)
    services.submissions.submit(ADMIN, "team-a", workload("a"))
    a = _leader(services, database_url, broker, "A")
    b = _leader(services, database_url, broker, "B")
    inside, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold(uow: SqlUnitOfWork, result: Any) -> None:
        inside.set()
        go.wait(10)

    def run_a() -> None:
        try:
            a.cycle.run(a._guard, before_commit=hold)
        except BaseException as error:
            errors.append(error)

    try:
        assert a.lease.try_acquire() == 1
        committing = threading.Thread(target=run_a)
        committing.start()
        assert inside.wait(10)
        _terminate_lock_session(services.engine, a)
        taking_over = threading.Thread(target=b.lease.try_acquire)
        taking_over.start()
        time.sleep(0.5)
        assert taking_over.is_alive()  # the epoch bump waits for A's commit
        go.set()
        committing.join(10)
        taking_over.join(10)
        assert errors == []
        assert b.lease.epoch == 2
        b.step()  # sees A's admission: nothing admitted twice
        assert _admissions(services.engine) == {"workload-team-a/a": 1}
    finally:
        go.set()
        a.lease.release()
        b.lease.release()


def test_two_schedulers_with_a_failover_admit_every_workload_once(
    services: Services, database_url: str, broker: str
) -> None:
    setup_fleet(services, gpu_quota=32, islands=2, nodes_per_island=2)
    settings = worker_settings(database_url, broker, cycle_interval=0.1)
    noop_send: Any = lambda *args: None  # noqa: E731
    runners = [Scheduler(services.engine, settings, noop_send, holder=h, relay=False) for h in "AB"]
    threads = [threading.Thread(target=r.run) for r in runners]
    for thread in threads:
        thread.start()
    try:
        for n in range(3):
            services.submissions.submit(ADMIN, "team-a", workload(f"w{n}"))
        first = wait_for(lambda: next((r for r in runners if r.leader.lease.leading), None), 60)
        wait_for(lambda: len(_admissions(services.engine)) == 3, 60)
        _terminate_lock_session(services.engine, first.leader)
        for n in range(3, 6):
            services.submissions.submit(ADMIN, "team-a", workload(f"w{n}"))
        wait_for(lambda: len(_admissions(services.engine)) == 4, 60)  # quota: 4 x 8 GPUs
        time.sleep(0.5)
    finally:
        for runner in runners:
            runner.stop.set()
        for thread in threads:
            thread.join(10)
    admissions = _admissions(services.engine)
    assert len(admissions) == 4 and set(admissions.values()) == {1}
    states = [workload_status(services.engine, "team-a", f"w{n}")["state"] for n in range(6)]
    assert states.count("Admitted") == 4 and states.count("Pending") == 2
    with services.engine.connect() as conn:
        epoch = conn.execute(sa.text("SELECT epoch FROM leader_epochs")).scalar_one()
    assert epoch >= 2


def test_without_any_wake_up_the_leader_still_runs_every_interval(
    services: Services, database_url: str, broker: str
) -> None:
    setup_fleet(services, gpu_quota=16)
    settings = worker_settings(database_url, broker, cycle_interval=1.0)
    noop_send: Any = lambda *args: None  # noqa: E731
    runner = Scheduler(services.engine, settings, noop_send, holder="tick", relay=False)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: runner.cycles >= 1, 60)
        services.submissions.submit(ADMIN, "team-a", workload("a"))  # no relay: no hint
        # Nothing publishes on this broker's wake channel: only the tick admits.
        wait_for(lambda: workload_status(services.engine, "team-a", "a")["state"] == "Admitted", 60)
    finally:
        runner.stop.set()
        thread.join(10)


def test_a_deposed_scheduler_drops_the_series_only_the_leader_knows(
    services: Services, database_url: str, broker: str
) -> None:
    """Pending workloads and quota usage come from the leader's cycles; a
    deposed scheduler stops reporting its last view of them (and says it no
    longer leads), while the new leader reports its own."""
    setup_fleet(services, gpu_quota=8)
    settings = worker_settings(database_url, broker, cycle_interval=0.05)
    noop_send: Any = lambda *args: None  # noqa: E731
    a, b = (Scheduler(services.engine, settings, noop_send, holder=h, relay=False) for h in "AB")
    series = (
        "qm_pending_workloads",
        "qm_cluster_queue_resource_usage",
        "qm_member_cluster_ready",
        "qm_admission_leader",
    )

    def shown(scheduler: Scheduler) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {name: [] for name in series}
        for family in scheduler.metrics.registry.collect():
            for sample in family.samples:
                if sample.name in found:
                    found[sample.name].append(sample.value)
        return found

    try:
        for n in range(2):
            services.submissions.submit(ADMIN, "team-a", workload(f"w{n}"))  # one fits
        a._tick()
        led = shown(a)
        assert led["qm_pending_workloads"] == [1.0] and led["qm_admission_leader"] == [1.0]
        assert 8.0 in led["qm_cluster_queue_resource_usage"]  # GPUs, beside cpu and memory
        a.metrics.observe_sync(SyncReport("c1"))  # what the leader's fleet loop reports
        assert shown(a)["qm_member_cluster_ready"] == [1.0]
        _terminate_lock_session(services.engine, a.leader)
        b._tick()
        assert b.leader.lease.leading
        a._tick()  # notices
        assert not a.leader.lease.leading
        # a sync the fleet loop began while leading ends after the step-down
        a.metrics.observe_sync(SyncReport("c1", lags=[0.5]))
        assert shown(a) == {
            "qm_pending_workloads": [],
            "qm_cluster_queue_resource_usage": [],
            "qm_member_cluster_ready": [],
            "qm_admission_leader": [0.0],
        }
        lag = a.metrics.registry.get_sample_value
        assert lag("qm_reconcile_lag_seconds_count", {"cluster": "c1"}) == 1  # still measured
        assert shown(b)["qm_pending_workloads"] == [1.0]
    finally:
        for scheduler in (a, b):
            scheduler.leader.lease.release()
            scheduler.waker.close()
