"""Least privilege on a Volcano member: the workers' token holds exactly the
rules ``deploy/member-volcano`` renders (``kubectl kustomize``), and the real
reconcile and sync run a Volcano member's road with them, under the
overlay's admission policy — a gang dispatched as its PodGroup and run to
its end, a preemption that deletes the victim's group, cancellations, a
stray group of ours collected, the deletion of the Cluster and the
collection of its mirror Queue (closed first, as Volcano requires) — with
nothing refused, and every Volcano grant used. The policy keeps everyone
else's work out of the mirror Queues, even in the moment of a dispatch."""

from __future__ import annotations

import collections
import json
import shutil
import threading
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


def _policies() -> list[dict[str, Any]]:
    """The overlay's admission policy and its binding, as rendered."""
    kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    found = [o for o in rendered(MEMBER_VOLCANO) if o["kind"] in kinds]
    assert len(found) == 2
    return found


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
    with members(tmp_path, backend="volcano", extra_objects=_policies()) as (c1,):
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
            with c1.api_client(token) as api:  # a leftover of the workers' own
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


FORBIDDEN = "403 Forbidden"


def _rival_group(name: str, queue: str = "qm-cq") -> dict[str, Any]:
    return {
        "apiVersion": VOLCANO,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"minMember": 1, "queue": queue, "minResources": {"nvidia.com/gpu": "8"}},
    }


def _create_group(api: kubernetes.client.ApiClient, body: dict[str, Any]) -> str:
    """How a PodGroup's creation is answered: ``201``, or the refusal's code and reason."""
    try:
        kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", "team-a", "podgroups", body
        )
    except kubernetes.client.ApiException as refused:
        return f"{refused.status} {json.loads(str(refused.body))['reason']}"
    return "201"


def test_the_policy_keeps_rivals_out_of_our_queues_even_while_we_dispatch(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    """A tenant of the member tries, all through the centre's dispatch of a
    gang (before the mirror Queue's capability is raised, between that and
    the gang's PodGroup, and after), to put a PodGroup in the mirror Queue:
    every try is refused (403), the gang runs whole, nothing but it is in the
    Queue; a Volcano Job or a Pod naming the Queue is refused the same; her
    groups in her own queue are hers to make."""
    with members(tmp_path, backend="volcano", extra_objects=_policies()) as (c1,):
        token = c1.add_user(WORKERS, workers_rules(rendered(MEMBER_VOLCANO)))
        tenant = c1.add_user("alice")
        setup_central(services, [], gpu_quota=16)
        body = cluster_body(c1)
        body["spec"]["credentials"] = {"token": token}
        services.resources.create(ADMIN, "clusters", "", body)
        with c1.api_client() as admin:  # the tenant's namespace is there before us
            kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": "team-a"}})
        stop, codes = threading.Event(), collections.Counter[str]()

        def rival() -> None:
            with c1.api_client(tenant) as api:
                while not stop.is_set():
                    codes[_create_group(api, _rival_group(f"rival-{sum(codes.values())}"))] += 1

        trying = threading.Thread(target=rival, daemon=True)
        trying.start()
        try:
            wait_for(lambda: codes[FORBIDDEN] > 0, 60, what="the rival refused before the dispatch")
            with scheduling(engine, settings(database_url, broker), send):
                services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
                wait_for(
                    lambda: workload_status(engine, "team-a", "a")["state"] == "Running",
                    90,
                    what="the gang Running",
                )
                before = codes[FORBIDDEN]
                wait_for(lambda: codes[FORBIDDEN] > before, 60, what="the rival refused after")
        finally:
            stop.set()
            trying.join(30)
        assert set(codes) == {FORBIDDEN}, codes
        assert [g["spec"]["queue"] for g in _groups(c1)] == ["qm-cq"]
        with c1.api_client(tenant) as api:
            assert _create_group(api, _rival_group("hers", "default")) == "201"
            custom = kubernetes.client.CustomObjectsApi(api)
            vcjob = {
                "apiVersion": "batch.volcano.sh/v1alpha1",
                "kind": "Job",
                "metadata": {"name": "sneak"},
                "spec": {
                    "queue": "qm-cq",
                    "minAvailable": 1,
                    "tasks": [{"name": "t", "replicas": 1, "template": _pod_template()}],
                },
            }
            with pytest.raises(kubernetes.client.ApiException) as refused:
                custom.create_namespaced_custom_object(
                    "batch.volcano.sh", "v1alpha1", "team-a", "jobs", vcjob
                )
            assert refused.value.status == 403
            pod = {
                "metadata": {
                    "name": "sneak",
                    "annotations": {"scheduling.volcano.sh/queue-name": "qm-cq"},
                },
                **_pod_template(),
            }
            with pytest.raises(kubernetes.client.ApiException) as refused:
                kubernetes.client.CoreV1Api(api).create_namespaced_pod("team-a", pod)
            assert refused.value.status == 403
            assert (
                "mirrors a Quartermaster ClusterQueue"
                in json.loads(str(refused.value.body))["message"]
            )


def _pod_template() -> dict[str, Any]:
    return {
        "spec": {
            "schedulerName": "volcano",
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}],
        }
    }
