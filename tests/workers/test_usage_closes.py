"""Issue 17 finding 1: every way a gang stops holding capacity closes its
usage in the ledger exactly once — a cancelled running gang through the
whole stack (Postgres, Redis, a Celery worker, a stand-in member), and the
lifecycle's idempotent guard against the real ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from service.app import lifecycle
from service.app.bootstrap import Services
from service.app.lifecycle import Status, Subject
from service.ledger.accounting import UsageRollup, audit, open_usage
from tests.workers.conftest import ADMIN, celery_worker, wait_for, workload_status
from tests.workers.members import gang, job, members, scheduling, settings, setup_central
from tests.workers.usage import GPU, closes, entries, running
from workers.outbox import Send

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _gpu_hours(rollup: UsageRollup, as_of: datetime) -> float:
    return sum(r.hours for r in rollup.report("month", ("namespace",), as_of) if r.resource == GPU)


def test_a_running_gang_cancelled_is_closed_once_and_billed_no_further(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path) as clusters, celery_worker(database_url, broker):
        (c1,) = clusters
        setup_central(services, clusters, gpu_quota=16)
        with scheduling(engine, settings(database_url, broker), send, relay=True):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            assert audit(entries(engine), running(clusters), resources=[GPU]) == []
            services.submissions.cancel(ADMIN, "team-a", "a")
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Cancelled", 60)
            assert job(c1, "a") is None
            # Passes go on: none of them closes it again.
            wait_for(lambda: job(c1, "a") is None and not running(clusters), 60)
    (close,) = closes(engine, "team-a/a")
    assert close[0] == "workload.finished" and close[1]["outcome"] == "cancelled"
    ledger = entries(engine)
    assert open_usage(ledger) == {}
    assert audit(ledger, {}) == []
    rollup = UsageRollup()
    rollup.apply_all(ledger)
    last = ledger[-1].recorded_at
    assert _gpu_hours(rollup, last + timedelta(days=30)) == _gpu_hours(rollup, last) > 0


def _holding(state: str = "Running") -> Status:
    admission = {
        "id": "1b1f3c9e-6f7a-4d0e-9a11-2f8f2d6f0a01",
        "clusterQueue": "cq",
        "cluster": "c1",
        "admittedAt": "2026-03-01T11:00:00Z",
        "podSetAssignments": [
            {
                "name": "workers",
                "count": 2,
                "flavors": {GPU: "h100", "cpu": "h100"},
                "resourceUsage": {GPU: "16", "cpu": "16"},
            }
        ],
    }
    return Status({"state": state, "admission": admission, "startedAt": "2026-03-01T11:00:10Z"})


SUBJECT = Subject("team-a", "a", "0c6d2c1e-5b1a-4c9e-8a2d-3c4b5a6d7e8f", "train")


def test_a_second_close_of_one_admission_writes_nothing(services: Services) -> None:
    """Two closes of one admission (a cancel confirmed twice, then a cluster
    loss racing a finish) give one entry id; the ledger stores it once."""
    cancelling = lifecycle.request_cancel(_holding(), "someone", NOW).status
    first = lifecycle.cancelled(SUBJECT, cancelling, NOW)
    assert first.entry is not None and first.status.state == "Cancelled"
    assert lifecycle.cancelled(SUBJECT, first.status, NOW).entry is None
    lost = lifecycle.lose_cluster(SUBJECT, cancelling, "c1", "ClusterLost", "gone", NOW)
    finished = lifecycle.finish(
        SUBJECT, _holding(), succeeded=True, reason="Succeeded", finished_at=NOW, now=NOW
    )
    assert lost is not None and lost.entry is not None and finished.entry is not None
    assert {lost.entry.entry_id, finished.entry.entry_id} == {first.entry.entry_id}
    with services.unit_of_work() as uow:
        uow.record([first.entry])
        uow.record([lost.entry, finished.entry])
        uow.commit()
    with services.engine.connect() as conn:
        stored = conn.exec_driver_sql(
            "SELECT count(*) FROM ledger_entries WHERE kind = 'workload.finished'"
        ).scalar_one()
    assert stored == 1


def test_every_transition_that_ends_holding_capacity_closes_it() -> None:
    """Finish, fail, preempt, evict (pods-ready timeout, stopped queue, the
    member's eviction), deactivate, refuse, cancel and cluster loss or
    deletion each write one closing entry; the states that hold nothing
    close nothing."""
    held = _holding()
    changes = {
        "finish": lifecycle.finish(
            SUBJECT, held, succeeded=True, reason="Succeeded", finished_at=NOW, now=NOW
        ),
        "fail": lifecycle.finish(
            SUBJECT, held, succeeded=False, reason="Failed", finished_at=NOW, now=NOW
        ),
        "preempt": lifecycle.preempt(
            SUBJECT,
            held,
            reason="InClusterQueue",
            message="m",
            preemptor="team-a/b",
            preemptor_cluster_queue="cq",
            cohort_path=[],
            now=NOW,
        ),
        "evict": lifecycle.evict(SUBJECT, held, reason="PodsReadyTimeout", message="m", now=NOW),
        "deactivate": lifecycle.evict(
            SUBJECT, held, reason="PodsReadyTimeout", message="m", now=NOW, spec={}, deactivate=True
        ),
        "cancel": lifecycle.cancelled(
            SUBJECT, lifecycle.request_cancel(held, "u", NOW).status, NOW
        ),
        "lose": lifecycle.lose_cluster(SUBJECT, held, "c1", "ClusterLost", "m", NOW),
        "delete cluster": lifecycle.lose_cluster(SUBJECT, held, "c1", "ClusterDeleted", "m", NOW),
    }
    for what, change in changes.items():
        assert change is not None and change.entry is not None, what
        assert not change.status.holds, what
        assert change.entry.body["cluster"] == "c1", what
    assert changes["deactivate"].spec == {"active": False}
    for state in ("Pending", "Evicted", "Finished", "Cancelled"):
        status = Status({**_holding().raw, "state": state})
        assert lifecycle.cancelled(SUBJECT, status, NOW).entry is None, state
    assert lifecycle.request_cancel(Status({"state": "Pending"}), "u", NOW).status.state == (
        "Cancelled"
    )
