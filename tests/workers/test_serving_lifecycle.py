"""The lifecycle of a serving workload's replicas as the member side moves
it (service/app/lifecycle.py): available replicas per cluster and Running
once all admitted are; a lost cluster releasing only its own replicas."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from service.app import lifecycle
from service.app.lifecycle import Status, Subject

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
WHO = Subject("serve", "web", "2f1c0f4e-0000-4000-8000-000000000001", "serve")


def replica(index: int, cluster: str) -> dict[str, Any]:
    return {
        "replica": index,
        "admittedAt": "2026-03-01T11:00:00Z",
        "admission": {
            "id": f"00000000-0000-4000-8000-{index:012d}",
            "clusterQueue": "serve",
            "cluster": cluster,
            "podSetAssignments": [
                {"name": "main", "count": 1, "flavors": {GPU: "h100"}, "resourceUsage": {GPU: "1"}}
            ],
        },
    }


def serving(state: str, *clusters: str, **more: Any) -> Status:
    replicas = [replica(i, c) for i, c in enumerate(clusters)]
    return Status({"state": state, "replicaAdmissions": replicas, **more})


def test_running_once_every_admitted_replica_is_available_across_clusters() -> None:
    status = serving("Admitted", "c1", "c1", "c2")
    partial = lifecycle.replicas_available(status, "c1", 2, NOW)
    assert partial is not None and partial.event == "WorkloadReplicasAvailable"
    assert partial.status.state == "Admitted"
    assert partial.status.raw["availableByCluster"] == {"c1": 2}
    assert lifecycle.replicas_available(partial.status, "c1", 2, NOW) is None  # unchanged
    whole = lifecycle.replicas_available(partial.status, "c2", 1, NOW)
    assert whole is not None and whole.event == "WorkloadRunning"
    assert whole.status.state == "Running" and whole.status.raw["availableReplicas"] == 3


def test_a_running_serving_workload_that_loses_replicas_stays_running_and_never_ends() -> None:
    running = serving("Running", "c1", "c1", availableByCluster={"c1": 2}, availableReplicas=2)
    fewer = lifecycle.replicas_available(running, "c1", 0, NOW)
    assert fewer is not None and fewer.status.state == "Running"
    assert (
        fewer.status.raw["availableReplicas"] == 0 and fewer.status.raw["availableByCluster"] == {}
    )


def test_a_lost_cluster_releases_its_replicas_each_with_its_close() -> None:
    status = serving("Running", "c1", "c2", "c1", availableByCluster={"c1": 2, "c2": 1})
    change = lifecycle.lose_cluster(WHO, status, "c1", "ClusterLost", "c1 lost", NOW)
    assert change is not None and change.event == "WorkloadRequeued"
    left = change.status.raw
    assert [r["admission"]["cluster"] for r in left["replicaAdmissions"]] == ["c2"]
    assert left["admittedReplicas"] == 1 and left["availableByCluster"] == {"c2": 1}
    assert change.status.state == "Running"  # its replica in c2 still serves
    assert [e.kind for e in change.entries] == ["workload.evicted", "workload.evicted"]
    assert all(e.body["released"] == {"h100": {GPU: 1}} for e in change.entries)
    ids = {e.entry_id for e in change.entries}
    expected = {lifecycle.closing_entry_id(WHO.uid, replica(i, "c1")["admission"]) for i in (0, 2)}
    assert ids == expected  # each replica's own close: a second loss writes none again
    assert lifecycle.lose_cluster(WHO, change.status, "c1", "ClusterLost", "again", NOW) is None


def test_the_last_replicas_lost_make_it_pending_or_a_cancelling_one_cancelled() -> None:
    alone = lifecycle.lose_cluster(WHO, serving("Running", "c1"), "c1", "ClusterLost", "m", NOW)
    assert alone is not None and alone.status.state == "Pending"
    assert alone.status.raw["queuedAt"] == "2026-03-01T12:00:00Z"
    stopping = serving("Cancelling", "c1")
    done = lifecycle.lose_cluster(WHO, stopping, "c1", "ClusterLost", "m", NOW)
    assert done is not None and (done.event, done.status.state) == (
        "WorkloadCancelled",
        "Cancelled",
    )


def test_cancelling_closes_each_clusters_replicas_and_ends_when_none_is_left() -> None:
    stopping = serving("Cancelling", "c1", "c2", "c1")
    first = lifecycle.cancel_replicas(WHO, stopping, "c1", NOW)
    assert first.status.state == "Cancelling"  # c2 still removes its object
    assert [e.kind for e in first.entries] == ["workload.finished"] * 2
    assert all(e.body["outcome"] == "cancelled" for e in first.entries)
    assert all(e.body["gpu_seconds"] == 3600.0 for e in first.entries)  # an hour, one GPU
    last = lifecycle.cancel_replicas(WHO, first.status, "c2", NOW)
    assert last.status.state == "Cancelled" and last.status.raw["replicaAdmissions"] == []
    ids = {e.entry_id for e in (*first.entries, *last.entries)}
    assert len(ids) == 3  # one close per replica
