"""Every kind a GPU team submits, through the API over real Postgres (issue
22): each accepted at ``POST /v1/namespaces/{ns}/workloads`` with its pod
sets, replicas and class; a broken one refused as problem+json naming the
field; a serving kind to a training queue refused; a serving workload run
replica by replica judged by the engine unit by unit (docs/serving.md);
and a kind the workers cannot apply to members yet held pending by the
admission cycle with a reason naming it, never admitted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service.app.admission import AdmissionCycle
from service.app.uow import SqlUnitOfWork
from service.domain.jobs import MEMBER_JOB_KINDS, runs_as_units
from tests.api.conftest import Api, setup_quota
from tests.api.test_resources import _fields, _problem
from tests.floor import test_workload_kinds as kinds

Manifest = dict[str, Any]
#: Kind → (namespace whose queue serves its class, the manifest).
SUBMITTED: dict[str, tuple[str, Callable[[], Manifest]]] = {
    "LeaderWorkerSet": ("serve", kinds.vllm_lws),
    "RayJob": ("team-a", kinds.rayjob),
    "RayCluster": ("team-a", kinds.raycluster),
    "Deployment": ("serve", kinds.deployment),
    "StatefulSet": ("serve", kinds.gang_statefulset),
}


def _queues(api: Api) -> None:
    """``train`` in team-a (training) and in serve (inference), as the engine
    needs them: one flavor, quota for every resource asked."""
    setup_quota(api.admin)
    setup_quota(api.admin, "serve", "cq-serve", workloadClass="inference")


def _queued(manifest: Manifest) -> Manifest:
    manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "train"
    return manifest


def _no_guard(uow: SqlUnitOfWork) -> None:
    return None


@pytest.mark.parametrize("kind", list(SUBMITTED))
def test_each_kind_is_accepted_and_waits_until_members_can_run_it(api: Api, kind: str) -> None:
    """Held with ``KindNotRunnable`` while the workers cannot apply the kind; once they
    can (``MEMBER_JOB_KINDS``), judged by the engine like any gang, as is each
    unit of a serving workload run replica by replica (a gang StatefulSet is held)."""
    _queues(api)
    namespace, manifest = SUBMITTED[kind]
    sent = _queued(manifest())
    created = api.admin.post(f"/v1/namespaces/{namespace}/workloads", json=sent)
    assert created.status_code == 201, created.text
    name = sent["metadata"]["name"]
    spec = created.json()["spec"]
    want = next(c for c in kinds.CASES.values() if c.manifest is manifest)
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [
        (w.name, w.count) for w in want.pod_sets
    ]
    assert spec.get("replicas") == want.replicas
    assert spec["workloadClass"] == want.workload_class
    assert spec["job"]["kind"] == kind
    AdmissionCycle(api.services.engine, api.services.unit_of_work).run(_no_guard)
    status = api.admin.get(f"/v1/namespaces/{namespace}/workloads/{name}").json()["status"]
    assert status["state"] == "Pending"
    assert "admission" not in status  # no member cluster here
    if kind in MEMBER_JOB_KINDS or runs_as_units(spec):
        assert status["pendingReasonCode"] not in (None, "KindNotRunnable")
        assert not status.get("replicaAdmissions")  # no member cluster here
        return
    assert status["pendingReasonCode"] == "KindNotRunnable"
    assert kind in status["pendingReason"]
    explained = api.admin.get(f"/v1/namespaces/{namespace}/workloads/{name}/explain")
    assert explained.status_code == 200, explained.text
    assert kind in str(explained.json()), explained.json()


def test_a_runnable_kind_beside_them_is_still_admitted_as_before(api: Api) -> None:
    """Held kinds leave the snapshot; the cycle goes on with the rest."""
    _queues(api)
    held = api.admin.post("/v1/namespaces/serve/workloads", json=_queued(kinds.gang_statefulset()))
    assert held.status_code == 201, held.text
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "plain", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {"template": kinds.pod(gpus=1)},
    }
    assert api.admin.post("/v1/namespaces/team-a/workloads", json=job).status_code == 201
    AdmissionCycle(api.services.engine, api.services.unit_of_work).run(_no_guard)
    status = api.admin.get("/v1/namespaces/team-a/workloads/plain").json()["status"]
    # No member cluster here: the engine judged it, and gave its own reason.
    assert status["pendingReasonCode"] not in (None, "KindNotRunnable")


def test_a_held_kind_is_ahead_of_nobody_in_explain(api: Api) -> None:
    """A held workload is in no queue: explain counts it ahead of no one, and
    gives it no position of its own, only why it waits."""
    _queues(api)
    held = _queued(kinds.gang_statefulset())
    assert api.admin.post("/v1/namespaces/serve/workloads", json=held).status_code == 201
    later = _queued(kinds.deployment())
    assert api.admin.post("/v1/namespaces/serve/workloads", json=later).status_code == 201
    AdmissionCycle(api.services.engine, api.services.unit_of_work).run(_no_guard)
    base = "/v1/namespaces/serve/workloads"
    waiting = api.admin.get(f"{base}/{later['metadata']['name']}/explain").json()
    assert waiting["state"] == "Pending", waiting
    assert (waiting["positionInQueue"], waiting["pendingInClusterQueue"]) == (1, 1), waiting
    assert waiting["ahead"]["total"] == 0 and waiting["ahead"]["workloads"] == []
    alone = api.admin.get(f"{base}/{held['metadata']['name']}/explain").json()
    assert alone["reason"] == "KindNotRunnable", alone
    assert "positionInQueue" not in alone and "ahead" not in alone
    assert "StatefulSet" in alone["waitingFor"]


def test_a_broken_manifest_of_each_kind_is_a_problem_naming_the_field(api: Api) -> None:
    _queues(api)
    for label, (manifest, field) in kinds.REFUSALS.items():
        namespace = "serve" if manifest["kind"] in ("Deployment", "StatefulSet") else "team-a"
        response = api.admin.post(f"/v1/namespaces/{namespace}/workloads", json=manifest)
        assert response.headers["content-type"].startswith("application/problem+json"), label
        body = _problem(response, 422, "invalid")
        assert field in _fields(body), (label, body)


def test_a_serving_kind_is_inference_unless_it_says_otherwise(api: Api) -> None:
    _queues(api)
    refused = api.admin.post("/v1/namespaces/team-a/workloads", json=_queued(kinds.deployment()))
    body = _problem(refused, 422, "invalid")
    assert "serves training" in body["detail"]
    assert _fields(body) == ["metadata.annotations.quartermaster.dev/workload-class"]
    said = _queued(kinds.deployment())
    said["metadata"]["annotations"]["quartermaster.dev/workload-class"] = "training"
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=said)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["workloadClass"] == "training"


def test_a_volcano_job_is_accepted_as_itself_and_inside_a_workload(api: Api) -> None:
    """Issue 23: a ``batch.volcano.sh/v1alpha1`` Job, sent as is and as a
    Workload's spec.job, gets a pod set per task and class training; a
    broken one is problem+json naming the field."""
    _queues(api)
    sent = _queued(kinds.volcano_tf_mnist())
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=sent)
    assert created.status_code == 201, created.text
    spec = created.json()["spec"]
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("ps", 1), ("worker", 2)]
    assert spec["workloadClass"] == "training"
    assert (spec["job"]["apiVersion"], spec["job"]["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    wrapped = {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": "wrapped"},
        "spec": {"queueName": "train", "job": kinds.volcano_job()},
    }
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=wrapped)
    assert created.status_code == 201, created.text
    assert [(p["name"], p["count"]) for p in created.json()["spec"]["podSets"]] == [("default0", 6)]
    wrapped["metadata"]["name"] = "broken"
    wrapped["spec"]["job"]["spec"]["minAvailable"] = 7
    refused = api.admin.post("/v1/namespaces/team-a/workloads", json=wrapped)
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert _fields(_problem(refused, 422, "invalid")) == ["spec.job.spec.minAvailable"]


def test_a_volcano_job_without_kueues_labels_names_its_queue_and_priority_itself(
    api: Api,
) -> None:
    """A Volcano user's job as it is: ``spec.queue`` names the queue and
    ``spec.priorityClassName`` the priority where Kueue's labels are absent;
    the labels win where both are given."""
    _queues(api)
    api.admin.post(
        "/v1/workloadpriorityclasses", json={"metadata": {"name": "urgent"}, "value": 100}
    ).raise_for_status()
    job = kinds.volcano_tf_mnist()
    job["metadata"]["labels"].pop("kueue.x-k8s.io/queue-name")
    job["metadata"]["name"] = "own-fields"
    job["spec"]["queue"] = "train"
    job["spec"]["priorityClassName"] = "urgent"
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=job)
    assert created.status_code == 201, created.text
    spec = created.json()["spec"]
    assert (spec["queueName"], spec["priorityClassName"]) == ("train", "urgent")

    job["metadata"]["name"] = "unknown-queue"
    job["spec"]["queue"] = "research"
    refused = api.admin.post("/v1/namespaces/team-a/workloads", json=job)
    assert "LocalQueue research not found" in _problem(refused, 422, "unknown-reference")["detail"]

    job["metadata"]["name"] = "labelled"
    labelled = _queued(job)
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=labelled)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["queueName"] == "train"  # the label's, not spec.queue's

    bare = kinds.volcano_tf_mnist()
    bare["spec"].pop("queue")
    bare["metadata"]["labels"].pop("kueue.x-k8s.io/queue-name")
    body = _problem(api.admin.post("/v1/namespaces/team-a/workloads", json=bare), 422, "invalid")
    assert _fields(body) == ["metadata.labels.kueue.x-k8s.io/queue-name"]
    assert "spec.queue" in str(body)


def _island_queue(api: Api) -> None:
    """LocalQueue ``fabric`` in team-a, to a ClusterQueue whose one flavor has
    a topology whose island level is ``example.com/fabric-block``."""
    levels = [{"nodeLabel": "example.com/fabric-block"}, {"nodeLabel": "kubernetes.io/hostname"}]
    topology = {"metadata": {"name": "gpu-fabric"}, "spec": {"levels": levels}}
    assert api.admin.post("/v1/topologies", json=topology).status_code == 201
    setup_quota(
        api.admin,
        "team-a",
        "cq-fabric",
        queue="fabric",
        flavor="h100-fabric",
        topology="gpu-fabric",
    )


@pytest.mark.parametrize(
    ("topology", "want"),
    [
        ({"mode": "hard", "highestTierAllowed": 1}, {"required", "podSetGroupName"}),
        ({"highestTierAllowed": 1}, {"required", "podSetGroupName"}),  # hard is Volcano's default
        ({"mode": "soft", "highestTierAllowed": 1}, {"preferred"}),
        ({"mode": "hard", "highestTierAllowed": 2}, None),  # wider than an island
    ],
)
def test_a_volcano_jobs_tier_one_network_topology_keeps_its_gang_in_one_island(
    api: Api, topology: dict[str, Any], want: set[str] | None
) -> None:
    """``networkTopology`` at tier 1 (one HyperNode: one fabric island) asks
    the island level of the queue's flavors of every task, all in one group
    (one island for the whole gang); a queue with no island to offer refuses
    a hard one, naming the field."""
    _queues(api)
    _island_queue(api)
    job = kinds.volcano_tf_mnist()
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "fabric"
    job["spec"]["networkTopology"] = topology
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=job)
    assert created.status_code == 201, created.text
    requests = [p.get("topologyRequest") for p in created.json()["spec"]["podSets"]]
    if want is None:
        assert requests == [None, None]
        return
    assert all(set(r) == want for r in requests), requests
    mode = "required" if "required" in want else "preferred"
    assert {r[mode] for r in requests} == {"example.com/fabric-block"}
    assert len({r.get("podSetGroupName") for r in requests}) == 1

    job["metadata"]["name"] = "no-island"
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "train"  # a flavor without topology
    answer = api.admin.post("/v1/namespaces/team-a/workloads", json=job)
    if mode == "preferred":  # best effort: accepted, nothing to prefer
        assert answer.status_code == 201, answer.text
        assert [p.get("topologyRequest") for p in answer.json()["spec"]["podSets"]] == [None] * 2
        return
    body = _problem(answer, 422, "invalid")
    assert _fields(body) == ["spec.job.spec.networkTopology"]
