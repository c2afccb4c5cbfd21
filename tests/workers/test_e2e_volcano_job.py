"""A Volcano Job from Volcano's own examples through the whole of
Quartermaster (issue 23): the API, Postgres, Redis, a Celery worker, the
scheduler and a stand-in member of either backend, each a process (tests/workers/stack/).

Two of Volcano's examples, each submitted as is over HTTP, admitted whole,
run as the JobSet of its tasks (docs/volcano.md; on a Volcano member its
pods the centre's PodGroup's, bound by the Volcano scheduler), their
GPU workers inside one fabric island, ending Completed there and Finished
(succeeded) at the centre:

* ``example/integrations/tensorflow/dist-mnist``: a parameter server and two
  workers, ``minAvailable: 3``; every pod ends by itself.
* ``example/integrations/mpi``: a master whose completion completes the job
  (``TaskCompleted`` → ``CompleteJob``) and two workers that would serve it
  for ever; the JobSet's success policy ends it when the master ends, and
  the workers are stopped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
import sqlalchemy as sa
from kubernetes import watch

from service.runtime.demo import StandIn
from tests.floor.test_workload_kinds import volcano_mpi, volcano_tf_mnist
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until
from tests.workers.stack import (
    FAST,
    GPU,
    ISLAND,
    MemberWatch,
    Stack,
    base_manifests,
    local_queue,
    pod_template,
    team_queue,
    write_fleet,
)

REQUIRED = "kueue.x-k8s.io/podset-required-topology"


def _task(gpus: int, ends: bool = True) -> dict[str, Any]:
    """A task's pod as the floor wants it, 30 s of simulated time (or, one
    that does not end by itself, a million); the GPU workers ask for one
    island, as Kueue's annotation says it."""
    requests = {"cpu": str(gpus or 2), "memory": f"{8 * (gpus or 2)}Gi", GPU: gpus}
    template = pod_template(requests, "30s" if ends else "1000000s")
    if gpus:
        template["metadata"]["annotations"][REQUIRED] = ISLAND
    return template


class JobSetWatch:
    """Every state of the member's JobSets seen through the official
    client's watch, so that one deleted once finished is still known."""

    def __init__(self, member: StandIn, kubeconfig: Path) -> None:
        new_client: Any = kubernetes.config.new_client_from_config
        self.api = new_client(config_file=str(kubeconfig), context=member.name)
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self) -> None:
        objects = kubernetes.client.CustomObjectsApi(self.api)
        args = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
        while not self.stop.is_set():
            watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in watcher.stream(
                    objects.list_cluster_custom_object, *args, timeout_seconds=5
                ):
                    obj = event["object"]
                    self.seen.setdefault(obj["metadata"]["name"], []).append(
                        json.loads(json.dumps(obj))
                    )
                    if self.stop.is_set():
                        break
            except kubernetes.client.exceptions.ApiException:
                self.stop.wait(0.5)

    def completed(self, name: str) -> dict[str, Any] | None:
        for obj in self.seen.get(name, ()):
            conditions = (obj.get("status") or {}).get("conditions") or ()
            if any(c["type"] == "Completed" and c["status"] == "True" for c in conditions):
                return obj
        return None

    def __enter__(self) -> JobSetWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.api.close()


@pytest.fixture
def stack(engine: sa.Engine, database_url: str, broker: str, tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, database_url, broker, FAST) as running:
        yield running


def _cluster(stack: Stack, name: str) -> dict[str, Any]:
    with stack.client() as api:
        response = api.get(f"/v1/clusters/{name}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _workload(api: httpx.Client, name: str) -> dict[str, Any]:
    response = api.get(f"/v1/namespaces/team-a/workloads/{name}")
    assert response.status_code == 200, response.text
    return dict(response.json())


@dataclass(frozen=True)
class Example:
    manifest: Callable[[Callable[..., dict[str, Any]]], dict[str, Any]]
    tasks: list[tuple[str, int]]
    """(task, pods) in order: the pod sets and the JobSet's replicated jobs."""
    ends_job: str
    """The task whose completion completes the job: the success target."""
    workers_end: bool
    """Whether the GPU workers end by themselves (else they are stopped)."""


EXAMPLES = {
    "tensorflow dist-mnist": Example(volcano_tf_mnist, [("ps", 1), ("worker", 2)], "worker", True),
    "mpi": Example(volcano_mpi, [("mpimaster", 1), ("mpiworker", 2)], "mpimaster", False),
}


@pytest.mark.parametrize("backend", ["kueue", "volcano"])
@pytest.mark.parametrize("example", EXAMPLES.values(), ids=list(EXAMPLES))
def test_a_volcano_example_runs_to_completed_on_a_member_of_either_backend(
    stack: Stack, tmp_path: Path, example: Example, backend: str
) -> None:
    # One member, two islands of two 8-GPU nodes; a queue of 32 GPUs.
    fleet = write_fleet(tmp_path / "fleet.yaml", {"m1": (2, 2)}, {"m1": backend})
    manifests = [*base_manifests(), team_queue("team-a", 32), local_queue("team-a", "team-a")]
    stack.start(fleet, 1, manifests, time_scale=0.01)
    vcjob = example.manifest(_task)
    vcjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "train"
    name = vcjob["metadata"]["name"]
    (member,) = stack.members
    with (
        MemberWatch(stack.members, stack.kubeconfig) as members,
        JobSetWatch(member, stack.kubeconfig) as jobsets,
        stack.client() as api,
    ):
        created = api.post("/v1/namespaces/team-a/workloads", json=vcjob)
        assert created.status_code == 201, created.text
        pod_sets = [(p["name"], p["count"]) for p in created.json()["spec"]["podSets"]]
        assert pod_sets == example.tasks
        try:
            wait_until(
                lambda: _workload(api, name)["status"].get("state") == "Finished",
                LONG_CEILING,
                "the Volcano Job finished",
                seen=lambda: _workload(api, name)["status"],
            )
            wait_until(lambda: jobsets.completed(name) is not None, LONG_CEILING, "Completed")
            # Its pods are all gone from the member, stopped or ended.
            wait_until(
                lambda: all(p.deleted for p in members.pods.values()), LONG_CEILING, "pods gone"
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from None
        status = _workload(api, name)["status"]
        ledger = api.get("/v1/ledger/entries", params={"kind": "workload.finished"}).json()
    assert status["admission"]["cluster"] == "m1"
    assert _cluster(stack, "m1")["status"]["backend"] == backend
    if backend == "kueue":
        (done,) = [c for c in status["conditions"] if c["type"] == "Finished"]
        assert done["message"] == "JobSet succeeded on cluster m1", done
    assert [e["body"]["outcome"] for e in ledger["items"]] == ["succeeded"]
    ran = jobsets.completed(name)
    assert ran is not None
    assert [r["name"] for r in ran["spec"]["replicatedJobs"]] == [t for t, _ in example.tasks]
    assert ran["spec"]["successPolicy"]["targetReplicatedJobs"] == [example.ends_job]
    schedulers = {
        r["template"]["spec"]["template"]["spec"].get("schedulerName", "default-scheduler")
        for r in ran["spec"]["replicatedJobs"]
    }
    # On a Volcano member its pods are the centre's PodGroup's, bound by volcano.
    assert schedulers == {"volcano" if backend == "volcano" else "default-scheduler"}
    # Every pod of every task ran; the workers in one island, stopped or ended.
    pods = [p for p in members.pods.values() if p.namespace == "team-a"]
    assert sorted(p.gpus for p in pods) == [0, 8, 8]
    assert all("Running" in p.phases for p in pods), [(p.name, p.phases) for p in pods]
    (head,) = [p for p in pods if not p.gpus]
    assert "Succeeded" in head.phases
    workers = [p for p in pods if p.gpus]
    assert all(("Succeeded" in p.phases) == example.workers_end for p in workers), [
        (p.name, p.phases) for p in workers
    ]
    islands = {members.node_island[("m1", str(p.node))] for p in workers}
    assignment = {a["name"]: a for a in status["admission"]["podSetAssignments"]}
    assert len(islands) == 1
    assert islands == set(assignment[example.tasks[1][0]]["islands"])
    assert not members.overcommits and not members.errors
