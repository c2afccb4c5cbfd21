"""The serving planner, pure: one member object per (cluster, placement) of
a serving workload's admitted replicas, its replica count the admitted one;
scaling changes that count in place (workers/plan/serving.py)."""

from __future__ import annotations

from typing import Any

from workers.plan import QUEUE_LABEL, ClusterView, Ref, WorkloadView
from workers.plan.serving import member_object, parts, scale_to, selectors

ISLAND = "example.com/fabric-block"
GPU = "nvidia.com/gpu"
FLAVORS = {"h100": {"nodeLabels": {"example.com/gpu": "h100"}, "topologyName": "fabric"}}
TOPOLOGIES = {
    "fabric": {"levels": [{"nodeLabel": ISLAND}, {"nodeLabel": "kubernetes.io/hostname"}]}
}


def pod(gpus: int) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [{"name": "m", "image": "i", "resources": {"requests": {GPU: gpus}}}]
        }
    }


def deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {QUEUE_LABEL: "serve"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": pod(1),
        },
    }


def lws(groups: int) -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "vllm", "labels": {QUEUE_LABEL: "serve"}},
        "spec": {
            "replicas": groups,
            "leaderWorkerTemplate": {"size": 2, "leaderTemplate": pod(8), "workerTemplate": pod(8)},
        },
    }


def replica(
    index: int, island: str, pod_sets: tuple[str, ...] = ("main",), cluster: str = "c1"
) -> dict[str, Any]:
    return {
        "replica": index,
        "admittedAt": f"2026-01-01T00:00:0{index}Z",
        "admission": {
            "clusterQueue": "serve",
            "cluster": cluster,
            "podSetAssignments": [
                {
                    "name": name,
                    "count": 1,
                    "flavors": {GPU: "h100"},
                    "resourceUsage": {GPU: "1"},
                    "islands": [island],
                }
                for name in pod_sets
            ],
        },
    }


def workload(job: dict[str, Any], admitted: list[dict[str, Any]]) -> WorkloadView:
    spec = {"queueName": "serve", "podSets": [], "job": job, "replicas": job["spec"]["replicas"]}
    return WorkloadView(
        "team-s",
        str(job["metadata"]["name"]),
        "uid-web-0001",
        spec,
        {"state": "Admitted", "replicaAdmissions": admitted},
    )


VIEW = ClusterView("c1", [], FLAVORS, TOPOLOGIES)


def members(view: WorkloadView) -> list[dict[str, Any]]:
    return [member_object(p, "qm-serve", selectors(VIEW, p)) for p in parts(view, "c1")]


def test_one_object_per_placement_with_the_admitted_count() -> None:
    web = workload(
        deployment(6),
        [
            replica(0, "c1-h100-i0"),
            replica(1, "c1-h100-i1"),
            replica(2, "c1-h100-i0"),
            replica(3, "c1-h100-i0"),
            replica(4, "c1-h100-i0", cluster="c2"),
        ],
    )
    objects = members(web)
    got = sorted(
        (o["spec"]["replicas"], o["spec"]["template"]["spec"]["nodeSelector"][ISLAND])
        for o in objects
    )
    # Six wanted, five admitted, four of them here: the member never runs ahead.
    assert got == [(1, "c1-h100-i1"), (3, "c1-h100-i0")]
    for obj in objects:
        assert obj["metadata"]["labels"][QUEUE_LABEL] == "qm-serve"
        assert obj["metadata"]["annotations"]["quartermaster.dev/workload"] == "team-s/web"
    assert len({o["metadata"]["name"] for o in objects}) == 2


def test_scaling_up_by_two_changes_the_count_in_place() -> None:
    before = workload(
        deployment(3),
        [replica(0, "c1-h100-i0"), replica(1, "c1-h100-i0"), replica(2, "c1-h100-i1")],
    )
    actual = members(before)
    after = workload(
        deployment(5),
        [*before.status["replicaAdmissions"], replica(3, "c1-h100-i0"), replica(4, "c1-h100-i0")],
    )
    create, scale, delete = scale_to(members(after), actual)
    i0 = next(
        o for o in actual if o["spec"]["template"]["spec"]["nodeSelector"][ISLAND] == "c1-h100-i0"
    )
    assert (create, delete) == ([], [])
    assert scale == [(Ref.of(i0), 4)]


def test_scaling_down_deletes_only_the_placement_left_empty() -> None:
    before = workload(
        deployment(3),
        [replica(0, "c1-h100-i0"), replica(1, "c1-h100-i0"), replica(2, "c1-h100-i1")],
    )
    actual = members(before)
    after = workload(deployment(2), before.status["replicaAdmissions"][:2])
    create, scale, delete = scale_to(members(after), actual)
    i1 = next(
        o for o in actual if o["spec"]["template"]["spec"]["nodeSelector"][ISLAND] == "c1-h100-i1"
    )
    assert (create, scale) == ([], [])
    assert delete == [Ref.of(i1)]


def test_a_leaderworkerset_group_is_pinned_to_one_island() -> None:
    vllm = workload(
        lws(2),
        [
            replica(0, "c1-h100-i1", ("leader", "worker")),
            replica(1, "c1-h100-i1", ("leader", "worker")),
        ],
    )
    (obj,) = members(vllm)
    group = obj["spec"]["leaderWorkerTemplate"]
    assert obj["spec"]["replicas"] == 2
    assert group["leaderTemplate"]["spec"]["nodeSelector"][ISLAND] == "c1-h100-i1"
    assert group["workerTemplate"]["spec"]["nodeSelector"][ISLAND] == "c1-h100-i1"
