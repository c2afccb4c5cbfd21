"""TrainingRuntime and ClusterTrainingRuntime, registered centrally (issue 22):
what a TrainJob's pods are made from. Applied as Kubeflow Trainer writes them
(``apiVersion: trainer.kubeflow.org/v1alpha1``) or as ours, read against the
runtime's own CRD with the field named when broken; written by queue admins and
admins only, read by everyone; each change an event of the object's stream and a
``config.changed`` ledger entry.

The runtime is Trainer's ``manifests/base/runtimes/pretraining/torch_distributed.yaml``
(kubeflow/trainer ``a55f03a8``, the commit of the CRDs), its command shortened.
"""

from __future__ import annotations

import copy
from typing import Any

import sqlalchemy as sa

from tests.api.conftest import Api, setup_quota
from tests.api.test_resources import _fields, _problem
from tests.floor.test_floor import clean

IMAGE = "pytorch/pytorch:2.5.0-cuda12.4-cudnn9-runtime"
TORCH_DISTRIBUTED: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {
        "name": "torch-distributed",
        "labels": {"trainer.kubeflow.org/phase": "pre-training"},
    },
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "trainer-node",
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "containers": [
                                            {
                                                "name": "trainer",
                                                "image": IMAGE,
                                                "command": ["/bin/bash", "-c", "pip list"],
                                            }
                                        ]
                                    }
                                }
                            }
                        },
                    }
                ]
            }
        },
    },
}


def _runtime(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(TORCH_DISTRIBUTED)
    body.update(changes)
    return body


def test_a_cluster_training_runtime_as_trainer_writes_it_is_registered(
    api: Api, engine: sa.Engine
) -> None:
    created = api.admin.post("/v1/clustertrainingruntimes", json=_runtime())
    assert created.status_code == 201, created.text
    got = api.admin.get("/v1/clustertrainingruntimes/torch-distributed")
    assert got.status_code == 200
    body = got.json()
    assert body["kind"] == "ClusterTrainingRuntime"
    assert body["spec"] == TORCH_DISTRIBUTED["spec"]  # kept whole, as written
    with engine.connect() as conn:
        events = (
            conn.exec_driver_sql(
                "SELECT type FROM events WHERE stream = 'clustertrainingruntime-torch-distributed'"
            )
            .scalars()
            .all()
        )
        ledger = (
            conn.exec_driver_sql(
                "SELECT body->>'object_kind' FROM ledger_entries WHERE kind = 'config.changed'"
            )
            .scalars()
            .all()
        )
    assert events == ["ResourceChanged"]
    assert "ClusterTrainingRuntime" in ledger


def test_a_namespaced_training_runtime_lives_in_its_namespace(api: Api) -> None:
    body = _runtime(kind="TrainingRuntime")
    created = api.admin.post("/v1/namespaces/team-a/trainingruntimes", json=body)
    assert created.status_code == 201, created.text
    listed = api.admin.get("/v1/namespaces/team-a/trainingruntimes").json()["items"]
    assert [r["metadata"]["name"] for r in listed] == ["torch-distributed"]
    assert api.admin.get("/v1/namespaces/team-b/trainingruntimes").json()["items"] == []


def test_a_broken_runtime_is_refused_naming_the_field(api: Api) -> None:
    body = _runtime()
    job = body["spec"]["template"]["spec"]["replicatedJobs"][0]
    job["replicas"] = "two"
    body["spec"]["mlPolicy"]["numNods"] = 2
    response = api.admin.post("/v1/clustertrainingruntimes", json=body)
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = _problem(response, 422, "invalid")
    fields = _fields(problem)
    assert "spec.template.spec.replicatedJobs[0].replicas" in fields, problem
    assert "spec.mlPolicy.numNods" in fields, problem
    wrong = _runtime(apiVersion="kubeflow.org/v1")
    refused = api.admin.post("/v1/clustertrainingruntimes", json=wrong)
    assert "apiVersion" in _fields(_problem(refused, 422, "invalid"))


def test_queue_admins_register_runtimes_and_submitters_only_read_them(api: Api) -> None:
    submitter = api.as_role("submitter", ["team-a"])
    refused = submitter.post("/v1/clustertrainingruntimes", json=_runtime())
    assert refused.status_code == 403, refused.text
    queue_admin = api.as_role("queue-admin")
    assert queue_admin.post("/v1/clustertrainingruntimes", json=_runtime()).status_code == 201
    assert submitter.get("/v1/clustertrainingruntimes/torch-distributed").status_code == 200
    cluster_admin = api.as_role("cluster-admin")
    patched = cluster_admin.delete("/v1/clustertrainingruntimes/torch-distributed")
    assert patched.status_code == 403


# -- a TrainJob, resolved against its runtime ------------------------------------------


def _trainjob(name: str = "pytorch-simple", **spec: Any) -> dict[str, Any]:
    """Kubeflow Trainer's ``pytorch`` example, queued."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}},
            **spec,
        },
    }


def floor_runtime() -> dict[str, Any]:
    """The runtime with a trainer pod the security floor passes (Trainer's own
    example pulls an image by tag as root: a ClusterQueue's floor refuses it)."""
    body = _runtime()
    job = body["spec"]["template"]["spec"]["replicatedJobs"][0]
    template = clean()
    template["spec"]["containers"][0]["name"] = "trainer"
    job["template"]["spec"]["template"] = template
    return body


def test_a_trainjob_is_admitted_as_the_jobset_of_its_runtime(api: Api) -> None:
    setup_quota(api.admin)
    registered = api.admin.post("/v1/clustertrainingruntimes", json=floor_runtime())
    assert registered.status_code == 201, registered.text
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=_trainjob())
    assert created.status_code == 201, created.text
    spec = created.json()["spec"]
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("trainer-node", 2)]
    trainer = spec["podSets"][0]["template"]["spec"]["containers"][0]
    assert trainer["name"] == "trainer"
    assert trainer["resources"] == {"limits": {"nvidia.com/gpu": 8}}  # resourcesPerNode
    job = spec["job"]
    assert (job["apiVersion"], job["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert job["metadata"]["annotations"]["quartermaster.dev/training-runtime"] == (
        "ClusterTrainingRuntime/torch-distributed"
    )
    assert spec["workloadClass"] == "training"


def test_a_trainjob_whose_runtime_is_not_registered_is_refused_naming_it(api: Api) -> None:
    setup_quota(api.admin)
    response = api.admin.post("/v1/namespaces/team-a/workloads", json=_trainjob())
    problem = _problem(response, 422, "invalid")
    assert _fields(problem) == ["spec.runtimeRef"], problem
    assert "ClusterTrainingRuntime 'torch-distributed'" in str(problem)
    namespaced = _trainjob(runtimeRef={"name": "torch-distributed", "kind": "TrainingRuntime"})
    assert api.admin.post("/v1/clustertrainingruntimes", json=_runtime()).status_code == 201
    refused = api.admin.post("/v1/namespaces/team-a/workloads", json=namespaced)
    assert "in namespace team-a" in str(_problem(refused, 422, "invalid"))


def test_a_broken_trainjob_is_refused_naming_the_field(api: Api) -> None:
    setup_quota(api.admin)
    assert api.admin.post("/v1/clustertrainingruntimes", json=floor_runtime()).status_code == 201
    broken = _trainjob()
    broken["spec"]["trainer"]["nodes"] = 2
    response = api.admin.post("/v1/namespaces/team-a/workloads", json=broken)
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "spec.trainer.nodes" in _fields(_problem(response, 422, "invalid"))
