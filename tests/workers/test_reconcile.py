"""Reconcile and sync against stand-in member clusters over HTTPS through the
official client: real Postgres, the admission leader and the fleet loop in
process (the consumer path is tested with a Celery worker in test_sync.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from service.app.admission import AdmissionCycle
from service.app.bootstrap import Services
from sim.kubesim.testing import running_clusters
from tests.workers.conftest import ADMIN, GPU, wait_for, workload_status
from tests.workers.kueue_rules import problems
from tests.workers.members import (
    ISLAND,
    gang,
    job,
    jobs,
    ledger,
    members,
    scheduling,
    settings,
    setup_central,
    watch_jobs,
)
from workers.clusters import Member, MemberError, RateLimiter
from workers.fleet import Connector, reconcile_once, sync_once
from workers.outbox import Send
from workers.plan import ADMISSION_LABEL, JOB_KINDS, MANAGED_LABEL
from workers.records import ClusterRow, clusters
from workers.settings import WorkerSettings


def test_admitted_gang_runs_pinned_to_its_island_finishes_and_is_collected(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        with scheduling(engine, settings(database_url, broker), send) as scheduler:
            # the first sync writes c1's inventory; only then can anything be admitted
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="300s"))
            services.submissions.submit(ADMIN, "team-a", gang("b", duration="300s"))
            created = wait_for(lambda: job(c1, "a"), 60)
            status = workload_status(engine, "team-a", "a")
            assert status["state"] in ("Admitted", "Running")
            island = status["admission"]["island"]
            template = created["spec"]["template"]
            assert template["spec"]["nodeSelector"][ISLAND] == island
            assert created["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "qm-train"
            assert created["metadata"]["labels"]["quartermaster.dev/managed"] == "true"
            assert workload_status(engine, "team-a", "b")["state"] == "Pending"  # no quota
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Finished", 60)
            # quota released: b is admitted, runs on c1, and a's job is collected
            wait_for(lambda: job(c1, "b"), 60)
            wait_for(lambda: job(c1, "a") is None, 60)
            wait_for(lambda: workload_status(engine, "team-a", "b")["state"] == "Finished", 60)
            wait_for(lambda: not jobs(c1), 60)
            wait_for(
                lambda: c1.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", "", "qm-cq") is None, 60
            )
            metric = scheduler.metrics.registry.get_sample_value
            assert metric("qm_reconcile_lag_seconds_count", {"cluster": "c1"}) == 2
            assert metric("qm_member_cluster_ready", {"cluster": "c1"}) == 1
    finished = ledger(engine, "workload.finished")
    assert [f["workload"] for f in finished] == ["a", "b"]
    assert finished[0]["outcome"] == "succeeded"
    assert finished[0]["cluster"] == "c1"
    assert finished[0]["gpu_seconds"] >= 0
    cluster = services.resources.get(ADMIN.principal, "clusters", "", "c1")
    assert cluster["status"]["state"] == "Ready"
    nodes = cluster["status"]["inventory"]["nodes"]
    assert len(nodes) == 4 and {n["flavor"] for n in nodes} == {"h100"}


def test_preemption_deletes_the_victims_job_before_the_preemptor_is_dispatched(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path) as (c1,):
        setup_central(
            services, [c1], gpu_quota=16, preemption={"withinClusterQueue": "LowerPriority"}
        )
        services.resources.create(
            ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000}
        )
        stop = threading.Event()
        samples = watch_jobs(c1, stop)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("low", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "low")["state"] == "Running", 60)
            services.submissions.submit(
                ADMIN, "team-a", gang("high", duration="100000s", priorityClassName="urgent")
            )
            wait_for(lambda: workload_status(engine, "team-a", "high")["state"] == "Running", 60)
            wait_for(lambda: workload_status(engine, "team-a", "low")["state"] == "Pending", 60)
            stop.set()
            assert job(c1, "low") is None
            high = job(c1, "high")
            assert high is not None
            assert high["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "qm-p1000"
            wpc = c1.get("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "", "qm-p1000")
            assert wpc is not None and wpc["value"] == 1000
    seen = samples()
    assert any("low" in s for s in seen) and any("high" in s for s in seen)
    assert not any({"low", "high"} <= s for s in seen), "victim and preemptor ran together"
    low = workload_status(engine, "team-a", "low")
    assert "admission" not in low and low["queuedAt"]
    assert [p["workload"] for p in ledger(engine, "workload.preempted")] == ["low"]


def test_a_gang_of_two_pod_sets_runs_as_a_jobset_and_finishes(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    body = gang("js", count=1, duration="100s")
    driver = dict(body["spec"]["podSets"][0], name="driver")
    body["spec"]["podSets"].append(dict(driver, name="workers", count=2))
    body["spec"]["podSets"][0] = driver
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=32)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", body)
            created = wait_for(
                lambda: c1.get("jobset.x-k8s.io/v1alpha2", "JobSet", "team-a", "js"), 60
            )
            wait_for(lambda: workload_status(engine, "team-a", "js")["state"] == "Finished", 60)
    names = [r["name"] for r in created["spec"]["replicatedJobs"]]
    assert names == ["driver", "workers"]
    (finished,) = ledger(engine, "workload.finished")
    assert finished["workload"] == "js" and finished["outcome"] == "succeeded"
    conditions = workload_status(engine, "team-a", "js")["conditions"]
    (done,) = [c for c in conditions if c["type"] == "Finished"]
    assert done["message"] == "JobSet succeeded on cluster c1"  # what ran, not "Job"


def test_a_converged_cluster_is_left_alone(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """Once a gang runs, a pass writes nothing to the member (what it holds
    already contains what we would apply) and nothing centrally."""
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        config = settings(database_url, broker)
        with scheduling(engine, config, send):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
        connect = Connector(config)
        try:
            report = reconcile_once(engine, "c1", connect, config, lambda: datetime.now(UTC))
        finally:
            connect.close()
    assert report.skipped is None
    assert (report.applied, report.dispatched, report.deleted, report.collected) == ([],) * 4


def _wakes(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT count(*) FROM outbox WHERE topic = 'admission.wake'"
            ).scalar_one()
        )


class _RefusingJobs(Connector):
    """The real connector, whose members refuse every job as invalid (a
    hand-written fake of one answer; everything else goes to the stand-in)."""

    def __call__(self, row: ClusterRow) -> Member:
        member = super().__call__(row)

        def apply(obj: Mapping[str, Any], real: Any = member.apply) -> None:
            if obj["kind"] in JOB_KINDS:
                raise MemberError("c1: apply: 422 Unprocessable Entity", 422, "spec: Invalid")
            real(obj)

        member.apply = apply  # type: ignore[method-assign]
        return member


def test_a_job_the_member_refuses_evicts_and_deactivates_its_gang(
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
        connect = _RefusingJobs(config)
        try:
            assert sync_once(engine, "c1", connect, config, now).heartbeat
            services.submissions.submit(ADMIN, "team-a", gang("a"))
            AdmissionCycle(engine, services.unit_of_work).run(lambda uow: None)
            assert workload_status(engine, "team-a", "a")["state"] == "Admitted"
            wakes = _wakes(engine)
            report = reconcile_once(engine, "c1", connect, config, now)
            assert _wakes(engine) == wakes + 1  # its quota is free: the cycle runs again
            again = reconcile_once(engine, "c1", connect, config, now)
        finally:
            connect.close()
    assert list(report.refused) == ["team-a/a"] and not report.dispatched
    assert not again.refused and not again.requeued
    status = workload_status(engine, "team-a", "a")
    assert status["state"] == "Evicted" and status["eviction"]["reason"] == "DispatchFailed"
    (evicted,) = ledger(engine, "workload.evicted")
    assert evicted["requeued"] is False and evicted["released"]["h100"]["nvidia.com/gpu"] == 16


def test_a_submitted_pytorchjob_runs_on_its_member_as_a_pytorchjob(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    pod = gang("x", count=1, duration="100s")["spec"]["podSets"][0]["template"]
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": pod},
                "Worker": {"replicas": 1, "template": pod},
            }
        },
    }
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=32)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", manifest)
            created = wait_for(lambda: c1.get("kubeflow.org/v1", "PyTorchJob", "team-a", "pt"), 60)
            wait_for(lambda: workload_status(engine, "team-a", "pt")["state"] == "Finished", 60)
    admission = workload_status(engine, "team-a", "pt")["admission"]
    islands = {p["name"]: p["islands"] for p in admission["podSetAssignments"]}
    for replica_type, replica in created["spec"]["pytorchReplicaSpecs"].items():
        selector = replica["template"]["spec"]["nodeSelector"]
        assert [selector[ISLAND]] == islands[replica_type.lower()]
    assert [f["workload"] for f in ledger(engine, "workload.finished")] == ["pt"]


MIXED_FLEET = """
topologies:
  - name: fabric
    levels:
      - nodeLabel: example.com/fabric-block
      - nodeLabel: kubernetes.io/hostname
resourceFlavors:
  - name: h100
    nodeLabels: {example.com/gpu: h100}
    topologyName: fabric
clusters:
  - name: c1
    nodeGroups:
      - flavor: h100
        islands: 2
        nodesPerIsland: 2
        labels: {example.com/cpu: sapphire}
        allocatable: {cpu: 96, memory: 1Ti, nvidia.com/gpu: 8}
"""


def _quota(flavor: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": flavor,
        "resources": [{"name": r, "nominalQuota": q} for r, q in resources.items()],
    }


def test_a_mixed_flavor_admission_runs_on_its_member(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """cpu and memory from flavor ``sapphire`` (one central resource group),
    GPUs from ``h100`` (another), both on one island: the member's
    ClusterQueue has the same two groups, so its Kueue admits the gang as the
    centre did (one group of both, as before, admitted nothing)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(MIXED_FLEET)
    create = services.resources.create
    with running_clusters(fleet, ("c1",), time_scale=0.01, bookmark_interval=0.5) as (c1,):
        setup_central(services, [c1])  # topology, h100, cq, train, Cluster c1
        create(
            ADMIN,
            "resourceflavors",
            "",
            {
                "metadata": {"name": "sapphire"},
                "spec": {"nodeLabels": {"example.com/cpu": "sapphire"}, "topologyName": "fabric"},
            },
        )
        queue = services.resources.get(ADMIN.principal, "clusterqueues", "", "cq")
        queue["spec"]["resourceGroups"] = [
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [_quota("sapphire", {"cpu": 1024, "memory": "8Ti"})],
            },
            {"coveredResources": [GPU], "flavors": [_quota("h100", {GPU: 32})]},
        ]
        services.resources.replace(ADMIN, "clusterqueues", "", "cq", queue, None)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("m", duration="100000s"))
            # Running: the member's Kueue admitted it and its pods are ready
            wait_for(lambda: workload_status(engine, "team-a", "m")["state"] == "Running", 60)
            member_queue = c1.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", "", "qm-cq")
            member_job = job(c1, "m")
    admission = workload_status(engine, "team-a", "m")["admission"]
    (assignment,) = admission["podSetAssignments"]
    assert assignment["flavors"] == {"cpu": "sapphire", "memory": "sapphire", GPU: "h100"}
    island = admission["island"]
    assert member_queue is not None
    groups = member_queue["spec"]["resourceGroups"]
    assert [(g["coveredResources"], [f["name"] for f in g["flavors"]]) for g in groups] == [
        (["cpu", "memory"], [f"qm-sapphire-{island}"]),
        ([GPU], [f"qm-h100-{island}"]),
    ]
    assert problems({k: member_queue[k] for k in ("apiVersion", "kind", "metadata", "spec")}) == []
    assert member_job is not None and not member_job["spec"].get("suspend")
    selector = member_job["spec"]["template"]["spec"]["nodeSelector"]
    assert selector[ISLAND] == island and selector["example.com/cpu"] == "sapphire"


def test_member_requests_are_held_to_qm_member_qps_and_burst(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set deliberately, not client-go's 5 QPS (kueue#8564): the connector
    builds each member's client with QM_MEMBER_QPS / QM_MEMBER_BURST, and a
    member is never asked faster than that."""
    assert WorkerSettings().member_qps >= 50  # the default, well above client-go's 5
    monkeypatch.setenv("QM_MEMBER_QPS", "20")
    monkeypatch.setenv("QM_MEMBER_BURST", "5")
    config = WorkerSettings(database_url=database_url, broker_url=broker)
    assert (config.member_qps, config.member_burst) == (20, 5)
    with members(tmp_path) as (c1,):
        setup_central(services, [c1])
        connect = Connector(config)
        try:
            with engine.connect() as conn:
                (row,) = clusters(conn, "c1")
            member = connect(row)
            started = time.monotonic()
            for _ in range(25):
                assert len(member.nodes()) == 4
            elapsed = time.monotonic() - started
        finally:
            connect.close()
    # 5 at once, then 20 at 20 a second: never under a second
    assert elapsed >= (25 - 5) / 20 - 0.05, elapsed


def test_the_rate_limiter_bursts_then_paces() -> None:
    # Paced, five tokens would take a second: the burst's bound is half that,
    # far above what five calls take on a busy machine.
    limiter = RateLimiter(qps=5, burst=5)
    started = time.monotonic()
    for _ in range(5):
        limiter.acquire()
    burst = time.monotonic() - started
    for _ in range(5):
        limiter.acquire()
    paced = time.monotonic() - started - burst
    assert burst < 0.5, burst
    assert 5 / 5 - 0.05 <= paced < 5 / 5 + 2.0, paced


def _stray_jobset() -> dict[str, Any]:
    pod = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
    job_spec = {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": pod}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "stray",
            "namespace": "team-a",
            "labels": {MANAGED_LABEL: "true", ADMISSION_LABEL: "gone"},
        },
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job_spec}}]},
    }


def test_an_admission_pass_lists_the_kinds_in_use_and_a_fleet_pass_collects_strays(
    engine: sa.Engine, services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    """A pass asked for by an admission cycle (``strays=False``) lists only
    the job kinds the centre's gangs there use: a JobSet nothing wants is
    left to the fleet loop's pass, which lists every kind and removes it."""
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        config = settings(database_url, broker)
        connect = Connector(config)
        try:
            with engine.connect() as conn:
                (row,) = clusters(conn, "c1")
            member = connect(row)
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
            member.apply(namespace)
            member.apply(_stray_jobset())
            now = lambda: datetime.now(UTC)  # noqa: E731
            narrow = reconcile_once(engine, "c1", connect, config, now, strays=False)
            assert narrow.deleted == []
            assert c1.get("jobset.x-k8s.io/v1alpha2", "JobSet", "team-a", "stray") is not None
            full = reconcile_once(engine, "c1", connect, config, now)
            assert full.deleted == ["JobSet team-a/stray"]
        finally:
            connect.close()
