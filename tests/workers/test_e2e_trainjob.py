"""A TrainJob end to end through the real processes (issue 22): its runtime
registered over HTTP as Kubeflow Trainer writes it, the TrainJob submitted over
HTTP, admitted as the JobSet the runtime describes (``trainer-node`` of
``numNodes`` pods), run by the stand-in Kueue member's JobSet controller, and
finished ``succeeded``, its usage in the ledger.

The runtime is Trainer's ``torch-distributed`` ClusterTrainingRuntime and the
TrainJob its ``pytorch`` example, with a trainer pod that passes the security
floor and a simulated run time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.waiting import LONG_CEILING, wait_for
from tests.workers.stack import (
    FAST,
    GPU,
    ISLAND,
    Stack,
    base_manifests,
    local_queue,
    pod_template,
    team_queue,
    write_fleet,
)
from tests.workers.test_e2e_rayjob import _ledger, _status

NS = "team-a"


def torch_distributed() -> dict[str, Any]:
    trainer = pod_template({"cpu": "8", "memory": "64Gi"}, "400s")
    trainer["spec"]["containers"][0]["name"] = "trainer"
    trainer["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] = ISLAND
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": "trainer-node", "template": {"spec": {"template": trainer}}}
                    ]
                }
            },
        },
    }


def pytorch_simple() -> dict[str, Any]:
    per_node = {"requests": {"cpu": "8", "memory": "64Gi", GPU: 8}, "limits": {GPU: 8}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "pytorch-simple", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": per_node},
        },
    }


@pytest.fixture
def stack(engine: sa.Engine, database_url: str, broker: str, tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, database_url, broker, FAST) as running:
        yield running


def test_a_trainjob_runs_as_its_runtimes_jobset_to_succeeded(
    stack: Stack, engine: sa.Engine, tmp_path: Path
) -> None:
    fleet = write_fleet(tmp_path / "fleet.yaml", {"m1": (2, 2)})
    manifests = [*base_manifests(), team_queue(NS, 32), local_queue(NS, NS)]
    stack.start(fleet, 1, manifests, time_scale=0.01)
    with stack.client() as api:
        registered = api.post("/v1/clustertrainingruntimes", json=torch_distributed())
        assert registered.status_code == 201, registered.text
        response = api.post(f"/v1/namespaces/{NS}/workloads", json=pytorch_simple())
        assert response.status_code == 201, response.text
        spec = response.json()["spec"]
        assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("trainer-node", 2)]
        assert spec["job"]["kind"] == "JobSet"
    try:
        finished = wait_for(
            lambda: (
                _status(engine, "pytorch-simple").get("state") == "Finished"
                and _status(engine, "pytorch-simple")
            ),
            LONG_CEILING,
            "the TrainJob finished",
            seen=lambda: _status(engine, "pytorch-simple"),
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{stack.logs()}") from None
    assert finished["outcome"] == "succeeded", finished
    assert finished["admission"]["cluster"] == "m1"
    ledger = [(k, b) for k, b in _ledger(engine, "pytorch-simple")]
    decisions = [(k, b) for k, b in ledger if k in ("workload.admitted", "workload.finished")]
    assert [k for k, _ in decisions] == ["workload.admitted", "workload.finished"], ledger
    assert decisions[1][1]["gpu_seconds"] > 0
