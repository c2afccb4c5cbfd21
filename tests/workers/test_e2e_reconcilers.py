"""Reconcile against a stand-in member, passes in this process; and one
pass per cluster at a time (workers/coalesce.py).

Two reconcilers of one member cluster (a Celery worker's and the fleet
loop's, as in production): a pass that read the centre before a gang was
admitted never takes that gang's job, dispatched meanwhile by the other
pass, for a stray. (Found by the 200-gang end-to-end test: the job was
deleted, and dispatched again, for the same admission.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import sqlalchemy as sa

from service.app.admission import AdmissionCycle
from service.app.bootstrap import Services
from service.runtime.embedded import free_port
from tests.workers.conftest import ADMIN, wait_for, workload_status
from tests.workers.members import gang, job, members, settings, setup_central
from workers.clusters import Member
from workers.coalesce import WANTED, Coalescer
from workers.fleet import Connector, reconcile_once, sync_once
from workers.plan import member_status
from workers.records import ClusterRow
from workers.settings import WorkerSettings


class _WorldMovesDuringTheJobList(Connector):
    """A connector whose member runs ``meanwhile`` the first time it is
    asked for the Jobs it holds: what happens between a pass's reads."""

    def __init__(self, settings: WorkerSettings, meanwhile: Callable[[], None]) -> None:
        super().__init__(settings)
        self.meanwhile: Callable[[], None] | None = meanwhile

    def __call__(self, row: ClusterRow) -> Member:
        member = super().__call__(row)
        if getattr(member, "_hooked", False):
            return member
        real = member.list_objects

        def list_objects(kind: str, label_selector: str | None = None) -> list[dict[str, Any]]:
            if kind == "Job" and self.meanwhile is not None:
                meanwhile, self.meanwhile = self.meanwhile, None
                meanwhile()
            return real(kind, label_selector)

        member.list_objects = list_objects  # type: ignore[method-assign]
        member._hooked = True  # type: ignore[attr-defined]
        return member


def test_a_pass_never_deletes_a_job_dispatched_for_a_gang_admitted_while_it_ran(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    tmp_path: Path,
) -> None:
    config = settings(database_url, broker)
    now = lambda: datetime.now(UTC)  # noqa: E731
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        other = Connector(config)

        def admitted_and_dispatched_by_the_other_pass() -> None:
            services.submissions.submit(ADMIN, "team-a", gang("late", duration="100000s"))
            AdmissionCycle(engine, services.unit_of_work).run(lambda uow: None)
            assert reconcile_once(engine, "c1", other, config, now).dispatched

        this = _WorldMovesDuringTheJobList(config, admitted_and_dispatched_by_the_other_pass)
        try:
            assert sync_once(engine, "c1", other, config, now).heartbeat
            report = reconcile_once(engine, "c1", this, config, now)
            assert this.meanwhile is None  # it did happen in the middle of the pass
            assert report.deleted == [] and report.dispatched == []
            assert job(c1, "late") is not None
            again = reconcile_once(engine, "c1", other, config, now)
            assert again.deleted == [] and again.dispatched == []
        finally:
            this.close()
            other.close()
    assert workload_status(engine, "team-a", "late")["state"] == "Admitted"


def test_a_finished_job_whose_removal_lingers_does_not_hold_back_the_next_dispatch(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    tmp_path: Path,
) -> None:
    """Its pods have all completed: nothing to wait for. (Under steady churn
    some job has always just finished, and dispatch waited pass after pass:
    found by bench/e2e.py.) A finalizer of someone else's keeps the job."""
    config = settings(database_url, broker, delete_wait=2.0)
    now = lambda: datetime.now(UTC)  # noqa: E731
    held = {"metadata": {"finalizers": ["example.com/keep"]}}
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        connect = Connector(config)
        cycle = AdmissionCycle(engine, services.unit_of_work)
        try:
            assert sync_once(engine, "c1", connect, config, now).heartbeat
            services.submissions.submit(ADMIN, "team-a", gang("done", count=1, duration="10s"))
            cycle.run(lambda uow: None)
            assert reconcile_once(engine, "c1", connect, config, now).dispatched
            wait_for(lambda: member_status(job(c1, "done") or {}, None)["phase"] == "Succeeded", 60)
            with c1.api_client() as api:
                kubernetes.client.BatchV1Api(api).patch_namespaced_job(
                    "done", "team-a", held, _preload_content=False
                )
            sync_once(engine, "c1", connect, config, now)
            assert workload_status(engine, "team-a", "done")["state"] == "Finished"
            services.submissions.submit(ADMIN, "team-a", gang("next", count=1))
            cycle.run(lambda uow: None)
            report = reconcile_once(engine, "c1", connect, config, now)
            assert report.deleted == ["Job team-a/done"] and report.waiting == []
            assert report.dispatched == ["Job team-a/next"]
            assert (job(c1, "done") or {})["metadata"]["deletionTimestamp"]  # still there
        finally:
            connect.close()
            with c1.api_client() as api:
                release = {"metadata": {"finalizers": None}}
                kubernetes.client.BatchV1Api(api).patch_namespaced_job(
                    "done", "team-a", release, _preload_content=False
                )


def test_passes_of_one_cluster_never_overlap_and_none_asked_for_is_lost(
    engine: sa.Engine, broker: str
) -> None:
    """Three processes' worth of coalescers asked for passes of one cluster
    thirty times: one pass at a time, fewer passes than asks, and each ask
    followed by a pass that started after it."""
    lock = threading.Lock()
    running, overlaps, starts, asks = [0], [0], [], []

    def one_pass() -> None:
        with lock:
            running[0] += 1
            overlaps[0] = max(overlaps[0], running[0])
            starts.append(time.monotonic())
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    def asker(coalescer: Coalescer) -> None:
        for _ in range(10):
            with lock:
                asks.append(time.monotonic())
            coalescer.run("c1", one_pass)
            time.sleep(0.01)

    coalescers = [Coalescer(engine, broker) for _ in range(3)]
    threads = [threading.Thread(target=asker, args=(c,)) for c in coalescers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert overlaps[0] == 1
    assert 1 <= len(starts) < len(asks) == 30
    assert all(any(start >= ask for start in starts) for ask in asks)


def test_spaced_passes_begin_apart_and_take_the_asks_made_meanwhile(
    engine: sa.Engine, broker: str
) -> None:
    """With a spacing, a pass that follows another of the same cluster
    begins no sooner than the spacing after it, and the asks made in between
    are all served by that one pass."""
    spacing = 1.0  # "does not wait" below is a bound of half of it, not a speed
    coalescer = Coalescer(engine, broker, spacing)
    other = Coalescer(engine, broker, spacing)
    starts: list[float] = []
    asked: list[int] = []

    def one_pass() -> None:
        starts.append(time.monotonic())
        if len(starts) == 1:  # asks made while this pass runs, from "another process"
            asked.extend(other.run("spaced", one_pass) for _ in range(5))

    assert coalescer.run("spaced", one_pass) == 2
    assert asked == [0] * 5, "the holder runs them"
    assert len(starts) == 2
    assert starts[1] - starts[0] >= spacing - 0.01
    began = time.monotonic()
    coalescer.run("spaced", one_pass)  # a later run's first pass does not wait
    assert starts[2] - began < spacing / 2


def test_a_holder_stops_taking_asks_past_its_budget_and_leaves_the_note(
    engine: sa.Engine, broker: str
) -> None:
    """Asks that never stop (steady admissions) do not keep one holder busy
    for ever: past its budget it begins no further pass, and the note stays
    for the next ask, which runs it."""
    holder = Coalescer(engine, broker)
    other = Coalescer(engine, broker)
    passes: list[float] = []

    def one_pass() -> None:
        passes.append(time.monotonic())
        other.run("budget", one_pass)  # asked again while this pass runs
        time.sleep(0.2)

    began = time.monotonic()
    ran = holder.run("budget", one_pass, budget=1.0)
    assert 2 <= ran == len(passes) <= 10
    # A pass that began past the budget would begin a pass's length (0.2 s) late.
    assert passes[-1] - began < 1.0 + 0.15, "no pass begins past the budget"
    assert holder._wanted(WANTED.format(cluster="budget")), "the last ask is left noted"
    assert other.run("budget", lambda: passes.append(0.0), budget=0.0) == 1


def test_without_redis_every_ask_runs_its_pass(engine: sa.Engine) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    passes: list[int] = []
    assert Coalescer(engine, nowhere).run("c1", lambda: passes.append(1)) == 1
    assert passes == [1]
