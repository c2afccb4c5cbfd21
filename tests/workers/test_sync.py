"""Sync and cluster loss against stand-in member clusters; the
``reconcile.cluster`` consumer in a real Celery worker."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import sqlalchemy as sa

from service.app.admission import AdmissionCycle
from service.app.bootstrap import Services
from tests.workers.conftest import ADMIN, celery_worker, wait_for, workload_status
from tests.workers.members import (
    gang,
    job,
    jobs,
    ledger,
    members,
    scheduling,
    settings,
    setup_central,
)
from workers.fleet import Connector, sync_once
from workers.outbox import Send
from workers.scheduler import Scheduler
from workers.settings import WorkerSettings


def _stray_job() -> dict[str, Any]:
    """A job with our label that no workload wants (left by a crash, say)."""
    template = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        }
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "stray",
            "labels": {"quartermaster.dev/managed": "true"},
            "annotations": {"quartermaster.dev/workload": "team-a/gone"},
        },
        "spec": {"parallelism": 1, "completions": 1, "template": template},
    }


def _cluster(services: Services, name: str) -> dict[str, Any]:
    return services.resources.get(ADMIN.principal, "clusters", "", name)


def test_a_partitioned_cluster_past_its_lease_is_lost_its_gangs_run_elsewhere_and_heal_removes_them(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path, ("c1", "c2")) as clusters:
        by_name = {c.name: c for c in clusters}
        setup_central(services, clusters, gpu_quota=32)
        config = settings(database_url, broker, cluster_lease=2.0)
        with scheduling(engine, config, send):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            first = workload_status(engine, "team-a", "a")["admission"]["cluster"]
            other = "c2" if first == "c1" else "c1"
            wait_for(lambda: _cluster(services, other)["status"].get("inventory"), 60)
            by_name[first].partition()
            wait_for(lambda: _cluster(services, first)["status"]["state"] == "Lost", 60)
            wait_for(
                lambda: (
                    (workload_status(engine, "team-a", "a").get("admission") or {}).get("cluster")
                    == other
                ),
                60,
            )
            wait_for(lambda: job(by_name[other], "a"), 60)
            assert job(by_name[first], "a") is not None  # unreachable: still there
            by_name[first].heal()
            wait_for(lambda: _cluster(services, first)["status"]["state"] == "Ready", 60)
            wait_for(lambda: job(by_name[first], "a") is None, 60)
            assert job(by_name[other], "a") is not None
            assert workload_status(engine, "team-a", "a")["admission"]["cluster"] == other
            assert not [j for j in jobs(by_name[first])]
    (lost,) = ledger(engine, "cluster.lost")
    assert lost["cluster"] == first and lost["requeued"] == ["team-a/a"]
    assert [r["cluster"] for r in ledger(engine, "cluster.returned")] == [first]
    assert [e["reason"] for e in ledger(engine, "workload.evicted")] == ["ClusterLost"]
    assert [a["cluster"] for a in ledger(engine, "workload.admitted")] == [first, other]
    assert ledger(engine, "workload.finished") == []


def test_a_gang_admitted_as_its_cluster_is_lost_is_requeued_and_never_awaited(
    engine: sa.Engine, services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    """The loss commits between an admission cycle's read and its commit:
    the loss read the gang Pending and requeued nothing, the cycle then
    admitted it to the Lost cluster. The next pass over the silent cluster
    requeues it, as the loss requeued the rest."""
    config = settings(database_url, broker, cluster_lease=2.0)
    t0 = datetime.now(UTC)
    late = t0 + timedelta(seconds=10)
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=32)
        connect = Connector(config)
        try:
            assert sync_once(engine, "c1", connect, config, lambda: t0).heartbeat
            c1.partition()
            services.submissions.submit(ADMIN, "team-a", gang("race", duration="100000s"))
            cycle = AdmissionCycle(engine, services.unit_of_work)
            cycle.run(lambda uow: sync_once(engine, "c1", connect, config, lambda: late))
            assert _cluster(services, "c1")["status"]["state"] == "Lost"
            status = workload_status(engine, "team-a", "race")
            assert (status["state"], status["admission"]["cluster"]) == ("Admitted", "c1")
            sync_once(engine, "c1", connect, config, lambda: late + timedelta(seconds=1))
        finally:
            connect.close()
            c1.heal()
    status = workload_status(engine, "team-a", "race")
    assert status["state"] == "Pending" and "admission" not in status, status
    (lost,) = ledger(engine, "cluster.lost")
    assert lost["requeued"] == []
    (released,) = ledger(engine, "workload.evicted")
    assert (released["workload"], released["reason"], released["requeued"]) == (
        "race",
        "ClusterLost",
        True,
    )


def test_dispatch_through_the_outbox_and_a_celery_worker_progress_through_watches(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """The fleet loop's periodic resync is set long: after its first pass
    (the inventory), only the cycle's reconcile message (through a Celery
    worker) can put the job on the member, and only watch events can have
    the centre see it run, finish and be collected."""
    with members(tmp_path) as (c1,), celery_worker(database_url, broker):
        setup_central(services, [c1], gpu_quota=16)
        config = settings(database_url, broker, resync_interval=60.0)
        with scheduling(engine, config, send, relay=True) as scheduler:
            assert scheduler.fleet is not None
            fleet = scheduler.fleet
            wait_for(lambda: fleet.passes >= 1, 60)
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100s"))
            wait_for(lambda: job(c1, "a"), 60)
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Finished", 60)
            wait_for(lambda: job(c1, "a") is None, 60)
            assert fleet.passes == 1 and fleet.woken >= 1
            streams = fleet.watches["c1"][1].streams
            assert all(s.version for s in streams)
    with engine.connect() as conn:
        done = conn.exec_driver_sql(
            "SELECT count(*) FROM processed_messages "
            "WHERE consumer = 'reconcile.cluster' AND outcome = 'done'"
        ).scalar_one()
    assert done >= 1


def test_stray_objects_are_collected_and_a_cancelled_gang_is_removed(
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
            managed = {"quartermaster.dev/managed": "true"}
            with c1.api_client() as api:
                custom = kubernetes.client.CustomObjectsApi(api)
                custom.create_namespaced_custom_object(
                    "kueue.x-k8s.io",
                    "v1beta2",
                    "team-a",
                    "localqueues",
                    {
                        "apiVersion": "kueue.x-k8s.io/v1beta2",
                        "kind": "LocalQueue",
                        "metadata": {"name": "qm-stray", "labels": managed},
                        "spec": {"clusterQueue": "qm-cq"},
                    },
                )
                kubernetes.client.BatchV1Api(api).create_namespaced_job("team-a", _stray_job())
            wait_for(lambda: job(c1, "stray") is None, 60)
            wait_for(
                lambda: (
                    c1.get("kueue.x-k8s.io/v1beta2", "LocalQueue", "team-a", "qm-stray") is None
                ),
                60,
            )
            assert job(c1, "a") is not None
            services.submissions.cancel(ADMIN, "team-a", "a")
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Cancelled", 60)
            assert job(c1, "a") is None


def _foreign_pod(node: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod holding a node's GPUs."""
    return {
        "metadata": {
            "name": f"squatter-{node}",
            "labels": labels or {},
            "annotations": {"quartermaster.dev/sim-duration": "100000s"},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [
                {"name": "m", "image": "i", "resources": {"requests": {"nvidia.com/gpu": "8"}}}
            ],
        },
    }


def test_a_gang_not_ready_within_its_timeout_is_evicted_whole_and_requeued(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """Pods the centre counts as gone (left over from an earlier admission of
    ours, say) hold a node in each island: the gang is admitted, dispatched,
    and never fully runs."""
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        with c1.api_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            for node in ("c1-h100-i0-n0", "c1-h100-i1-n0"):
                leftover = {"quartermaster.dev/admission": "0123456789abcdef"}
                core.create_namespaced_pod("default", _foreign_pod(node, leftover))
        config = settings(database_url, broker, pods_ready_timeout=1.5)
        with scheduling(engine, config, send):
            services.submissions.submit(ADMIN, "team-a", gang("a"))
            wait_for(lambda: ledger(engine, "workload.evicted"), 60)
            wait_for(
                lambda: (workload_status(engine, "team-a", "a").get("requeueState") or {}).get(
                    "count"
                ),
                60,
            )
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] != "Evicted", 60)
    (evicted, *_) = ledger(engine, "workload.evicted")
    assert evicted["reason"] == "PodsReadyTimeout" and evicted["requeued"]
    assert ledger(engine, "workload.finished") == []


def test_pods_we_do_not_manage_are_reserved_in_the_inventory(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=32)
        with c1.api_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            for node in ("c1-h100-i0-n0", "c1-h100-i1-n0"):
                core.create_namespaced_pod("default", _foreign_pod(node))
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("two-nodes"))
            services.submissions.submit(ADMIN, "team-a", gang("one-node", count=1))
            wait_for(lambda: job(c1, "one-node"), 60)
            wait_for(
                lambda: workload_status(engine, "team-a", "two-nodes").get("pendingReason"), 60
            )
            nodes = _cluster(services, "c1")["status"]["inventory"]["nodes"]
            assert workload_status(engine, "team-a", "two-nodes")["state"] == "Pending"
    reserved = {n["name"]: n["reserved"] for n in nodes}
    assert reserved["c1-h100-i0-n0"] == {"nvidia.com/gpu": "8"}
    assert reserved["c1-h100-i0-n1"] == {}


def test_a_gang_the_member_evicts_releases_its_quota_and_is_requeued(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """A member operator deactivates the running gang's Kueue Workload: the
    member evicts it, and the centre hears it as an eviction."""
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            with c1.api_client() as api:
                custom = kubernetes.client.CustomObjectsApi(api)
                (member,) = custom.list_namespaced_custom_object(
                    "kueue.x-k8s.io", "v1beta2", "team-a", "workloads"
                )["items"]
                custom.patch_namespaced_custom_object(
                    "kueue.x-k8s.io",
                    "v1beta2",
                    "team-a",
                    "workloads",
                    member["metadata"]["name"],
                    {"spec": {"active": False}},
                    _content_type="application/merge-patch+json",
                )
            wait_for(lambda: ledger(engine, "workload.evicted"), 60)
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] != "Evicted", 60)
    (evicted, *_) = ledger(engine, "workload.evicted")
    assert evicted["reason"] == "Deactivated" and evicted["cluster"] == "c1"
    assert evicted["released"]["h100"]["nvidia.com/gpu"] == 16


def _pool_processes(main: int) -> list[int]:
    children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
    return [int(pid) for pid in children]


def test_a_worker_killed_in_the_middle_of_a_reconcile_leaves_one_job(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """The member answers applies slowly; the pool process is killed while
    it waits for one. The message comes again (reject on worker lost), the
    next delivery finishes the job: one job, dispatched once. The scheduler
    runs no fleet loop (which would otherwise take the pass over: one pass
    per cluster at a time); the test syncs by hand."""
    with members(tmp_path) as (c1,), celery_worker(database_url, broker) as worker:
        setup_central(services, [c1], gpu_quota=16)
        config = settings(database_url, broker)
        connect = Connector(config)
        scheduler = Scheduler(engine, config, send, holder="test", fleet=False)
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        try:
            assert sync_once(engine, "c1", connect, config, _now).heartbeat
            c1.set_faults(latencyMs=3000, verbs=["patch"])
            services.submissions.submit(ADMIN, "team-a", gang("a"))
            wait_for(lambda: _deliveries(engine) == 1, 60)
            time.sleep(0.5)  # inside the reconcile, waiting for the member
            (pool,) = _pool_processes(worker.pid)
            os.kill(pool, signal.SIGKILL)
            c1.clear_faults()
            wait_for(lambda: job(c1, "a"), 60)
            wait_for(lambda: _synced_state(engine, connect, config) == "Finished", 60)
        finally:
            scheduler.stop.set()
            thread.join(15)
            connect.close()
    assert _deliveries(engine) == 2
    assert [f["workload"] for f in ledger(engine, "workload.finished")] == ["a"]


def _now() -> datetime:
    return datetime.now(UTC)


def _synced_state(engine: sa.Engine, connect: Connector, config: WorkerSettings) -> str:
    sync_once(engine, "c1", connect, config, _now)
    return str(workload_status(engine, "team-a", "a")["state"])


def _deliveries(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        count = conn.exec_driver_sql(
            "SELECT coalesce(sum(deliveries), 0) FROM processed_messages "
            "WHERE consumer = 'reconcile.cluster'"
        ).scalar_one()
    return int(count)
