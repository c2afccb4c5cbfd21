"""The reconcile planner, pure: desired member objects from central
decisions, and the actions against what the member holds."""

from __future__ import annotations

from typing import Any

from workers.clusters import Ref
from workers.plan import (
    ADMISSION_LABEL,
    QUEUE_LABEL,
    ClusterView,
    WorkloadView,
    admission_id,
    desired,
    plan,
)

ISLAND = "example.com/fabric-block"
GPU = "nvidia.com/gpu"
FLAVORS = {"h100": {"nodeLabels": {"example.com/gpu": "h100"}, "topologyName": "fabric"}}
TOPOLOGIES = {
    "fabric": {"levels": [{"nodeLabel": ISLAND}, {"nodeLabel": "kubernetes.io/hostname"}]}
}


def template(gpus: int = 8) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {"name": "m", "image": "i", "resources": {"requests": {GPU: gpus, "cpu": "8"}}}
            ]
        }
    }


def admitted(
    name: str,
    *,
    cluster: str = "c1",
    island: str = "c1-h100-i0",
    count: int = 2,
    state: str = "Admitted",
    job: dict[str, Any] | None = None,
    at: str = "2026-01-01T00:00:00Z",
) -> WorkloadView:
    spec: dict[str, Any] = {
        "queueName": "train",
        "podSets": [{"name": "workers", "count": count, "template": template()}],
    }
    if job is not None:
        spec["job"] = job
    status = {
        "state": state,
        "admission": {
            "clusterQueue": "cq",
            "cluster": cluster,
            "island": island,
            "podSetAssignments": [
                {
                    "name": "workers",
                    "count": count,
                    "flavors": {GPU: "h100", "cpu": "h100"},
                    "resourceUsage": {GPU: str(8 * count), "cpu": str(8 * count)},
                    "islands": [island],
                }
            ],
            "admittedAt": at,
        },
    }
    return WorkloadView("team-a", name, f"uid-{name}", spec, status)


def view(*workloads: WorkloadView) -> ClusterView:
    return ClusterView("c1", list(workloads), FLAVORS, TOPOLOGIES)


def test_an_admitted_gang_gets_its_flavor_quota_queue_and_a_job_pinned_to_its_island() -> None:
    actions = plan(view(admitted("a"), admitted("b", island="c1-h100-i1", count=1)), [])
    kinds = [o["kind"] for o in actions.apply]
    assert kinds == [
        "Namespace",
        "WorkloadPriorityClass",
        "ResourceFlavor",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
    ]
    assert actions.apply[1]["metadata"]["name"] == "qm-p0" and actions.apply[1]["value"] == 0
    del actions.apply[1]
    flavor = actions.apply[1]
    assert flavor["metadata"]["name"] == "qm-h100-c1-h100-i0"
    assert flavor["spec"]["nodeLabels"] == {"example.com/gpu": "h100", ISLAND: "c1-h100-i0"}
    (group,) = actions.apply[3]["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", GPU]
    quotas = {
        f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]
    }
    # exactly what the centre admitted there: nothing more to admit, nothing less to block
    assert quotas == {
        "qm-h100-c1-h100-i0": {"cpu": "16", GPU: "16"},
        "qm-h100-c1-h100-i1": {"cpu": "8", GPU: "8"},
    }
    assert actions.apply[4]["spec"] == {"clusterQueue": "qm-cq"}
    a, b = actions.dispatch
    assert a["kind"] == "Job" and a["spec"]["parallelism"] == 2
    assert a["metadata"]["labels"][QUEUE_LABEL] == "qm-train"
    assert a["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "qm-p0"
    assert a["spec"]["template"]["spec"]["nodeSelector"][ISLAND] == "c1-h100-i0"
    assert b["spec"]["template"]["spec"]["nodeSelector"][ISLAND] == "c1-h100-i1"
    assert not actions.delete and not actions.requeue


def test_applied_state_plans_nothing() -> None:
    cluster = view(admitted("a"))
    want = desired(cluster)
    actual = [*want.namespaces.values(), *want.queues.values(), *want.jobs.values()]
    assert not plan(cluster, actual)


def test_a_job_of_an_earlier_admission_is_deleted_before_the_new_one_is_dispatched() -> None:
    old = admitted("a", at="2026-01-01T00:00:00Z")
    new = admitted("a", at="2026-01-01T01:00:00Z")
    stale = desired(view(old)).jobs.popitem()[1]
    actions = plan(view(new), [stale])
    assert actions.delete == [Ref("Job", "team-a", "a")]
    assert actions.draining == [admission_id(old)]
    assert actions.dispatch == []  # same name: held until the old one is gone


def test_evicted_and_cancelled_gangs_are_recorded_once_their_jobs_are_gone() -> None:
    evicted = admitted("e", state="Evicted")
    evicted = WorkloadView(
        "team-a", "e", "uid-e", evicted.spec, {"state": "Evicted", "eviction": {"cluster": "c1"}}
    )
    cancelling = admitted("c", state="Cancelling")
    running = desired(view(admitted("e"))).jobs.popitem()[1]
    first = plan(view(evicted, cancelling), [running])
    assert first.delete == [Ref("Job", "team-a", "e")] and first.requeue == []
    assert first.cancelled == ["team-a/c"]
    second = plan(view(evicted, cancelling), [])
    assert second.requeue == ["team-a/e"]
    assert second.collect == []


def test_a_submitted_pytorchjob_is_sent_as_is_with_every_replica_pinned() -> None:
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "orig", "labels": {QUEUE_LABEL: "train", "team": "nlp"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template()},
                "Worker": {"replicas": 1, "template": template()},
            }
        },
    }
    (job,) = plan(view(admitted("a", job=manifest)), []).dispatch
    assert job["kind"] == "PyTorchJob" and job["metadata"]["name"] == "a"
    assert job["metadata"]["labels"]["team"] == "nlp"
    assert job["metadata"]["labels"][QUEUE_LABEL] == "qm-train"
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]
        assert pod["spec"]["nodeSelector"][ISLAND] == "c1-h100-i0"
        assert (
            pod["metadata"]["labels"][ADMISSION_LABEL] == job["metadata"]["labels"][ADMISSION_LABEL]
        )


def test_unused_queue_objects_are_collected_after_the_jobs() -> None:
    want = desired(view(admitted("a")))
    actual = [*want.queues.values()]
    actions = plan(view(), actual)
    assert [r.kind for r in actions.collect] == [
        "LocalQueue",
        "ClusterQueue",
        "ResourceFlavor",
        "WorkloadPriorityClass",
    ]


def test_a_deactivated_gang_stays_evicted() -> None:
    gone = admitted("d")
    spec = {**gone.spec, "active": False}
    status = {"state": "Evicted", "eviction": {"cluster": "c1", "reason": "DispatchFailed"}}
    assert plan(view(WorkloadView("team-a", "d", "uid-d", spec, status)), []).requeue == []


def test_names_that_are_not_dns_labels_do_not_collide() -> None:
    a, b = admitted("a.b"), admitted("a-b")
    names = {job["metadata"]["name"] for job in plan(view(a, b), []).dispatch}
    assert len(names) == 2 and "a-b" in names
