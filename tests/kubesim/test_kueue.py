"""Kueue objects and the Kueue-like admission loop, through the official client.

The YAML below is Kueue's own "single ClusterQueue" setup from its documentation
(https://kueue.sigs.k8s.io/docs/tasks/manage/administer_cluster_quotas/), at
``v1beta2`` and at the deprecated ``v1beta1`` that the stand-in serves too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.kubesim.testing import RunningCluster
from tests.kubesim.conftest import queued_job, status_body
from tests.waiting import wait_for

KUEUE = "kueue.x-k8s.io"

DOCS_SETUP = """
apiVersion: kueue.x-k8s.io/{version}
kind: ResourceFlavor
metadata:
  name: "default-flavor{suffix}"
---
apiVersion: kueue.x-k8s.io/{version}
kind: ClusterQueue
metadata:
  name: "cluster-queue{suffix}"
spec:
  namespaceSelector: {{}} # match all.
  resourceGroups:
  - coveredResources: ["cpu", "memory"]
    flavors:
    - name: "default-flavor{suffix}"
      resources:
      - name: "cpu"
        nominalQuota: 9
      - name: "memory"
        nominalQuota: 36Gi
---
apiVersion: kueue.x-k8s.io/{version}
kind: LocalQueue
metadata:
  namespace: "default"
  name: "user-queue{suffix}"
spec:
  clusterQueue: "cluster-queue{suffix}"
"""

PLURALS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues"}


def _create(custom: client.CustomObjectsApi, obj: dict[str, Any], **kwargs: Any) -> Any:
    version = obj["apiVersion"].split("/")[1]
    if obj["kind"] == "LocalQueue":
        namespace = obj["metadata"]["namespace"]
        return custom.create_namespaced_custom_object(
            KUEUE, version, namespace, "localqueues", obj, **kwargs
        )
    return custom.create_cluster_custom_object(KUEUE, version, PLURALS[obj["kind"]], obj, **kwargs)


def _cluster_queue(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}


@pytest.mark.parametrize(("version", "suffix"), [("v1beta2", ""), ("v1beta1", "-old")])
def test_kueue_documentation_setup_applies_and_becomes_active(
    custom: client.CustomObjectsApi, version: str, suffix: str
) -> None:
    documents = list(yaml.safe_load_all(DOCS_SETUP.format(version=version, suffix=suffix)))
    created = [_create(custom, doc) for doc in documents]
    assert [c["kind"] for c in created] == ["ResourceFlavor", "ClusterQueue", "LocalQueue"]
    assert all(c["apiVersion"] == f"{KUEUE}/{version}" for c in created)
    queue = created[1]
    # Defaults from the CRD schema, as a real API server fills them in.
    assert queue["spec"]["queueingStrategy"] == "BestEffortFIFO"
    assert queue["spec"]["flavorFungibility"]["whenCanBorrow"] in ("MayStopSearch", "Borrow")

    def active() -> bool:
        cq = custom.get_cluster_custom_object(
            KUEUE, "v1beta2", "clusterqueues", queue["metadata"]["name"]
        )
        return _conditions(cq).get("Active", {}).get("status") == "True"

    assert wait_for(active)


def test_borrowing_limit_without_cohort_is_invalid_by_the_crds_cel_rule(
    custom: client.CustomObjectsApi,
) -> None:
    spec = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [
                    {
                        "name": "default-flavor",
                        "resources": [{"name": "cpu", "nominalQuota": 9, "borrowingLimit": 1}],
                    }
                ],
            }
        ],
    }
    with pytest.raises(ApiException) as invalid:
        _create(custom, _cluster_queue("lonely-borrower", spec))
    body = status_body(invalid.value)
    assert (invalid.value.status, body["reason"]) == (422, "Invalid")
    cause = body["details"]["causes"][0]
    assert cause["field"] == "spec"
    assert "borrowingLimit must be nil when cohort is empty" in cause["message"]
    assert body["details"]["kind"] == "ClusterQueue"

    spec["cohortName"] = "somewhere"
    assert _create(custom, _cluster_queue("lonely-borrower", spec))["spec"]["cohortName"]


def test_schema_violations_name_the_field(custom: client.CustomObjectsApi) -> None:
    bad_enum = _cluster_queue("bad-enum", {"queueingStrategy": "Random"})
    with pytest.raises(ApiException) as invalid:
        _create(custom, bad_enum)
    cause = status_body(invalid.value)["details"]["causes"][0]
    assert invalid.value.status == 422
    assert cause["field"] == "spec.queueingStrategy"
    assert 'Unsupported value: "Random"' in cause["message"]


def test_unknown_field_is_refused_under_strict_validation_and_dropped_otherwise(
    custom: client.CustomObjectsApi,
) -> None:
    typo = _cluster_queue("typo", {"namespaceSelector": {}, "resourceGroup": []})
    # A real API server answers an unknown field under fieldValidation=Strict (kubectl's
    # default) with 400 BadRequest "strict decoding error", not 422: we do the same.
    with pytest.raises(ApiException) as strict:
        _create(custom, typo, field_validation="Strict")
    body = status_body(strict.value)
    assert (strict.value.status, body["reason"]) == (400, "BadRequest")
    assert 'unknown field "spec.resourceGroup"' in body["message"]
    with pytest.raises(ApiException):
        custom.get_cluster_custom_object(KUEUE, "v1beta2", "clusterqueues", "typo")

    pruned = _create(custom, typo, field_validation="Ignore")
    assert "resourceGroup" not in pruned["spec"]


# -- the admission loop ----------------------------------------------------------------------

QUOTA_NS = "quota-test"


@pytest.fixture(scope="module")
def small_queue(sim: RunningCluster, api: client.ApiClient) -> Iterator[str]:
    """A ClusterQueue without cohort: 16 a100 GPUs, for the namespace ``quota-test``."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=QUOTA_NS, labels={"t": "quota"}))
    )
    resources = [
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "memory", "nominalQuota": "1Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": 16},
    ]
    spec = {
        "namespaceSelector": {"matchLabels": {"t": "quota"}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": "a100", "resources": resources}],
            }
        ],
    }
    _create(custom, _cluster_queue("small", spec))
    local = {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "default", "namespace": QUOTA_NS},
        "spec": {"clusterQueue": "small"},
    }
    _create(custom, local)
    yield "small"


def _workload_of(custom: client.CustomObjectsApi, namespace: str, job: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        items = custom.list_namespaced_custom_object(KUEUE, "v1beta2", namespace, "workloads")
        for item in items["items"]:
            if any(ref["name"] == job for ref in item["metadata"].get("ownerReferences") or ()):
                return dict(item)
        return None

    found: dict[str, Any] = wait_for(find)
    return found


def _job_condition(batch: client.BatchV1Api, namespace: str, name: str, type_: str) -> bool:
    job = batch.read_namespaced_job_status(name, namespace)
    return any(c.type == type_ and c.status == "True" for c in job.status.conditions or ())


def _gpu_reservation(custom: client.CustomObjectsApi, queue: str) -> str:
    cq = custom.get_cluster_custom_object_status(KUEUE, "v1beta2", "clusterqueues", queue)
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or ():
        for resource in flavor["resources"]:
            if resource["name"] == "nvidia.com/gpu":
                return str(resource["total"])
    return "0"


def test_queued_job_runs_to_completion_and_frees_its_quota(
    small_queue: str, batch: client.BatchV1Api, custom: client.CustomObjectsApi
) -> None:
    # 16 GPUs each: the second fits only after the first has finished (2 s at 1/100 speed).
    batch.create_namespaced_job(QUOTA_NS, queued_job("first", gpus=8, pods=2, duration="200s"))
    first = _workload_of(custom, QUOTA_NS, "first")
    wait_for(lambda: _gpu_reservation(custom, small_queue) == "16")
    batch.create_namespaced_job(QUOTA_NS, queued_job("second", gpus=8, pods=2, duration="50s"))
    second = _workload_of(custom, QUOTA_NS, "second")

    def waiting_message() -> str:
        workload = custom.get_namespaced_custom_object(
            KUEUE, "v1beta2", QUOTA_NS, "workloads", second["metadata"]["name"]
        )
        reserved = _conditions(workload).get("QuotaReserved", {})
        return str(reserved.get("message", "")) if reserved.get("status") == "False" else ""

    pending = wait_for(waiting_message)
    assert "insufficient unused quota for nvidia.com/gpu in flavor a100" in pending
    assert batch.read_namespaced_job("second", QUOTA_NS).spec.suspend is True

    wait_for(lambda: _job_condition(batch, QUOTA_NS, "first", "Complete"))
    done = custom.get_namespaced_custom_object(
        KUEUE, "v1beta2", QUOTA_NS, "workloads", first["metadata"]["name"]
    )
    assert _conditions(done)["Finished"]["reason"] == "Succeeded"
    wait_for(lambda: _job_condition(batch, QUOTA_NS, "second", "Complete"))
    wait_for(lambda: _gpu_reservation(custom, small_queue) == "0")
    job = batch.read_namespaced_job("second", QUOTA_NS)
    assert job.status.succeeded == 2 and job.spec.suspend is False


def test_job_too_big_for_its_queue_stays_pending_with_the_reason(
    small_queue: str, batch: client.BatchV1Api, custom: client.CustomObjectsApi
) -> None:
    batch.create_namespaced_job(QUOTA_NS, queued_job("huge", gpus=8, pods=3))
    workload = _workload_of(custom, QUOTA_NS, "huge")

    def reason() -> dict[str, Any]:
        current = custom.get_namespaced_custom_object(
            KUEUE, "v1beta2", QUOTA_NS, "workloads", workload["metadata"]["name"]
        )
        return _conditions(current).get("QuotaReserved", {})

    reserved = wait_for(reason)
    assert (reserved["status"], reserved["reason"]) == ("False", "Pending")
    assert "request > maximum capacity (24 > 16)" in reserved["message"]
    assert batch.read_namespaced_job("huge", QUOTA_NS).spec.suspend is True
    core = client.CoreV1Api(batch.api_client)
    assert core.list_namespaced_pod(QUOTA_NS, label_selector="job-name=huge").items == []


def test_island_pinned_job_lands_only_on_that_islands_nodes(
    batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    island = "east-1-h100-i1"
    job = queued_job(
        "pinned",
        gpus=8,
        pods=4,
        duration="1h",
        node_selector={"example.com/fabric-block": island},
    )
    batch.create_namespaced_job("vision", job)

    def placed() -> list[str]:
        pods = core.list_namespaced_pod("vision", label_selector="job-name=pinned").items
        nodes = [p.spec.node_name for p in pods if p.status.phase == "Running"]
        return nodes if len(nodes) == 4 else []

    nodes = wait_for(placed)
    assert sorted(nodes) == [f"{island}-n{k}" for k in range(4)]
    for name in set(nodes):
        assert core.read_node(name).metadata.labels["example.com/fabric-block"] == island
    batch.delete_namespaced_job("pinned", "vision", propagation_policy="Background")


# -- the other job kinds -----------------------------------------------------------------------

_POD = {
    "spec": {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "w",
                "image": "registry.example/train:1",
                "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "4", "memory": "16Gi"}},
            }
        ],
    }
}
_QUEUED = {
    "labels": {"kueue.x-k8s.io/queue-name": "default"},
    "annotations": {"quartermaster.dev/sim-duration": "50s"},
}
GANGS = {
    "jobset": (
        ("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", "Completed"),
        {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {"spec": {"parallelism": 2, "completions": 2, "template": _POD}},
                }
            ]
        },
        {"workers": 4},
    ),
    "pytorchjob": (
        ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", "Succeeded"),
        {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": _POD},
                "Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": _POD},
            }
        },
        {"master": 1, "worker": 3},
    ),
    "mpijob": (
        ("kubeflow.org", "v2beta1", "mpijobs", "MPIJob", "Succeeded"),
        {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": _POD},
                "Worker": {"replicas": 2, "template": _POD},
            }
        },
        {"launcher": 1, "worker": 2},
    ),
}


@pytest.mark.parametrize("kind", sorted(GANGS))
def test_queued_gangs_of_every_kind_are_admitted_whole_and_succeed(
    kind: str, custom: client.CustomObjectsApi
) -> None:
    (group, version, plural, kind_name, success), spec, pod_sets = GANGS[kind]
    gang = {
        "apiVersion": f"{group}/{version}",
        "kind": kind_name,
        "metadata": {"name": f"gang-{kind}", **_QUEUED},
        "spec": spec,
    }
    custom.create_namespaced_custom_object(group, version, "language", plural, gang)
    workload = _workload_of(custom, "language", f"gang-{kind}")
    assert {ps["name"]: ps["count"] for ps in workload["spec"]["podSets"]} == pod_sets

    def succeeded() -> bool:
        current = custom.get_namespaced_custom_object(
            group, version, "language", plural, f"gang-{kind}"
        )
        return _conditions(current).get(success, {}).get("status") == "True"

    wait_for(succeeded)
    finished = custom.get_namespaced_custom_object(
        KUEUE, "v1beta2", "language", "workloads", workload["metadata"]["name"]
    )
    assert _conditions(finished)["Finished"]["reason"] == "Succeeded"
    assigned = finished["status"]["admission"]["podSetAssignments"]
    assert sum(a["count"] for a in assigned) == sum(pod_sets.values())


def _timed(seconds: str) -> dict[str, Any]:
    return {**_POD, "metadata": {"annotations": {"quartermaster.dev/sim-duration": seconds}}}


def test_a_jobset_succeeds_by_its_success_policy_and_deletes_its_active_jobs(
    batch: client.BatchV1Api, custom: client.CustomObjectsApi
) -> None:
    """JobSet's success policy (``Any`` of the target replicated jobs' Jobs):
    the launcher ends, the JobSet is Completed though its workers still run,
    and its Jobs still active are deleted, as the JobSet controller does."""
    spec = {
        "successPolicy": {"operator": "Any", "targetReplicatedJobs": ["launcher"]},
        "replicatedJobs": [
            {
                "name": "launcher",
                "replicas": 1,
                "template": {"spec": {"parallelism": 1, "template": _timed("10s")}},
            },
            {
                "name": "workers",
                "replicas": 1,
                "template": {"spec": {"parallelism": 2, "template": _timed("100000s")}},
            },
        ],
    }
    gang = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "launched", "labels": dict(_QUEUED["labels"])},
        "spec": spec,
    }
    custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "language", "jobsets", gang
    )

    def completed() -> dict[str, Any] | None:
        current = custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "language", "jobsets", "launched"
        )
        done = _conditions(current).get("Completed", {}).get("status") == "True"
        return current if done else None

    finished = wait_for(completed)
    assert finished["status"]["terminalState"] == "Completed"

    def left() -> list[str] | None:
        jobs = batch.list_namespaced_job(
            "language", label_selector="jobset.sigs.k8s.io/jobset-name=launched"
        ).items
        names = sorted(j.metadata.name for j in jobs if not j.metadata.deletion_timestamp)
        return names if names == ["launched-launcher-0"] else None

    assert wait_for(left) == ["launched-launcher-0"]


def test_priority_class_label_sets_the_workload_priority(
    batch: client.BatchV1Api, custom: client.CustomObjectsApi
) -> None:
    job = queued_job("urgent", duration="10s")
    job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "critical"
    batch.create_namespaced_job("language", job)
    workload = _workload_of(custom, "language", "urgent")
    assert workload["spec"]["priority"] == 1000
    assert workload["spec"]["priorityClassRef"]["name"] == "critical"


# -- scheduler and eviction ------------------------------------------------------------------


def test_pod_no_node_fits_stays_pending_with_the_schedulers_reasons(
    core: client.CoreV1Api,
) -> None:
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="nowhere"),
        spec=client.V1PodSpec(
            node_selector={"example.com/gpu": "a100"},
            containers=[
                client.V1Container(
                    name="c",
                    image="x:1",
                    resources=client.V1ResourceRequirements(requests={"nvidia.com/gpu": "9"}),
                )
            ],
        ),
    )
    core.create_namespaced_pod("default", pod)

    def unschedulable() -> str:
        current = core.read_namespaced_pod("nowhere", "default")
        for condition in current.status.conditions or ():
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return str(condition.message)
        return ""

    message = wait_for(unschedulable)
    assert message.startswith("0/12 nodes are available:")
    assert "4 Insufficient nvidia.com/gpu" in message
    assert "8 node(s) had untolerated taint {example.com/gpu: h100}" in message
    pending = core.read_namespaced_pod("nowhere", "default")
    assert pending.status.phase == "Pending" and pending.spec.node_name is None
    core.delete_namespaced_pod("nowhere", "default")


def test_deactivated_workload_is_evicted_its_job_suspended_and_quota_freed(
    small_queue: str, batch: client.BatchV1Api, custom: client.CustomObjectsApi
) -> None:
    batch.create_namespaced_job(QUOTA_NS, queued_job("paused", gpus=8, pods=1, duration="1h"))
    workload = _workload_of(custom, QUOTA_NS, "paused")
    name = workload["metadata"]["name"]
    wait_for(lambda: _gpu_reservation(custom, small_queue) == "8")
    custom.patch_namespaced_custom_object(
        KUEUE,
        "v1beta2",
        QUOTA_NS,
        "workloads",
        name,
        {"spec": {"active": False}},
        _content_type="application/merge-patch+json",
    )

    def evicted() -> dict[str, Any]:
        current = custom.get_namespaced_custom_object(KUEUE, "v1beta2", QUOTA_NS, "workloads", name)
        condition = _conditions(current).get("Evicted", {})
        return condition if condition.get("status") == "True" else {}

    assert wait_for(evicted)["reason"] == "Deactivated"
    wait_for(lambda: batch.read_namespaced_job("paused", QUOTA_NS).spec.suspend is True)
    wait_for(lambda: _gpu_reservation(custom, small_queue) == "0")
    batch.delete_namespaced_job("paused", QUOTA_NS, propagation_policy="Background")


def test_cluster_queue_borrows_from_its_cohort_beyond_its_nominal_quota(
    batch: client.BatchV1Api, custom: client.CustomObjectsApi
) -> None:
    # vision: 48 h100 GPUs nominal, borrowingLimit 32; language lends up to 32 in "research".
    batch.create_namespaced_job("vision", queued_job("borrower", gpus=8, pods=7, duration="1h"))
    workload = _workload_of(custom, "vision", "borrower")

    def borrowed() -> tuple[str, str]:
        cq = custom.get_cluster_custom_object_status(KUEUE, "v1beta2", "clusterqueues", "vision")
        for flavor in (cq.get("status") or {}).get("flavorsReservation") or ():
            for resource in flavor["resources"] if flavor["name"] == "h100" else ():
                if resource["name"] == "nvidia.com/gpu" and resource["total"] == "56":
                    return resource["total"], resource["borrowed"]
        return ("", "")

    assert wait_for(borrowed) == ("56", "8")
    admitted = custom.get_namespaced_custom_object(
        KUEUE, "v1beta2", "vision", "workloads", workload["metadata"]["name"]
    )
    assert _conditions(admitted)["Admitted"]["status"] == "True"
    batch.delete_namespaced_job("borrower", "vision", propagation_policy="Background")
    wait_for(lambda: borrowed() == ("", ""))


def test_a_queued_rayjob_waits_suspended_then_runs_on_its_flavor_to_success(
    custom: client.CustomObjectsApi,
) -> None:
    """Kueue's RayJob integration on the member: suspended on create, a Workload of
    ``head``, each worker group and the ``submitter``; admitted, it is let go with its
    flavor's node labels on every template, and its Workload finishes with the job."""
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "gang-rayjob", "labels": _QUEUED["labels"]},
        "spec": {
            "entrypoint": "python /home/ray/samples/sample_code.py",
            "shutdownAfterJobFinishes": True,
            "submitterPodTemplate": {
                "metadata": {"annotations": {"quartermaster.dev/sim-duration": "50s"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "submit", "image": "rayproject/ray:2.46.0"}],
                },
            },
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": _POD},
                "workerGroupSpecs": [{"groupName": "small-group", "replicas": 2, "template": _POD}],
            },
        },
    }
    created = custom.create_namespaced_custom_object("ray.io", "v1", "language", "rayjobs", job)
    assert created["spec"]["suspend"] is True  # as the webhook stored it
    workload = _workload_of(custom, "language", "gang-rayjob")
    pod_sets = {ps["name"]: ps["count"] for ps in workload["spec"]["podSets"]}
    assert pod_sets == {"head": 1, "small-group": 2, "submitter": 1}

    def status() -> dict[str, Any]:
        current = custom.get_namespaced_custom_object(
            "ray.io", "v1", "language", "rayjobs", "gang-rayjob"
        )
        return dict(current.get("status") or {})

    wait_for(lambda: status().get("jobDeploymentStatus") == "Complete", seen=status)
    assert status()["jobStatus"] == "SUCCEEDED"
    ran = custom.get_namespaced_custom_object("ray.io", "v1", "language", "rayjobs", "gang-rayjob")
    head = ran["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"]  # the flavor's labels, written when it was let go
    finished = custom.get_namespaced_custom_object(
        KUEUE, "v1beta2", "language", "workloads", workload["metadata"]["name"]
    )
    assert _conditions(finished)["Finished"]["reason"] == "Succeeded"
    assert _conditions(finished)["PodsReady"]["status"] == "True"
