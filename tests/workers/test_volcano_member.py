"""Reconcile and sync against a stand-in Volcano member over HTTPS through the
official client: real Postgres, the admission leader and the fleet loop in
process. The member is told apart by discovery (its Cluster names no backend),
mirrored by a Volcano Queue whose capability is what the centre admitted, and
runs each gang as a PodGroup bound whole by its Volcano-like scheduler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from service.app.bootstrap import Services
from sim.kubesim.testing import RunningCluster
from tests.workers.conftest import ADMIN, GPU, wait_for, workload_status
from tests.workers.members import (
    ISLAND,
    gang,
    job,
    ledger,
    members,
    scheduling,
    settings,
    setup_central,
)
from workers.outbox import Send

VOLCANO = "scheduling.volcano.sh/v1beta1"


def _group(cluster: RunningCluster, name: str, namespace: str = "team-a") -> Any:
    return cluster.get(VOLCANO, "PodGroup", namespace, name)


def _queue(cluster: RunningCluster, name: str = "qm-cq") -> Any:
    return cluster.get(VOLCANO, "Queue", "", name)


def _pods(cluster: RunningCluster, workload: str) -> list[dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        resource = cluster.cluster.core.for_kind("v1", "Pod")
        return [
            dict(p)
            for p in cluster.cluster.store.items(resource.rtype)
            if (p["metadata"].get("labels") or {}).get("quartermaster.dev/workload")
            == f"team-a.{workload}"
        ]

    return cluster.run(read)


def _node_labels(cluster: RunningCluster, node: str) -> dict[str, str]:
    found = cluster.get("v1", "Node", "", node)
    assert found is not None
    return dict(found["metadata"].get("labels") or {})


def test_a_gang_runs_as_a_whole_podgroup_in_its_island_and_finishes(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path, backend="volcano") as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        with scheduling(engine, settings(database_url, broker), send) as scheduler:
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="300s"))
            services.submissions.submit(ADMIN, "team-a", gang("b", duration="300s"))
            created = wait_for(lambda: job(c1, "a"), 60)
            cluster = services.resources.get(ADMIN.principal, "clusters", "", "c1")
            assert cluster["status"]["backend"] == "volcano"  # discovered, recorded
            fleet = scheduler.fleet
            assert fleet is not None  # its watch follows PodGroups, not Kueue Workloads
            wait_for(lambda: fleet.watches["c1"][1].kinds == ("Node", "PodGroup"), 60)
            wait_for(lambda: all(s.version for s in fleet.watches["c1"][1].streams), 60)
            status = workload_status(engine, "team-a", "a")
            island = status["admission"]["island"]
            pod = created["spec"]["template"]
            assert pod["spec"]["schedulerName"] == "volcano"
            assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "a"
            assert pod["spec"]["nodeSelector"][ISLAND] == island
            assert "kueue.x-k8s.io/queue-name" not in created["metadata"]["labels"]
            group = _group(c1, "a")
            assert group is not None
            assert group["spec"]["minMember"] == 2
            assert group["spec"]["queue"] == "qm-cq"
            assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
            assert group["spec"]["minResources"][GPU] in (16, "16")
            queue = _queue(c1)
            assert queue is not None and queue["spec"]["capability"][GPU] in (16, "16")
            assert workload_status(engine, "team-a", "b")["state"] == "Pending"  # no quota
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            pods = _pods(c1, "a")
            assert len(pods) == 2
            assert {_node_labels(c1, p["spec"]["nodeName"])[ISLAND] for p in pods} == {island}
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Finished", 60)
            # quota released: b runs; a's job and PodGroup are collected
            wait_for(lambda: job(c1, "b"), 60)
            wait_for(lambda: job(c1, "a") is None and _group(c1, "a") is None, 60)
            wait_for(lambda: workload_status(engine, "team-a", "b")["state"] == "Finished", 60)
            # Kept, since Volcano deletes only Closed queues, but emptied.
            wait_for(lambda: set(_queue(c1)["spec"]["capability"].values()) <= {0, "0"}, 60)
    finished = ledger(engine, "workload.finished")
    assert [f["workload"] for f in finished] == ["a", "b"]
    assert all(f["outcome"] == "succeeded" and f["cluster"] == "c1" for f in finished)


def _watch_groups(cluster: RunningCluster, stop: threading.Event) -> Callable[[], list[set[str]]]:
    """Samples of which workloads have pods bound on ``cluster``."""
    samples: list[set[str]] = []

    def run() -> None:
        while not stop.is_set():

            def read() -> set[str]:
                resource = cluster.cluster.core.for_kind("v1", "Pod")
                return {
                    str((p["metadata"].get("labels") or {}).get("quartermaster.dev/workload"))
                    for p in cluster.cluster.store.items(resource.rtype)
                    if p["spec"].get("nodeName")
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                }

            samples.append(cluster.run(read))
            time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result() -> list[set[str]]:
        stop.set()
        thread.join(5)
        return samples

    return result


def test_preemption_deletes_the_whole_group_before_the_preemptor_starts(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path, backend="volcano") as (c1,):
        setup_central(
            services, [c1], gpu_quota=16, preemption={"withinClusterQueue": "LowerPriority"}
        )
        services.resources.create(
            ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000}
        )
        stop = threading.Event()
        samples = _watch_groups(c1, stop)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("low", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "low")["state"] == "Running", 60)
            services.submissions.submit(
                ADMIN, "team-a", gang("high", duration="100000s", priorityClassName="urgent")
            )
            wait_for(lambda: workload_status(engine, "team-a", "high")["state"] == "Running", 60)
            wait_for(lambda: workload_status(engine, "team-a", "low")["state"] == "Pending", 60)
            seen = samples()
            assert job(c1, "low") is None and _group(c1, "low") is None
            high = _group(c1, "high")
            assert high is not None and high["spec"]["priorityClassName"] == "qm-p1000"
            pc = c1.get("scheduling.k8s.io/v1", "PriorityClass", "", "qm-p1000")
            assert pc is not None and pc["value"] == 1000
    assert any("team-a.low" in s for s in seen) and any("team-a.high" in s for s in seen)
    assert not any({"team-a.low", "team-a.high"} <= s for s in seen), "victim beside preemptor"
    assert [p["workload"] for p in ledger(engine, "workload.preempted")] == ["low"]


def test_a_rival_podgroup_in_our_queue_gets_none_of_the_centres_capacity(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """A PodGroup created on the member behind the centre's back, in the
    member Queue that mirrors ``cq``, stays Pending (NotInqueueable) while the
    centre's gang runs; the gang runs all the same. Created once the centre's
    group holds the queue, on a member without the overlay's admission
    policy: before that moment only the policy keeps a rival out
    (test_volcano_member_rbac.py; docs/volcano.md, "The dispatch window")."""
    with members(tmp_path, backend="volcano") as (c1,):
        setup_central(services, [c1], gpu_quota=32)
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            rival = {
                "apiVersion": VOLCANO,
                "kind": "PodGroup",
                "metadata": {"name": "rival", "namespace": "team-a"},
                "spec": {
                    "minMember": 1,
                    "queue": "qm-cq",
                    "minResources": {"cpu": "1", "memory": "1Gi", GPU: "8"},
                },
            }
            c1.run(lambda: c1.cluster.apply_object(rival))

            def refused() -> bool:
                status = (_group(c1, "rival") or {}).get("status") or {}
                return status.get("phase") == "Pending" and any(
                    c.get("reason") == "NotInqueueable" for c in status.get("conditions") or ()
                )

            wait_for(refused, 60)
            queue = _queue(c1)
            assert queue["spec"]["capability"][GPU] in (16, "16")
            # It stays out: the queue holds exactly the centre's gang.
            time.sleep(1)
            assert refused()
            assert _group(c1, "a")["status"]["phase"] == "Running"


def _hypernode(name: str, member: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": {"tier": 1, "members": [{"type": "Node", "selector": member}]},
    }


#: Tier-1 domains across the fabric-block labels: each takes the n0 (or n1)
#: node of both label islands, so a gang placed by them straddles the labels.
HYPERNODES = [
    _hypernode("hn-x", {"regexMatch": {"pattern": "c1-h100-i[01]-n0"}}),
    _hypernode(
        "hn-y", {"labelMatch": {"matchLabels": {"kubernetes.io/hostname": "c1-h100-i0-n1"}}}
    ),
    _hypernode("hn-z", {"exactMatch": {"name": "c1-h100-i1-n1"}}),
]


def test_tier_one_hypernodes_are_the_islands_and_a_gang_lands_in_one(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path, backend="volcano", extra_objects=HYPERNODES) as (c1,):
        setup_central(services, [c1], gpu_quota=32)
        with scheduling(engine, settings(database_url, broker), send):

            def islands() -> dict[str, str]:
                cluster = services.resources.get(ADMIN.principal, "clusters", "", "c1")
                nodes = ((cluster.get("status") or {}).get("inventory") or {}).get("nodes") or []
                return {n["name"]: n["island"] for n in nodes if n.get("islandFrom") == "HyperNode"}

            wait_for(lambda: len(islands()) == 4, 60)
            assert islands() == {
                "c1-h100-i0-n0": "hn-x",
                "c1-h100-i1-n0": "hn-x",
                "c1-h100-i0-n1": "hn-y",
                "c1-h100-i1-n1": "hn-z",
            }
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            assert workload_status(engine, "team-a", "a")["admission"]["island"] == "hn-x"
            created = job(c1, "a")
            assert created is not None
            spec = created["spec"]["template"]["spec"]
            assert ISLAND not in spec["nodeSelector"]  # no label names a HyperNode
            (term,) = spec["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            assert term["matchExpressions"][-1]["values"] == ["c1-h100-i0-n0", "c1-h100-i1-n0"]
            nodes = {p["spec"]["nodeName"] for p in _pods(c1, "a")}
            assert nodes == {"c1-h100-i0-n0", "c1-h100-i1-n0"}
