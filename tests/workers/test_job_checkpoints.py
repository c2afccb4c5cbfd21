"""A running gang's last checkpoint (issue 24): its job's annotation
``quartermaster.dev/last-checkpoint`` on the member is read by sync, recorded
through the lifecycle as ``WorkloadCheckpointed``, and reaches the engine
as ``AdmittedWorkload.last_checkpoint``, which the victim order weighs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes
import sqlalchemy as sa

from service.app import lifecycle
from service.app.admission import workloads_by_key
from service.app.admission.caches import cached_workload
from service.app.bootstrap import Services
from sim.kubesim.testing import RunningCluster
from tests.workers.conftest import ADMIN, wait_for, workload_status
from tests.workers.members import gang, jobs, members, scheduling, settings, setup_central
from workers.outbox import Send
from workers.plan import CHECKPOINT_ANNOTATION

SAVED = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def _annotate(cluster: RunningCluster, name: str, at: str) -> None:
    with cluster.api_client() as api:
        kubernetes.client.BatchV1Api(api).patch_namespaced_job(
            name, "team-a", {"metadata": {"annotations": {CHECKPOINT_ANNOTATION: at}}}
        )


def _events(engine: sa.Engine, stream: str) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.exec_driver_sql(
                "SELECT type FROM events WHERE stream = %(s)s ORDER BY position", {"s": stream}
            ).scalars()
        )


def test_a_checkpoint_annotated_on_the_members_job_reaches_the_engine(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            assert "lastCheckpoint" not in workload_status(engine, "team-a", "a")
            (job,) = jobs(c1)
            _annotate(c1, job["metadata"]["name"], "2026-11-30T12:00:00.250Z")
            wait_for(
                lambda: workload_status(engine, "team-a", "a").get("lastCheckpoint"),
                60,
                what="the checkpoint recorded",
            )
    status = workload_status(engine, "team-a", "a")
    assert status["lastCheckpoint"] == "2026-11-30T12:00:00Z"
    assert status["state"] == "Running"
    assert _events(engine, "workload-team-a/a").count("WorkloadCheckpointed") == 1
    with engine.connect() as conn:
        (row,) = workloads_by_key(conn, [("team-a", "a")])
    admitted = cached_workload(row).admitted
    assert admitted is not None and admitted.last_checkpoint == SAVED.timestamp()


def test_only_a_newer_checkpoint_of_a_running_gang_is_recorded() -> None:
    now = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)
    running = lifecycle.Status({"state": "Running", "lastCheckpoint": "2026-11-30T12:00:00Z"})
    newer = lifecycle.checkpoint(running, datetime(2026, 11, 30, 12, 30, tzinfo=UTC), now)
    assert newer is not None and newer.event == "WorkloadCheckpointed"
    assert newer.status.raw["lastCheckpoint"] == "2026-11-30T12:30:00Z"
    assert newer.entries == []  # no ledger entry: nothing is admitted or released
    assert lifecycle.checkpoint(running, SAVED, now) is None  # the same one again
    assert lifecycle.checkpoint(running, SAVED.replace(minute=0, hour=11), now) is None
    admitted = lifecycle.Status({"state": "Admitted"})
    assert lifecycle.checkpoint(admitted, now, now) is None


def test_a_checkpoint_is_never_later_than_it_is_read_nor_recorded_twice_a_minute() -> None:
    now = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)
    running = lifecycle.Status({"state": "Running", "lastCheckpoint": "2026-11-30T12:00:00Z"})
    ahead = lifecycle.checkpoint(running, datetime(2099, 1, 1, tzinfo=UTC), now)
    assert ahead is not None and ahead.status.raw["lastCheckpoint"] == "2026-11-30T13:00:00Z"
    soon = SAVED + lifecycle.CHECKPOINT_EVERY - timedelta(seconds=1)
    assert lifecycle.checkpoint(running, soon, now) is None
    due = lifecycle.checkpoint(running, SAVED + lifecycle.CHECKPOINT_EVERY, now)
    assert due is not None and due.status.raw["lastCheckpoint"] == "2026-11-30T12:01:00Z"
