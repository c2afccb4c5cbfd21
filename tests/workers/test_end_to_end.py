"""End to end, small: HTTP submission → outbox → relay → Celery worker →
wake-up → the admission leader admits within quota → explain says why the
rest waits. The leader's periodic tick is an hour, so an admission after its
first cycle can only come through the wake-up path, and the wake channel is
the test's own (its broker database's): no other process's hint can stand in."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import sqlalchemy as sa

from tests.api.conftest import ADMIN_TOKEN, serve
from tests.workers.conftest import (
    celery_worker,
    ledger_kinds,
    setup_fleet,
    wait_for,
    worker_settings,
    workload,
    workload_status,
)
from workers.outbox import Send, pending_count
from workers.scheduler import Scheduler


def test_submit_wake_admit_within_quota_and_explain(
    engine: sa.Engine, database_url: str, broker: str, send: Send
) -> None:
    settings = worker_settings(database_url, broker, cycle_interval=3600.0)
    with serve(database_url) as (base_url, services), celery_worker(database_url, broker):
        setup_fleet(services, gpu_quota=16)
        scheduler = Scheduler(engine, settings, send, holder="e2e")
        thread = threading.Thread(target=scheduler.run)
        thread.start()
        try:
            wait_for(lambda: scheduler.cycles >= 1, what="the first cycle (nothing to do)")
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
                for name in ("a", "b", "c"):
                    response = client.post(
                        "/v1/namespaces/team-a/workloads", json=workload(name, count=1, gpus=8)
                    )
                    assert response.status_code == 201, response.text

                def states() -> dict[str, dict[str, Any]]:
                    return {n: workload_status(engine, "team-a", n) for n in "abc"}

                wait_for(
                    lambda: all(states()[n]["state"] == "Admitted" for n in ("a", "b")),
                    what="a and b admitted by a woken cycle",
                    seen=states,
                )
                wait_for(lambda: states()["c"].get("pendingReason"), what="c's pending reason")
                explained = client.get("/v1/namespaces/team-a/workloads/c/explain").json()
                admitted = client.get("/v1/namespaces/team-a/workloads/a/explain").json()
            # The scheduler's metrics are set after the cycle's commit, which
            # the rows above show: wait for them rather than race it.
            metric = scheduler.metrics.registry.get_sample_value
            cq = {"cluster_queue": "cq"}
            labels = {**cq, "flavor": "h100", "resource": "nvidia.com/gpu"}
            pending = {**cq, "status": "inadmissible"}
            expected = {"admitted": 2.0, "pending": 1.0, "usage": 16.0, "waits": 2.0}

            def observed() -> dict[str, float | None]:
                return {
                    "admitted": metric("qm_admitted_workloads_total", cq),
                    "pending": metric("qm_pending_workloads", pending),
                    "usage": metric("qm_cluster_queue_resource_usage", labels),
                    "waits": metric("qm_admission_wait_time_seconds_count", cq),
                }

            wait_for(lambda: observed() == expected, what=f"metrics {expected}", seen=observed)
            # The cycle's own outbox rows (the admitted gangs' dispatches)
            # are relayed within a pass of its commit.
            wait_for(lambda: pending_count(engine) == 0, what="the outbox relayed")
        finally:
            scheduler.stop.set()
            thread.join(10)
    assert explained["state"] == "Pending"
    assert explained["positionInQueue"] == 1
    assert "quota" in explained["waitingFor"].lower(), explained
    assert admitted["state"] == "Admitted"
    assert admitted["admission"]["cluster"] == "c1"
    assert ledger_kinds(engine) == ["workload.admitted", "workload.admitted"]
    with engine.connect() as conn:
        wakes = conn.execute(
            sa.text(
                "SELECT count(*) FROM processed_messages "
                "WHERE consumer = 'admission.wake' AND outcome = 'done'"
            )
        ).scalar_one()
    assert wakes == 3
