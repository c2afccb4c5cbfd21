"""End to end, small: HTTP submission → outbox → relay → Celery worker →
wake-up → the admission leader admits within quota → explain says why the
rest waits. The leader's periodic tick is set long, so a prompt admission can
only come through the wake-up path."""

from __future__ import annotations

import threading
import time

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
    settings = worker_settings(database_url, broker, cycle_interval=30.0)
    with serve(database_url) as (base_url, services), celery_worker(database_url, broker):
        setup_fleet(services, gpu_quota=16)
        scheduler = Scheduler(engine, settings, send, holder="e2e")
        thread = threading.Thread(target=scheduler.run)
        thread.start()
        try:
            wait_for(lambda: scheduler.cycles >= 1, 10)  # the first cycle: nothing to do
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            with httpx.Client(base_url=base_url, headers=headers, timeout=10) as client:
                submitted = time.monotonic()
                for name in ("a", "b", "c"):
                    response = client.post(
                        "/v1/namespaces/team-a/workloads", json=workload(name, count=1, gpus=8)
                    )
                    assert response.status_code == 201, response.text
                wait_for(
                    lambda: all(
                        workload_status(engine, "team-a", n)["state"] == "Admitted"
                        for n in ("a", "b")
                    ),
                    10,
                )
                assert time.monotonic() - submitted < 5  # woken, not the 30 s tick
                wait_for(lambda: workload_status(engine, "team-a", "c").get("pendingReason"), 10)
                explained = client.get("/v1/namespaces/team-a/workloads/c/explain").json()
                admitted = client.get("/v1/namespaces/team-a/workloads/a/explain").json()
            metric = scheduler.metrics.registry.get_sample_value
            labels = {"cluster_queue": "cq", "flavor": "h100", "resource": "nvidia.com/gpu"}
            assert metric("qm_admitted_workloads_total", {"cluster_queue": "cq"}) == 2
            pending = {"cluster_queue": "cq", "status": "inadmissible"}
            assert metric("qm_pending_workloads", pending) == 1
            assert metric("qm_cluster_queue_resource_usage", labels) == 16
            assert metric("qm_admission_wait_time_seconds_count", {"cluster_queue": "cq"}) == 2
            # The cycle's own outbox rows (the admitted gangs' dispatches)
            # are relayed within a pass of its commit.
            wait_for(lambda: pending_count(engine) == 0, 5)
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
