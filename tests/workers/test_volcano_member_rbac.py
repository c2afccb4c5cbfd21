"""Least privilege on a Volcano member: the workers' token holds exactly the
rules ``deploy/member-volcano`` renders (``kubectl kustomize``), and the real
reconcile and sync run a Volcano member's road with them — a gang dispatched
as its PodGroup and run to its end, a preemption that deletes the victim's
group, cancellations, a stray group of ours collected, the deletion of the
Cluster and the collection of its mirror Queue (closed first, as Volcano
requires) — with nothing refused, and every Volcano grant used."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import sqlalchemy as sa

from service.app.bootstrap import Services
from sim.kubesim.auth import grants
from sim.kubesim.testing import RunningCluster
from tests.deploy.member_world import ROOT, WORKERS, rendered, workers_rules
from tests.workers.conftest import ADMIN, wait_for, workload_status
from tests.workers.members import cluster_body, gang, members, scheduling, settings, setup_central
from workers.outbox import Send

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")

MEMBER_VOLCANO = ROOT / "deploy" / "member-volcano"
VOLCANO = "scheduling.volcano.sh/v1beta1"
#: The API groups of what only a Volcano member is reconciled to.
VOLCANO_GROUPS = frozenset(
    {"scheduling.volcano.sh", "topology.volcano.sh", "scheduling.k8s.io", "bus.volcano.sh"}
)


def _groups(cluster: RunningCluster) -> list[dict[str, Any]]:
    with cluster.api_client() as api:
        found = kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(
            "scheduling.volcano.sh", "v1beta1", "podgroups"
        )
    return list(found["items"])


def test_the_overlay_adds_only_volcano_grants_to_the_member_base() -> None:
    base = {
        (g["apiGroups"][0], g["resources"][0], g["verbs"][0])
        for g in grants(workers_rules(rendered()))
    }
    every = [
        (g["apiGroups"][0], g["resources"][0], g["verbs"][0])
        for g in grants(workers_rules(rendered(MEMBER_VOLCANO)))
    ]
    assert len(every) == len(set(every)), "a grant given twice"
    added = set(every) - base
    assert added and {group for group, _, _ in added} == VOLCANO_GROUPS
    assert base <= set(every)
    assert all("*" not in grant for grant in every)


def test_the_workers_run_a_volcano_members_road_with_exactly_its_rules(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    rules = workers_rules(rendered(MEMBER_VOLCANO))
    with members(tmp_path, backend="volcano") as (c1,):
        token = c1.add_user(WORKERS, rules)
        setup_central(
            services, [], gpu_quota=16, preemption={"withinClusterQueue": "LowerPriority"}
        )
        body = cluster_body(c1)
        body["spec"]["credentials"] = {"token": token}
        services.resources.create(ADMIN, "clusters", "", body)
        services.resources.create(
            ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000}
        )
        state = lambda name: workload_status(engine, "team-a", name)["state"]  # noqa: E731
        with scheduling(engine, settings(database_url, broker), send):
            services.submissions.submit(ADMIN, "team-a", gang("first", duration="10s"))
            wait_for(lambda: state("first") == "Finished", 90, what="first Finished")
            services.submissions.submit(ADMIN, "team-a", gang("low", duration="100000s"))
            wait_for(lambda: state("low") == "Running", 90, what="low Running")
            urgent = gang("high", duration="100000s", priorityClassName="urgent")
            services.submissions.submit(ADMIN, "team-a", urgent)
            wait_for(lambda: state("high") == "Running", 90, what="the preemptor Running")
            assert state("low") == "Pending"
            for name in ("high", "low"):
                services.submissions.cancel(ADMIN, "team-a", name)
            wait_for(lambda: not _groups(c1), 90, what="the groups gone")
            wait_for(
                lambda: {state("high"), state("low")} <= {"Cancelled", "Finished"},
                90,
                what="both released",
            )
            stray = {
                "apiVersion": VOLCANO,
                "kind": "PodGroup",
                "metadata": {
                    "name": "stray",
                    "namespace": "team-a",
                    "labels": {"quartermaster.dev/managed": "true"},
                },
                "spec": {"minMember": 1, "queue": "qm-cq"},
            }
            with c1.api_client() as api:
                kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                    "scheduling.volcano.sh", "v1beta1", "team-a", "podgroups", stray
                )
            wait_for(lambda: not _groups(c1), 90, what="the stray group collected")
            assert c1.get(VOLCANO, "Queue", "", "qm-cq") is not None
            services.resources.delete(ADMIN, "clusters", "", "c1", None)
            wait_for(
                lambda: c1.get(VOLCANO, "Queue", "", "qm-cq") is None, 90, what="the mirror gone"
            )
        refused = [r for r in c1.audit(WORKERS) if r.code == 403]
        assert refused == []
        unused = [
            (g["apiGroups"][0], g["resources"][0], g["verbs"][0])
            for g in c1.run(c1.cluster.auth.unused_rules, WORKERS)
            if g["apiGroups"][0] in VOLCANO_GROUPS
        ]
        assert unused == [], unused
