"""The reconcile planner for a Volcano member, pure: Queue capability, PodGroups,
jobs scheduled by volcano, whole-group deletion, and the sync's reading of
PodGroup phases."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tests.workers.test_plan import GPU, ISLAND, _volcano_job, admitted, template, view
from workers.plan import (
    ADMISSION_LABEL,
    ClusterView,
    Ref,
    admission_id,
    close_command,
    plan,
    volcano_status,
)
from workers.records import ClusterRow
from workers.sync import asks_discovery

CQ_SPEC = {
    "resourceGroups": [
        {
            "coveredResources": ["cpu", "memory", GPU],
            "flavors": [{"name": "h100", "resources": []}],
        }
    ]
}


def volcano(*workloads: Any) -> ClusterView:
    return replace(view(*workloads), backend="volcano", cluster_queues={"cq": CQ_SPEC})


def island_gang(name: str, **kwargs: Any) -> Any:
    workload = admitted(name, **kwargs)
    pod_sets = [dict(ps, topologyRequest={"required": ISLAND}) for ps in workload.spec["podSets"]]
    return replace(workload, spec={**workload.spec, "podSets": pod_sets})


def test_the_queue_holds_exactly_what_the_centre_admitted_on_every_covered_resource() -> None:
    actions = plan(volcano(island_gang("a"), admitted("b", island="c1-h100-i1", count=1)), [])
    assert [o["kind"] for o in actions.apply] == ["Namespace", "PriorityClass", "Queue"]
    queue = actions.apply[2]
    assert queue["metadata"]["name"] == "qm-cq"
    # 3 pods of 8 GPUs and 8 cpu; memory is covered centrally but none admitted: 0
    assert queue["spec"]["capability"] == {"cpu": "24", "memory": "0", GPU: "24"}
    assert queue["spec"]["deserved"] == queue["spec"]["capability"]
    assert queue["spec"]["reclaimable"] is False
    assert not any(o["apiVersion"].startswith("kueue.x-k8s.io") for o in actions.apply)


def test_each_gang_gets_a_whole_podgroup_and_a_job_scheduled_by_volcano() -> None:
    a, b = island_gang("a"), admitted("b", island="c1-h100-i1", count=1)
    actions = plan(volcano(a, b), [])
    jobs = {j["metadata"]["name"]: j for j in actions.dispatch}
    groups = {g["metadata"]["name"]: g for g in actions.groups.values()}
    assert set(jobs) == set(groups) == {"a", "b"}
    assert groups["a"]["spec"] == {
        "minMember": 2,
        "minResources": {"cpu": "16", GPU: "16"},
        "queue": "qm-cq",
        "priorityClassName": "qm-p0",
        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
    }
    assert "networkTopology" not in groups["b"]["spec"]  # it asked for no island
    assert groups["a"]["metadata"]["labels"][ADMISSION_LABEL] == admission_id(a)
    pod = jobs["a"]["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "a"
    assert pod["spec"]["nodeSelector"][ISLAND] == "c1-h100-i0"
    assert "kueue.x-k8s.io/queue-name" not in jobs["a"]["metadata"]["labels"]
    assert actions.groups[str(Ref.of(jobs["a"]))] is groups["a"]


def test_a_volcano_jobs_group_starts_at_its_min_available_with_room_for_every_pod() -> None:
    """Volcano's example/job.yaml: six pods, ``minAvailable: 3``. The centre
    admits (and the Queue holds) all six; the group, as Volcano's job
    controller would make it, starts once three are bound, its
    ``minResources`` those three pods' requests, tasks in order."""
    manifest = _volcano_job()
    manifest["spec"]["minAvailable"] = 3
    manifest["spec"]["tasks"] = [
        {"replicas": 2, "name": "ps", "template": template()},
        {"replicas": 4, "name": "worker", "template": template()},
    ]
    workload = admitted("v", job=manifest)
    worker = workload.status["admission"]["podSetAssignments"][0]
    per_pod = {"cpu": "8", GPU: "8"}
    workload.status["admission"]["podSetAssignments"] = [
        {
            **worker,
            "name": name,
            "count": n,
            "resourceUsage": {r: str(int(q) * n) for r, q in per_pod.items()},
        }
        for name, n in (("ps", 2), ("worker", 4))
    ]
    actions = plan(volcano(workload), [])
    (group,) = actions.groups.values()
    assert group["spec"]["minMember"] == 3
    assert group["spec"]["minResources"] == {"cpu": "24", GPU: "24"}
    (queue,) = [o for o in actions.apply if o["kind"] == "Queue"]
    assert queue["spec"]["capability"][GPU] == "48"
    # Every other kind, and a Volcano Job asking for all its pods, starts whole.
    manifest["spec"]["minAvailable"] = 6
    (whole,) = plan(volcano(admitted("w", job=manifest)), []).groups.values()
    assert whole["spec"]["minMember"] == 2  # as admitted by this test's fixture


def test_a_preempted_gang_loses_job_and_podgroup_and_an_unused_queue_is_emptied() -> None:
    a = island_gang("a")
    first = plan(volcano(a), [])
    on_member = [*first.apply, *first.dispatch, *first.groups.values()]
    evicted = replace(a, status={**a.status, "state": "Evicted"})
    actions = plan(volcano(evicted), on_member)
    assert sorted(str(r) for r in actions.delete) == ["Job team-a/a", "PodGroup team-a/a"]
    assert actions.draining == [admission_id(a)]
    assert [r.kind for r in actions.collect] == ["PriorityClass"]
    (queue,) = [o for o in actions.apply if o["kind"] == "Queue"]
    assert queue["spec"]["capability"] == {"cpu": "0", "memory": "0", GPU: "0"}
    assert not actions.dispatch


def test_podgroup_phases_read_as_the_same_phases_as_kueue_members() -> None:
    job: dict[str, Any] = {"status": {}}

    def group(phase: str, **status: Any) -> dict[str, Any]:
        return {"status": {"phase": phase, **status}}

    assert volcano_status(job, None)["phase"] == "Pending"
    assert volcano_status(job, group("Pending"))["phase"] == "Pending"
    assert volcano_status(job, group("Inqueue"))["phase"] == "Pending"
    assert volcano_status(job, group("Running"))["phase"] == "Running"
    assert volcano_status(job, group("Completed", succeeded=2))["phase"] == "Succeeded"
    assert volcano_status(job, group("Completed", failed=1))["phase"] == "Failed"
    unknown = volcano_status(job, group("Unknown"))
    assert (unknown["phase"], unknown["reason"]) == ("Evicted", "PodGroupUnknown")
    ended = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "X"}]}}
    assert volcano_status(ended, group("Running"))["phase"] == "Failed"  # the job's end first


def test_a_queue_is_closed_by_a_command_its_controller_can_match_to_it() -> None:
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "qm-cq", "uid": "u-1"},
    }
    command = close_command(queue)
    assert command["action"] == "CloseQueue"
    assert command["target"] == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "name": "qm-cq",
        "uid": "u-1",
        "controller": True,
    }
    assert command["metadata"]["ownerReferences"] == [command["target"]]
    # The same name each attempt: asked again before it was taken, it is one Command.
    assert (
        close_command(queue)["metadata"]["name"]
        == command["metadata"]["name"]
        == ("qm-cq-closequeue")
    )


def _row(spec: dict[str, Any], status: dict[str, Any]) -> ClusterRow:
    return ClusterRow(
        "c1", "uid", 1, 1, {}, {}, spec, status, None, datetime.now(UTC), deleted=False
    )


def test_discovery_is_asked_while_nothing_is_known_and_again_after_a_loss() -> None:
    assert asks_discovery(_row({}, {}))
    assert not asks_discovery(_row({}, {"backend": "kueue", "state": "Ready"}))
    assert asks_discovery(_row({}, {"backend": "kueue", "state": "Lost"}))
    assert not asks_discovery(_row({"backend": "kueue"}, {"state": "Lost"}))
