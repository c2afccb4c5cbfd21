"""``GET /v1/usage``'s rows (the audit service) carry both measures: ``hours``
and ``held`` what was held, ``ran`` what the pods ran, from the real ledger."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from service.app import lifecycle
from service.app.bootstrap import Services
from service.app.lifecycle import PodTimes
from service.app.uow import SqlUnitOfWork
from service.ledger.entries import WorkloadAdmitted, WorkloadFinished, new_entry
from tests.workers.conftest import ADMIN, GPU

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NAMES = {"namespace": "team-a", "workload": "w", "local_queue": "lq", "cluster_queue": "cq"}


def test_usage_rows_report_held_and_ran(engine: sa.Engine, services: Services) -> None:
    admission = uuid.uuid4()
    admitted = WorkloadAdmitted(
        **NAMES,
        cluster="c1",
        flavors={GPU: "h100"},
        island=None,
        reserved={"h100": {GPU: 16}},
        borrowed={},
        reason="fits",
    )
    finished = WorkloadFinished(
        **NAMES,
        cluster="c1",
        outcome="succeeded",
        started_at=T0,
        finished_at=T0,
        consumed={},
        gpu_seconds=0,
        cpu_seconds=0,
        memory_gib_seconds=0,
    )
    # two pods of 8 GPUs ran 30 of the 60 minutes held
    pods = [PodTimes(T0 + timedelta(minutes=10), T0 + timedelta(minutes=40), {GPU: 8})] * 2
    ran = lifecycle.measured_run(admitted.model_dump(mode="json"), str(admission), pods, T0)
    with SqlUnitOfWork(engine) as uow:
        uow.record(
            [
                new_entry(admitted, admission, T0),
                new_entry(finished, uuid.uuid4(), T0 + timedelta(hours=1)),
                ran,
            ]
        )
        uow.commit()
    rows = services.audit.usage(ADMIN.principal, "day", ["namespace"], None)
    (row,) = [r for r in rows if r["resource"] == GPU]
    assert row["namespace"] == "team-a"
    assert (row["hours"], row["held"], row["ran"]) == (16.0, 16.0, 8.0)
