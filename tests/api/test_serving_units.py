"""A serving workload admitted replica by replica by the real cycle, over
real Postgres and through the API (issue 22, docs/serving.md): each unit
its own admission in ``status.replicaAdmissions``, its own event and
ledger entry; a scale up admits the new units only; a scale down releases
the highest at once, closing their usage with the GPU-seconds they ran; a
training reclaim never takes the workload below ``minReplicas``."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa

from service.app import lifecycle
from service.app.admission import AdmissionCycle
from service.app.uow import SqlUnitOfWork
from service.domain.times import rfc3339
from service.ledger.accounting import allocations, double_closes, open_usage
from service.ledger.memory import InMemoryLedger
from service.ledger.postgres import PostgresLedgerReader
from service.projections import ProjectionRunner, Resources
from tests.api.conftest import Api
from tests.floor import test_workload_kinds as kinds
from tests.workers.conftest import set_cluster_status

GPU = "nvidia.com/gpu"
PATCH = {"Content-Type": "application/json"}


def _no_guard(uow: SqlUnitOfWork) -> None:
    return None


def _cycle(api: Api, cycle: AdmissionCycle | None = None) -> Any:
    """One admission cycle; ``cycle``: one that ran before (its caches warm,
    as the scheduler's are: the rows it wrote are read from them)."""
    cycle = cycle or AdmissionCycle(api.services.engine, api.services.unit_of_work)
    return cycle.run(_no_guard)


def _queue(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [
                                {"name": "cpu", "nominalQuota": 512},
                                {"name": "memory", "nominalQuota": "4Ti"},
                                {"name": GPU, "nominalQuota": gpus},
                            ],
                        }
                    ],
                }
            ],
            **spec,
        },
    }


def _fleet(api: Api, islands: int) -> None:
    """Flavor h100 and member ``c1``: ``islands`` islands of one 8-GPU node."""
    flavor = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"sku": "h100"}}}
    cluster = {
        "metadata": {"name": "c1"},
        "spec": {"server": "https://c1.example:6443", "credentials": {"token": "t"}},
    }
    for path, body in (("/v1/resourceflavors", flavor), ("/v1/clusters", cluster)):
        assert api.admin.post(path, json=body).status_code == 201
    nodes = [
        {
            "name": f"c1-n{i}",
            "flavor": "h100",
            "island": f"c1-i{i}",
            "labels": {"sku": "h100", "kubernetes.io/hostname": f"c1-n{i}"},
            "allocatable": {"cpu": "96", "memory": "1Ti", GPU: 8},
        }
        for i in range(islands)
    ]
    set_cluster_status(api.services, "c1", {"state": "Ready", "inventory": {"nodes": nodes}})


def _local_queue(api: Api, namespace: str, name: str, cluster_queue: str) -> None:
    body = {"metadata": {"name": name}, "spec": {"clusterQueue": cluster_queue}}
    response = api.admin.post(f"/v1/namespaces/{namespace}/localqueues", json=body)
    assert response.status_code == 201, response.text


def _deployment(name: str, replicas: int, gpus: int, **annotations: str) -> dict[str, Any]:
    manifest = kinds.deployment()
    manifest["metadata"].update(name=name, annotations=dict(annotations))
    manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "serve"
    manifest["spec"]["replicas"] = replicas
    manifest["spec"]["template"] = kinds.pod(gpus=gpus, cpu="4", memory="16Gi")
    return manifest


def _submit(api: Api, manifest: dict[str, Any], namespace: str = "serve") -> None:
    created = api.admin.post(f"/v1/namespaces/{namespace}/workloads", json=manifest)
    assert created.status_code == 201, created.text


def _status(api: Api, name: str, namespace: str = "serve") -> dict[str, Any]:
    got = api.admin.get(f"/v1/namespaces/{namespace}/workloads/{name}")
    assert got.status_code == 200, got.text
    return dict(got.json()["status"])


def _scale(api: Api, name: str, replicas: int) -> dict[str, Any]:
    path = f"/v1/namespaces/serve/workloads/{name}/scale"
    response = api.admin.patch(path, json={"spec": {"replicas": replicas}}, headers=PATCH)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _entries(api: Api, kind: str, workload: str) -> list[dict[str, Any]]:
    with api.services.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT body FROM ledger_entries WHERE kind = :kind "
                "AND body->>'workload' = :workload ORDER BY seq"
            ),
            {"kind": kind, "workload": workload},
        ).scalars()
        return [dict(r) for r in rows]


def _events(api: Api, name: str) -> list[dict[str, Any]]:
    listed = api.admin.get("/v1/events", params={"limit": 1000}).json()["items"]
    return [e for e in listed if e["data"].get("name") == name]


def _replicas(status: dict[str, Any]) -> list[int]:
    return [u["replica"] for u in status.get("replicaAdmissions") or ()]


def _serving_queue(api: Api, gpus: int) -> None:
    """Member c1 (one 8-GPU node), ClusterQueue cq-serve of ``gpus`` GPUs."""
    _fleet(api, islands=1)
    queue = _queue("cq-serve", gpus, workloadClass="inference")
    assert api.admin.post("/v1/clusterqueues", json=queue).status_code == 201
    _local_queue(api, "serve", "serve", "cq-serve")


def test_a_deployment_of_three_replicas_gets_three_unit_admissions(api: Api) -> None:
    _serving_queue(api, 5)
    _submit(api, _deployment("web", 3, gpus=1))
    cycle = AdmissionCycle(api.services.engine, api.services.unit_of_work)
    assert _cycle(api, cycle).writes.admitted == 3
    web = _status(api, "web")
    assert web["state"] == "Admitted"
    assert (_replicas(web), web["admittedReplicas"]) == ([0, 1, 2], 3)
    for unit in web["replicaAdmissions"]:
        assert unit["admission"]["cluster"] == "c1"
        assert unit["admission"]["clusterQueue"] == "cq-serve"
        assert unit["admittedAt"] == unit["admission"]["admittedAt"]
        assert unit["admission"]["id"]
        (assignment,) = unit["admission"]["podSetAssignments"]
        assert (assignment["count"], assignment["resourceUsage"][GPU]) == (1, "1")
    assert "admission" not in web
    assert [e["replica"] for e in _entries(api, "workload.admitted", "web")] == [0, 1, 2]
    # One event for the units admitted in one cycle, naming them.
    admitted = [e for e in _events(api, "web") if e["type"] == "WorkloadAdmitted"]
    assert [e["data"]["replicas"] for e in admitted] == [[0, 1, 2]]
    scale = api.admin.get("/v1/namespaces/serve/workloads/web/scale").json()
    assert scale["status"] == {"replicas": 3}
    # Nothing changed: the next cycle writes nothing, read afresh or from its caches.
    assert _cycle(api, cycle).writes.appends == []
    assert _cycle(api).writes.appends == []


def _web_of_five(api: Api) -> str:
    """web admitted with 3 units, then scaled up to 5: its first three
    units' admissions as JSON, before the scale."""
    _serving_queue(api, 5)
    _submit(api, _deployment("web", 3, gpus=1))
    cycle = AdmissionCycle(api.services.engine, api.services.unit_of_work)
    _cycle(api, cycle)
    first_three = json.dumps(_status(api, "web")["replicaAdmissions"], sort_keys=True)
    _scale(api, "web", 5)
    assert _cycle(api, cycle).writes.admitted == 2
    assert _cycle(api, cycle).writes.appends == []
    return first_three


def test_a_scale_up_admits_the_new_units_and_leaves_the_others_as_they_were(api: Api) -> None:
    first_three = _web_of_five(api)
    web = _status(api, "web")
    assert _replicas(web) == [0, 1, 2, 3, 4]
    assert json.dumps(web["replicaAdmissions"][:3], sort_keys=True) == first_three
    assert [e["replica"] for e in _entries(api, "workload.admitted", "web")] == [0, 1, 2, 3, 4]
    admitted = [e for e in _events(api, "web") if e["type"] == "WorkloadAdmitted"]
    assert [e["data"]["replicas"] for e in admitted] == [[0, 1, 2], [3, 4]]


def test_a_scale_down_releases_the_highest_units_at_once(api: Api) -> None:
    first_three = _web_of_five(api)
    # The queue is full (5 GPUs): another workload of it waits.
    _submit(api, _deployment("other", 2, gpus=1))
    _cycle(api)
    other = _status(api, "other")
    assert other["state"] == "Pending" and not other.get("replicaAdmissions")
    explained = api.admin.get("/v1/namespaces/serve/workloads/other/explain").json()
    assert explained["replicas"]["waiting"] == 2, explained
    assert explained["replicas"]["reason"] == other["pendingReasonCode"], explained

    units = _status(api, "web")["replicaAdmissions"]
    released = {u["replica"]: u for u in units if u["replica"] >= 3}
    assert _scale(api, "web", 3)["status"] == {"replicas": 3}
    web = _status(api, "web")
    assert json.dumps(web["replicaAdmissions"], sort_keys=True) == first_three
    finished = _entries(api, "workload.finished", "web")
    assert [e["replica"] for e in finished] == [4, 3]
    for entry in finished:
        start = datetime.fromisoformat(entry["started_at"])
        end = datetime.fromisoformat(entry["finished_at"])
        admitted_at = released[entry["replica"]]["admittedAt"].replace("Z", "+00:00")
        assert start == datetime.fromisoformat(admitted_at)
        assert entry["gpu_seconds"] == (end - start).total_seconds() * 1  # one GPU each
        assert entry["consumed"]["h100"][GPU] == entry["gpu_seconds"]
    _usage_closed_as_run(api, finished)
    scaled = [e for e in _events(api, "web") if e["type"] in ("WorkloadScaled", "WorkloadFinished")]
    assert [(e["type"], e["data"].get("replicas")) for e in scaled][-2:] == [
        ("WorkloadScaled", None),
        ("WorkloadFinished", [4, 3]),
    ]
    # The quota they held is free at once: the waiting workload is admitted next cycle.
    assert _cycle(api).writes.admitted == 2
    assert _replicas(_status(api, "other")) == [0, 1]
    assert json.dumps(_status(api, "web")["replicaAdmissions"], sort_keys=True) == first_three


def _usage_closed_as_run(api: Api, finished: list[dict[str, Any]]) -> None:
    """The ledger's held usage of each released unit closed at its release,
    over the span its entry's GPU-seconds count; the others still open."""
    ledger = list(PostgresLedgerReader(api.services.engine).entries())
    still = sorted(k for k in open_usage(ledger) if k.startswith("serve/web"))
    assert still == ["serve/web#0", "serve/web#1", "serve/web#2"]
    held = {a.workload: (a, end) for a, end in allocations(ledger)}
    for entry in finished:
        allocation, ended = held[f"serve/web#{entry['replica']}"]
        assert ended is not None
        seconds = (ended - allocation.start_us) / 1e6
        # The status's times are whole seconds, the ledger's are not.
        assert abs(seconds - entry["gpu_seconds"]) < 1.0


def test_a_training_reclaim_never_takes_a_serving_workload_below_min_replicas(api: Api) -> None:
    """serve borrows all of train's 32 GPUs for four 8-GPU replicas of web
    (minReplicas 2); starved training gangs reclaim, through the real cycle,
    two replicas (the newest), never a third."""
    _fleet(api, islands=4)
    assert (
        api.admin.post("/v1/cohorts", json={"metadata": {"name": "fleet"}, "spec": {}}).status_code
        == 201
    )
    train = _queue(
        "train",
        32,
        cohortName="fleet",
        preemption={"withinClusterQueue": "Never", "reclaimWithinCohort": "Any"},
    )
    serve = _queue("serve", 0, cohortName="fleet", workloadClass="inference")
    for body in (train, serve):
        assert api.admin.post("/v1/clusterqueues", json=body).status_code == 201, body
    _local_queue(api, "serve", "serve", "serve")
    _local_queue(api, "team-a", "train", "train")
    _submit(api, _deployment("web", 4, gpus=8, **{"quartermaster.dev/min-replicas": "2"}))
    assert _cycle(api).writes.admitted == 4
    assert _status(api, "web")["admittedReplicas"] == 4
    for i in range(4):
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"t{i}", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
            "spec": {"template": kinds.pod(gpus=8)},
        }
        _submit(api, job, namespace="team-a")
    for _ in range(4):
        _cycle(api)
        assert _status(api, "web")["admittedReplicas"] >= 2
    web = _status(api, "web")
    assert _replicas(web) == [0, 1]
    assert web["state"] == "Admitted"
    preempted = _entries(api, "workload.preempted", "web")
    assert [e["replica"] for e in preempted] == [3, 2]
    assert {e["reason"] for e in preempted} == {"InCohortReclamation"}
    assert all(e["preemptor"].startswith("team-a/t") for e in preempted)
    events = [e for e in _events(api, "web") if e["type"] == "WorkloadPreempted"]
    assert [r for e in events for r in e["data"]["replicas"]] == [3, 2]
    states = [_status(api, f"t{i}", "team-a")["state"] for i in range(4)]
    assert states.count("Admitted") == 2, states
    explained = api.admin.get("/v1/namespaces/serve/workloads/web/explain").json()
    assert explained["state"] == "Admitted"
    replicas = explained["replicas"]
    assert (replicas["asked"], replicas["admitted"], replicas["waiting"]) == (4, 2, 2)
    assert replicas["reason"] == web["pendingReasonCode"] and replicas["waitingFor"], replicas
    # Its waiting units' reason is written once: an unchanged world writes nothing.
    assert all(c["type"] != "QuotaReserved" or c["status"] == "True" for c in web["conditions"])
    assert _cycle(api).writes.appends == []


def test_the_read_models_rebuilt_from_the_log_equal_the_live_ones(api: Api) -> None:
    """Units' events (several on one stream in one cycle, a scale down's
    after its own) replay to the rows the writers left (invariant 5)."""
    _web_of_five(api)
    _submit(api, _deployment("other", 2, gpus=1))
    _cycle(api)
    _scale(api, "web", 2)
    _cycle(api)
    query = sa.text(
        "SELECT kind, namespace, name, resource_version, spec, status FROM resources "
        "WHERE kind = 'Workload' ORDER BY namespace, name"
    )
    with api.services.engine.connect() as conn:
        live = conn.execute(query).all()
    ProjectionRunner(api.services.engine, [Resources()]).rebuild("resources")
    with api.services.engine.connect() as conn:
        assert conn.execute(query).all() == live
    assert [len(r.status["replicaAdmissions"]) for r in live] == [2, 2]


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SUBJECT = lifecycle.Subject("serve", "web", str(uuid4()), "serve")


def _unit_admission(cluster: str) -> dict[str, Any]:
    return {
        "clusterQueue": "cq-serve",
        "cluster": cluster,
        "island": None,
        "podSetAssignments": [
            {
                "name": "main",
                "count": 1,
                "flavors": {GPU: "h100"},
                "resourceUsage": {GPU: "1"},
                "placement": [],
                "islands": [],
            }
        ],
        "borrowed": {},
        "preempted": [],
        "admittedAt": rfc3339(NOW),
    }


def test_every_way_a_unit_stops_holding_closes_it_once() -> None:
    """Six units admitted one by one; each way one stops holding (preempted,
    evicted, scaled down, its cluster lost, its workload cancelled) writes
    one closing entry naming its replica: the ledger's open usage ends empty,
    with no double close, and the units elsewhere stay untouched."""
    status = lifecycle.Status({"state": "Pending"})
    changes: list[lifecycle.Transition] = []

    def step(change: lifecycle.Transition | None) -> lifecycle.Status:
        assert change is not None
        changes.append(change)
        return change.status

    for replica in range(6):
        cluster = "c2" if replica == 2 else "c1"
        status = step(
            lifecycle.admit_unit(
                SUBJECT,
                status,
                replica,
                _unit_admission(cluster),
                borrowed={},
                with_preemption=False,
                now=NOW,
            )
        )
    assert (status.state, status.raw["admittedReplicas"]) == ("Admitted", 6)
    status = step(
        lifecycle.preempt_unit(
            SUBJECT,
            status,
            0,
            reason="InCohortReclamation",
            message="m",
            preemptor="team-a/t",
            preemptor_cluster_queue="train",
            cohort_path=["fleet"],
            now=NOW,
        )
    )
    status = step(
        lifecycle.evict_unit(SUBJECT, status, 1, reason="PodsReadyTimeout", message="m", now=NOW)
    )
    for change in lifecycle.release_replicas(SUBJECT, status, 4, NOW + timedelta(seconds=30)):
        status = step(change)
    assert [u["replica"] for u in status.units] == [2, 3]
    status = step(lifecycle.lose_cluster(SUBJECT, status, "c2", "ClusterLost", "m", NOW))
    assert ([u["replica"] for u in status.units], status.state) == ([3], "Admitted")
    assert lifecycle.lose_cluster(SUBJECT, status, "c2", "ClusterLost", "m", NOW) is None
    status = step(lifecycle.request_cancel(status, "u", NOW))
    status = step(lifecycle.cancelled(SUBJECT, status, NOW + timedelta(seconds=60)))
    assert status.state == "Cancelled"
    book = InMemoryLedger()
    stored = book.append([e for change in changes for e in change.entries])
    closes = [e for e in stored if e.kind != "workload.admitted"]
    assert sorted(e.body["replica"] for e in closes) == [0, 1, 2, 3, 4, 5]
    assert open_usage(stored) == {} and double_closes(stored) == []
    (finished,) = [e for e in closes if e.body["replica"] == 5]
    assert finished.body["gpu_seconds"] == 30.0  # one GPU from its admission to its release


def test_a_serving_workload_is_admitted_while_one_unit_is() -> None:
    status = lifecycle.Status({"state": "Pending", "pendingReason": "w", "pendingReasonCode": "P"})
    for replica in (0, 1):
        status = lifecycle.admit_unit(
            SUBJECT,
            status,
            replica,
            _unit_admission("c1"),
            borrowed={},
            with_preemption=False,
            now=NOW,
        ).status
    assert status.state == "Admitted" and "pendingReason" not in status.raw
    running = lifecycle.Status({**status.raw, "state": "Running"})
    one_left = lifecycle.evict_unit(SUBJECT, running, 1, reason="Stopped", message="m", now=NOW)
    assert (one_left.status.state, one_left.status.raw["admittedReplicas"]) == ("Running", 1)
    none_left = lifecycle.evict_unit(
        SUBJECT, one_left.status, 0, reason="Stopped", message="m", now=NOW
    )
    assert none_left.status.state == "Pending"
    assert none_left.status.raw["replicaAdmissions"] == []
    reserved = [c for c in none_left.status.conditions if c["type"] == "QuotaReserved"]
    assert [c["status"] for c in reserved] == ["False"]
    assert none_left.entry is not None and none_left.entry.body["replica"] == 0


def _invariants(api: Api, names: tuple[str, ...], quota: int) -> None:
    """Units at most once each, below spec.replicas, within quota; the
    ledger's open usage is exactly the units the rows hold, never closed twice."""
    held: set[str] = set()
    gpus = 0
    for name in names:
        obj = api.admin.get(f"/v1/namespaces/serve/workloads/{name}").json()
        status, asked = obj["status"], obj["spec"].get("replicas", 1)
        replicas = _replicas(status)
        assert replicas == sorted(set(replicas)) and all(r < asked for r in replicas), obj
        assert status.get("admittedReplicas", 0) == len(replicas)
        assert status["state"] == ("Admitted" if replicas else "Pending"), status
        held |= {f"serve/{name}#{r}" for r in replicas}
        gpus += len(replicas)  # one GPU each
    assert gpus <= quota
    ledger = list(PostgresLedgerReader(api.services.engine).entries())
    assert set(open_usage(ledger)) == held
    assert double_closes(ledger) == []


@pytest.mark.parametrize("seed", [3, 11])
def test_scales_and_cycles_in_any_order_keep_units_and_ledger_in_step(api: Api, seed: int) -> None:
    rng = random.Random(seed)
    _serving_queue(api, 5)
    _submit(api, _deployment("web", 3, gpus=1))
    _submit(api, _deployment("other", 2, gpus=1))
    cycle = AdmissionCycle(api.services.engine, api.services.unit_of_work)
    for _ in range(12):
        if rng.random() < 0.5:
            _cycle(api, cycle)
        else:
            _scale(api, rng.choice(["web", "other"]), rng.randint(1, 6))
        _invariants(api, ("web", "other"), 5)
    _cycle(api, cycle)
    _invariants(api, ("web", "other"), 5)
    # The run went through scale downs that released units, and admissions after them.
    kinds = [e.kind for e in PostgresLedgerReader(api.services.engine).entries()]
    assert "workload.finished" in kinds, kinds
    assert "workload.admitted" in kinds[kinds.index("workload.finished") :], kinds


def test_a_leaderworkerset_is_admitted_group_by_group_each_in_one_island(api: Api) -> None:
    """LWS's vLLM example: two groups of a leader and a worker (8 GPUs
    each), a unit per group, its pod sets in one fabric island."""
    topology = {
        "metadata": {"name": "fabric"},
        "spec": {"levels": [{"nodeLabel": kinds.ISLAND}, {"nodeLabel": "kubernetes.io/hostname"}]},
    }
    flavor = {
        "metadata": {"name": "h100"},
        "spec": {"nodeLabels": {"sku": "h100"}, "topologyName": "fabric"},
    }
    cluster = {
        "metadata": {"name": "c1"},
        "spec": {"server": "https://c1.example:6443", "credentials": {"token": "t"}},
    }
    queue = _queue("cq-serve", 32, workloadClass="inference")
    for path, body in (
        ("/v1/topologies", topology),
        ("/v1/resourceflavors", flavor),
        ("/v1/clusters", cluster),
        ("/v1/clusterqueues", queue),
    ):
        assert api.admin.post(path, json=body).status_code == 201, path
    _local_queue(api, "serve", "serve", "cq-serve")
    nodes = [
        {
            "name": f"c1-i{i}-n{n}",
            "flavor": "h100",
            "island": f"c1-i{i}",
            "labels": {
                "sku": "h100",
                kinds.ISLAND: f"c1-i{i}",
                "kubernetes.io/hostname": f"c1-i{i}-n{n}",
            },
            "allocatable": {"cpu": "96", "memory": "1Ti", GPU: 8},
        }
        for i in range(2)
        for n in range(2)
    ]
    set_cluster_status(api.services, "c1", {"state": "Ready", "inventory": {"nodes": nodes}})
    lws = kinds.vllm_lws()
    lws["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "serve"
    _submit(api, lws)
    assert _cycle(api).writes.admitted == 2
    vllm = _status(api, "vllm")
    assert _replicas(vllm) == [0, 1]
    for unit in vllm["replicaAdmissions"]:
        assignments = unit["admission"]["podSetAssignments"]
        assert [(a["name"], a["count"]) for a in assignments] == [("leader", 1), ("worker", 1)]
        (island,) = {i for a in assignments for i in a["islands"]}
        assert unit["admission"]["island"] == island
    assert [e["replica"] for e in _entries(api, "workload.admitted", "vllm")] == [0, 1]


def test_a_cluster_holding_a_serving_replica_is_not_deleted(api: Api) -> None:
    """A serving workload's replicas name their cluster in replicaAdmissions,
    not in status.admission: the Cluster is still in use while one is there."""
    _serving_queue(api, 5)
    _submit(api, _deployment("web", 1, gpus=1))
    assert _cycle(api).writes.admitted == 1
    refused = api.admin.delete("/v1/clusters/c1")
    assert refused.status_code == 409, refused.text
    assert "serve/web" in refused.json()["detail"]
    # Cancelled, its replica is still there until the member has removed it.
    cancel = api.admin.post("/v1/namespaces/serve/workloads/web/cancel")
    assert cancel.status_code == 200, cancel.text
    assert _status(api, "web")["state"] == "Cancelling"
    assert api.admin.delete("/v1/clusters/c1").status_code == 409
