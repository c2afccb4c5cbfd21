"""A Volcano Job from Volcano's own examples through the whole of
Quartermaster (issue 23): the API, Postgres, Redis, a Celery worker, the
scheduler and a stand-in Kueue member, each a process (tests/workers/stack/).

Volcano's ``example/integrations/tensorflow/dist-mnist`` (a parameter server
and two workers, ``minAvailable: 3``, the workers' completion ending the
job) is submitted as is over HTTP, admitted whole, run on the Kueue member
as the JobSet of its tasks (docs/volcano.md), its workers inside one fabric
island, and ends Completed there and Finished (succeeded) at the centre.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
import sqlalchemy as sa
from kubernetes import watch

from service.runtime.demo import StandIn
from tests.floor.test_workload_kinds import volcano_tf_mnist
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


def _task(gpus: int) -> dict[str, Any]:
    """A task's pod as the floor wants it, 30 s of simulated time; the GPU
    workers ask for one island, as Kueue's annotation says it."""
    requests = {"cpu": str(gpus or 2), "memory": f"{8 * (gpus or 2)}Gi", GPU: gpus}
    template = pod_template(requests, "30s")
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


def _workload(api: httpx.Client, name: str) -> dict[str, Any]:
    response = api.get(f"/v1/namespaces/team-a/workloads/{name}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_volcanos_tensorflow_example_runs_to_completed_on_a_kueue_member(
    stack: Stack, tmp_path: Path
) -> None:
    # One member, two islands of two 8-GPU nodes; a queue of 32 GPUs.
    fleet = write_fleet(tmp_path / "fleet.yaml", {"m1": (2, 2)})
    manifests = [*base_manifests(), team_queue("team-a", 32), local_queue("team-a", "team-a")]
    stack.start(fleet, 1, manifests, time_scale=0.01)
    vcjob = volcano_tf_mnist(_task)
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
        assert [(p["name"], p["count"]) for p in created.json()["spec"]["podSets"]] == [
            ("ps", 1),
            ("worker", 2),
        ]
        try:
            wait_until(
                lambda: _workload(api, name)["status"].get("state") == "Finished",
                LONG_CEILING,
                "the Volcano Job finished",
                seen=lambda: _workload(api, name)["status"],
            )
            wait_until(lambda: jobsets.completed(name) is not None, LONG_CEILING, "Completed")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from None
        status = _workload(api, name)["status"]
        ledger = api.get("/v1/ledger/entries", params={"kind": "workload.finished"}).json()
    assert status["admission"]["cluster"] == "m1"
    (done,) = [c for c in status["conditions"] if c["type"] == "Finished"]
    assert done["message"] == "JobSet succeeded on cluster m1", done
    assert [e["body"]["outcome"] for e in ledger["items"]] == ["succeeded"]
    ran = jobsets.completed(name)
    assert ran is not None
    assert [r["name"] for r in ran["spec"]["replicatedJobs"]] == ["ps", "worker"]
    assert ran["spec"]["successPolicy"]["targetReplicatedJobs"] == ["worker"]
    # Every pod of every task ran and succeeded; the workers in one island.
    pods = [p for p in members.pods.values() if p.namespace == "team-a"]
    assert sorted(p.gpus for p in pods) == [0, 8, 8]
    assert all("Succeeded" in p.phases for p in pods), [(p.name, p.phases) for p in pods]
    islands = {members.node_island[("m1", str(p.node))] for p in pods if p.gpus}
    assert len(islands) == 1 and islands == set(
        status["admission"]["podSetAssignments"][1]["islands"]
    )
    assert not members.overcommits and not members.errors
