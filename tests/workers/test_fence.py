"""The fence agent against a stand-in member, with the RBAC of its manifests
(deploy/member/fence-agent) and a fake monotonic clock; the centre's
heartbeat written by the centre's own code (workers/fence.py); the settings'
arithmetic; and the kustomize base rendered by kubectl."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from sim.kubesim.testing import RunningCluster, running_cluster
from tests.workers.conftest import wait_for
from workers import fence
from workers.clusters import Member
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "member" / "fence-agent"
FLEET = ROOT / "sim" / "fleets" / "demo.yaml"


class Clock:
    """A monotonic clock and a wall clock that a test moves."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.at = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> float:
        return self.mono

    def wall(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.at += timedelta(seconds=seconds)


def agent_rules() -> list[dict[str, Any]]:
    """The rules of the base's Role (bound in its namespace) and ClusterRole,
    as the stand-in's allow-list takes them."""
    rules: list[dict[str, Any]] = []
    for name in ("role.yaml", "clusterrole.yaml"):
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            if doc["kind"] == "Role":
                rules += [{**r, "namespaces": [fence.NAMESPACE]} for r in doc["rules"]]
            elif doc["kind"] == "ClusterRole":
                rules += doc["rules"]
    return rules


def job(name: str, namespace: str, managed: bool) -> dict[str, Any]:
    labels = {"quartermaster.dev/managed": "true"} if managed else {"team": "other"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "template": {
                "metadata": {"annotations": {"quartermaster.dev/sim-duration": "1h"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "x",
                            "resources": {"requests": {"cpu": "1"}},
                        }
                    ],
                },
            }
        },
    }


@pytest.fixture
def member() -> Iterator[tuple[RunningCluster, Member]]:
    with running_cluster(FLEET, name="east-1", time_scale=1.0) as cluster:
        centre = Member("east-1", cluster.configuration())
        try:
            yield cluster, centre
        finally:
            centre.close()


def _jobs(api: Any) -> set[str]:
    batch: Any = kubernetes.client.BatchV1Api(api)
    return {str(j.metadata.name) for j in batch.list_job_for_all_namespaces().items}


def _running_pods(api: Any, selector: str) -> int:
    core: Any = kubernetes.client.CoreV1Api(api)
    pods = core.list_pod_for_all_namespaces(label_selector=selector).items
    return sum(1 for p in pods if p.status.phase == "Running")


def test_agent_deletes_only_our_jobs_once_the_heartbeat_is_older_than_the_fence_time(
    member: tuple[RunningCluster, Member],
) -> None:
    cluster, centre = member
    clock = Clock()
    with cluster.api_client() as admin:
        core: Any = kubernetes.client.CoreV1Api(admin)
        core.create_namespace({"metadata": {"name": "team-a"}})
        batch: Any = kubernetes.client.BatchV1Api(admin)
        batch.create_namespaced_job("team-a", job("ours", "team-a", managed=True))
        batch.create_namespaced_job("team-a", job("theirs", "team-a", managed=False))
        wait_for(lambda: _running_pods(admin, "job-name") == 2, 60)
        # The namespace comes from the centre's first write, as on a member
        # where the centre writes before the agent is installed.
        fence.renew(centre, 30, clock.wall())
        token = cluster.add_user("fence-agent", agent_rules())
        with cluster.api_client(token) as api:
            agent = fence.FenceAgent(api, poll=1, clock=clock, wall=clock.wall)
            first = agent.step()
            assert first.heartbeat and first.fence == 30 and not first.fenced
            clock.advance(29)
            assert not agent.step().fenced
            fence.renew(centre, 30, clock.wall())  # renewed: the count starts again
            clock.advance(29)
            assert agent.step().age == pytest.approx(0)
            assert _jobs(admin) == {"ours", "theirs"}
            clock.advance(31)
            stale = agent.step()
            assert stale.fenced and stale.deleted == 1 and stale.age == pytest.approx(31)
            assert _jobs(admin) == {"theirs"}
            wait_for(lambda: _running_pods(admin, "job-name=ours") == 0, 60)
            assert _running_pods(admin, "job-name=theirs") == 1
            # What the centre reads back: an agent reporting, and fencing.
            policy = fence.FencePolicy(seconds=30, margin=10, poll=1, heartbeat_interval=5)
            seen = fence.status(None, fence.agent_lease(centre), policy, clock.wall())
            assert seen["agent"]["reporting"] and seen["agent"]["fenced"]
            assert seen["guaranteed"], seen
            fence.renew(centre, 30, clock.wall())  # the partition healed
            assert not agent.step().fenced


def test_a_restarted_agent_resumes_its_count_instead_of_starting_afresh(
    member: tuple[RunningCluster, Member],
) -> None:
    cluster, centre = member
    clock = Clock()
    fence.renew(centre, 30, clock.wall())
    token = cluster.add_user("fence-agent", agent_rules())
    with cluster.api_client(token) as api:
        assert not fence.FenceAgent(api, poll=1, clock=clock, wall=clock.wall).step().fenced
        clock.advance(20)
        # A new process: its monotonic clock knows nothing of the old one.
        clock.mono = 5.0
        again = fence.FenceAgent(api, poll=1, clock=clock, wall=clock.wall).step()
        assert again.age == pytest.approx(20) and not again.fenced
        clock.advance(11)
        assert fence.FenceAgent(api, poll=1, clock=clock, wall=clock.wall).step().fenced


def test_a_member_without_an_agent_is_reported_as_unguarded(
    member: tuple[RunningCluster, Member],
) -> None:
    _, centre = member
    policy = fence.FencePolicy(seconds=30, margin=10, poll=1, heartbeat_interval=5)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    seen = fence.status(None, fence.agent_lease(centre), policy, now)
    assert seen["guaranteed"] is False and seen["reason"] == "NoFenceAgent"
    assert seen["agent"] == {"reporting": False}


def test_the_centre_writes_and_requeues_only_within_its_promise() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    policy = fence.FencePolicy(seconds=30, margin=10, window=20, attempt=5, poll=1)
    promise = fence.status(None, None, policy, now)
    assert fence.may_write(promise, 5, now + timedelta(seconds=15))
    assert not fence.may_write(promise, 5, now + timedelta(seconds=15.1))
    # Requeue: past the promise by more than the fence time and the margin.
    assert not fence.may_requeue(promise, policy, now + timedelta(seconds=20 + 40))
    assert fence.may_requeue(promise, policy, now + timedelta(seconds=20 + 40.1))
    assert fence.may_requeue({}, policy, now)  # no heartbeat ever written


def test_settings_keep_the_fence_inside_the_lease() -> None:
    defaults = WorkerSettings()
    # 900 s lease - 120 s margin - (2 x 30 s heartbeats + 5 s + 30 s timeouts).
    assert defaults.fence_seconds == pytest.approx(685)
    with pytest.raises(ValueError, match="QM_CLUSTER_LEASE"):
        WorkerSettings(fence_time=800)
    with pytest.raises(ValueError, match="QM_FENCE_MARGIN"):
        WorkerSettings(fence_margin=30)
    assert WorkerSettings(cluster_lease=60, heartbeat_interval=2).fence_seconds == 0


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_base_renders_an_agent_with_exactly_its_rules() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(BASE)], check=True, capture_output=True, text=True
    ).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered)}
    name = "quartermaster-fence-agent"
    assert set(docs) == {
        ("Namespace", fence.NAMESPACE),
        ("ServiceAccount", name),
        ("Role", name),
        ("RoleBinding", name),
        ("ClusterRole", name),
        ("ClusterRoleBinding", name),
        ("Deployment", name),
    }
    for kind in ("ServiceAccount", "Role", "RoleBinding", "Deployment"):
        assert docs[(kind, name)]["metadata"]["namespace"] == fence.NAMESPACE
    pod = docs[("Deployment", name)]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name
    assert pod["containers"][0]["command"] == ["quartermaster", "fence-agent"]
    verbs = {
        (g, r, v)
        for kind in ("Role", "ClusterRole")
        for rule in docs[(kind, name)]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert not {v for _, _, v in verbs} & {"*", "update", "delete", "watch", "escalate"}
    assert {r for _, r, _ in verbs} == {
        "leases",
        "jobs",
        "jobsets",
        "pytorchjobs",
        "mpijobs",
        "rayjobs",
        "rayclusters",
        "deployments",
        "statefulsets",
        "leaderworkersets",
    }
