"""Job manifests read as a Kubernetes API server with strict field
validation reads them: batch/v1 against Kubernetes' OpenAPI, the custom
kinds against their CRDs; unknown fields refused by name, nulls absent."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from service.app.workloads import SubmissionError, parse_submission
from tests.floor.test_floor import clean

QUEUE = {"kueue.x-k8s.io/queue-name": "q"}


def _fields(manifest: dict[str, Any]) -> list[str]:
    with pytest.raises(SubmissionError) as refused:
        parse_submission(manifest)
    return [path for path, _ in refused.value.problems]


def job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "labels": dict(QUEUE)},
        "spec": {"parallelism": 4, "completions": 4, "template": clean()},
    }


def jobset() -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "labels": dict(QUEUE)},
        "spec": {
            "failurePolicy": {"maxRestarts": 3},
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {"spec": {"parallelism": 4, "completions": 4, "template": clean()}},
                }
            ],
        },
    }


def pytorchjob() -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "p", "labels": dict(QUEUE)},
        "spec": {
            "elasticPolicy": {"maxRestarts": 2},
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": clean()},
                "Worker": {"replicas": 3, "template": clean()},
            },
        },
    }


def mpijob() -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "m", "labels": dict(QUEUE)},
        "spec": {
            "slotsPerWorker": 8,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": clean()},
                "Worker": {"replicas": 2, "template": clean()},
            },
        },
    }


@pytest.mark.parametrize("make", [job, jobset, pytorchjob, mpijob])
def test_valid_manifests_of_every_kind_are_accepted(make: Any) -> None:
    manifest = make()
    manifest["metadata"]["annotations"] = None  # a YAML key holding only a comment
    assert parse_submission(manifest).spec.podSets


def test_a_misspelt_field_is_refused_by_name() -> None:
    manifest = job()
    manifest["spec"]["paralelism"] = manifest["spec"].pop("parallelism")
    assert _fields(manifest) == ["spec.paralelism"]
    manifest = jobset()
    manifest["spec"]["replicatedJobs"][0]["replica"] = 2
    assert _fields(manifest) == ["spec.replicatedJobs[0].replica"]
    manifest = pytorchjob()
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicaz"] = 3
    assert _fields(manifest) == ["spec.pytorchReplicaSpecs.Worker.replicaz"]
    manifest = mpijob()
    manifest["spec"]["slotsPerWorkr"] = 8
    assert _fields(manifest) == ["spec.slotsPerWorkr"]
    manifest = mpijob()
    manifest["metadata"]["lables"] = {}
    assert _fields(manifest) == ["metadata.lables"]


def test_types_are_exact_in_custom_kinds() -> None:
    manifest = jobset()
    manifest["spec"]["failurePolicy"]["maxRestarts"] = "3"
    assert _fields(manifest) == ["spec.failurePolicy.maxRestarts"]
    manifest = pytorchjob()
    manifest["spec"]["elasticPolicy"]["maxRestarts"] = True
    assert _fields(manifest) == ["spec.elasticPolicy.maxRestarts"]
    manifest = mpijob()
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["securityContext"]["privileged"] = "no"
    fields = _fields(manifest)
    assert fields == [
        "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].securityContext.privileged"
    ]


def test_a_workloads_job_is_read_by_the_same_schemas() -> None:
    manifest = copy.deepcopy(jobset())
    manifest["spec"]["replicatedJobs"][0]["replica"] = 2
    body = {
        "kind": "Workload",
        "metadata": {"name": "w"},
        "spec": {"queueName": "q", "job": manifest},
    }
    assert _fields(body) == ["spec.job.spec.replicatedJobs[0].replica"]
