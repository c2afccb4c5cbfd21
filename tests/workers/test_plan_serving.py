"""The serving planner, pure: one member object per (cluster, placement) of
a serving workload's admitted replicas, its replica count the admitted one;
scaling changes that count in place (workers/plan/serving.py)."""

from __future__ import annotations

from typing import Any

from workers.plan import QUEUE_LABEL, ClusterView, Ref, WorkloadView, desired, plan
from workers.plan.serving import member_object, parts, scale_to, selectors
from workers.plan.volcano import volcano_desired as desired_volcano

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


# -- through desired() and plan(): what the reconciler carries out ----------------------------

CQ = {
    "resourceGroups": [
        {
            "coveredResources": [GPU],
            "flavors": [{"name": "h100", "resources": [{"name": GPU, "nominalQuota": 64}]}],
        }
    ]
}


def cluster(*workloads: WorkloadView, backend: str = "kueue") -> ClusterView:
    return ClusterView("c1", list(workloads), FLAVORS, TOPOLOGIES, {"serve": CQ}, backend=backend)


def serving_jobs(view: ClusterView) -> list[dict[str, Any]]:
    want = desired(view)
    return [o for o in want.jobs.values() if o["kind"] in ("Deployment", "LeaderWorkerSet")]


def test_desired_makes_the_member_objects_and_raises_the_queue_by_each_replica() -> None:
    web = workload(
        deployment(4),
        [replica(0, "c1-h100-i0"), replica(1, "c1-h100-i0"), replica(2, "c1-h100-i1")],
    )
    want = desired(cluster(web))
    objects = sorted(want.jobs.values(), key=lambda o: o["spec"]["replicas"])
    assert [o["spec"]["replicas"] for o in objects] == [1, 2]
    (queue,) = [o for r, o in want.queues.items() if r.kind == "ClusterQueue"]
    quota = sum(
        int(resource["nominalQuota"])
        for group in queue["spec"]["resourceGroups"]
        for flavor in group["flavors"]
        for resource in flavor["resources"]
    )
    assert quota == 3  # one GPU a replica, three admitted here
    for obj in objects:
        pod = obj["spec"]["template"]
        # The member's apps/v1 refuses any restartPolicy but Always; and no
        # usage finalizer on pods that go one by one as the object scales.
        assert pod["spec"]["restartPolicy"] == "Always"
        assert "quartermaster.dev/usage" not in (pod["metadata"].get("finalizers") or ())
        assert obj["metadata"]["labels"][QUEUE_LABEL].startswith("qm-")


def test_a_template_that_says_never_is_left_to_the_member_to_refuse() -> None:
    job = deployment(1)
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    (obj,) = serving_jobs(cluster(workload(job, [replica(0, "c1-h100-i0")])))
    assert obj["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_a_gang_statefulset_is_not_pinned_with_restart_never() -> None:
    from tests.workers.test_plan import admitted

    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "annotations": {"quartermaster.dev/gang": "true"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}}, "template": pod(1)},
    }
    gang = admitted("db", job=sts)
    view = ClusterView("c1", [gang], FLAVORS, TOPOLOGIES)
    (obj,) = desired(view).jobs.values()
    assert obj["kind"] == "StatefulSet"
    assert obj["spec"]["template"]["spec"]["restartPolicy"] == "Always"


def _held(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The member's copy: as applied, with a uid."""
    return [{**o, "metadata": {**o["metadata"], "uid": f"u{i}"}} for i, o in enumerate(objects)]


def test_plan_scales_in_place_up_and_down_and_never_dispatches_again() -> None:
    three = [replica(i, "c1-h100-i0") for i in range(3)]
    five = [*three, replica(3, "c1-h100-i0"), replica(4, "c1-h100-i0")]
    actual = _held(serving_jobs(cluster(workload(deployment(3), three))))
    (ref,) = [Ref.of(o) for o in actual]
    up = plan(cluster(workload(deployment(5), five)), actual)
    assert (up.dispatch, up.delete, up.scale_down) == ([], [], [])
    assert up.scale_up == [(ref, 5)]
    at_five = _held(serving_jobs(cluster(workload(deployment(5), five))))
    down = plan(cluster(workload(deployment(3), three)), at_five)
    assert (down.dispatch, down.delete, down.scale_up) == ([], [], [])
    assert down.scale_down == [(ref, 3)]
    label = actual[0]["metadata"]["labels"]["quartermaster.dev/admission"]
    assert down.shrinking == {label: 3}
    same = plan(cluster(workload(deployment(3), three)), actual)
    assert not (same.dispatch or same.delete or same.scale_up or same.scale_down)


def test_plan_deletes_the_object_of_a_placement_left_empty_and_of_a_stopped_workload() -> None:
    both = [replica(0, "c1-h100-i0"), replica(1, "c1-h100-i1")]
    actual = _held(serving_jobs(cluster(workload(deployment(2), both))))
    left = plan(cluster(workload(deployment(1), both[:1])), actual)
    i1 = next(
        o for o in actual if o["spec"]["template"]["spec"]["nodeSelector"][ISLAND].endswith("i1")
    )
    assert left.delete == [Ref.of(i1)] and not left.dispatch
    stopped = WorkloadView(
        "team-s", "web", "uid-web-0001", {}, {"state": "Cancelling", "replicaAdmissions": both}
    )
    gone = plan(cluster(stopped), actual)
    assert sorted(gone.delete) == sorted(Ref.of(o) for o in actual)
    assert plan(cluster(stopped), []).cancelled == ["team-s/web"]


def test_a_lws_group_takes_its_size_in_pods_when_shrinking() -> None:
    four = [replica(i, "c1-h100-i1", ("leader", "worker")) for i in range(4)]
    actual = _held(serving_jobs(cluster(workload(lws(4), four))))
    down = plan(cluster(workload(lws(1), four[:1])), actual)
    assert list(down.shrinking.values()) == [2]  # one group of size 2


def test_a_volcano_member_gets_a_podgroup_per_object_one_replica_at_least() -> None:
    four = [replica(i, "c1-h100-i1", ("leader", "worker")) for i in range(2)]
    want = desired_volcano(cluster(workload(lws(2), four), backend="volcano"))
    (obj,) = [o for o in want.jobs.values() if o["kind"] == "LeaderWorkerSet"]
    (group,) = want.groups.values()
    assert group["spec"]["minMember"] == 2  # one group's leader and worker
    assert group["spec"]["minResources"] == {GPU: "4"}  # 2 pod sets x 1 GPU x 2 groups
    for name in ("leaderTemplate", "workerTemplate"):
        pod = obj["spec"]["leaderWorkerTemplate"][name]
        assert pod["spec"]["schedulerName"] == "volcano"
        assert (
            pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"]
            == (group["metadata"]["name"])
        )
    assert QUEUE_LABEL not in obj["metadata"]["labels"]


def test_a_volcano_members_hypernode_island_pins_serving_pods_by_hostname() -> None:
    web = workload(deployment(2), [replica(0, "hn-a"), replica(1, "hn-a")])
    view = ClusterView(
        "c1",
        [web],
        FLAVORS,
        TOPOLOGIES,
        {"serve": CQ},
        backend="volcano",
        hyper_islands={"hn-a": ("node-1", "node-2")},
    )
    (obj,) = desired_volcano(view).jobs.values()
    spec = obj["spec"]["template"]["spec"]
    assert ISLAND not in spec["nodeSelector"]  # no such label: the HyperNode's nodes instead
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1", "node-2"]}
    ]
