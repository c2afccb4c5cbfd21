"""A TrainJob's JobSet from its runtime, and the pod sets Kueue's trainjob
integration reads from that JobSet (``pkg/controller/jobs/trainjob``: the JobSet
Trainer's builder makes, then JobSet's pod sets, ``replicas * parallelism``).

The runtime is Kubeflow Trainer's ``torch-distributed`` ClusterTrainingRuntime
(tests/api/test_training_runtimes.py); the TrainJobs are in the shape of Trainer's
examples (``runtimeRef``, ``trainer.numNodes``, ``resourcesPerNode``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from service.domain.jobs import job_pod_templates, trainjob_jobset
from tests.api.test_training_runtimes import TORCH_DISTRIBUTED

Manifest = dict[str, Any]
GPU = "nvidia.com/gpu"


def trainjob(**trainer: Any) -> Manifest:
    spec: Manifest = {"runtimeRef": {"name": "torch-distributed"}}
    if trainer:
        spec["trainer"] = trainer
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "pytorch-simple", "namespace": "team-a", "labels": {"a": "b"}},
        "spec": spec,
    }


def with_initializer() -> Manifest:
    """Trainer's LLM runtimes' shape: an ``initializer`` job before the trainer."""
    runtime = copy.deepcopy(TORCH_DISTRIBUTED["spec"])
    init = {
        "name": "initializer",
        "template": {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "dataset-initializer", "image": "init:1"},
                            {"name": "model-initializer", "image": "init:1"},
                        ]
                    }
                }
            }
        },
    }
    runtime["template"]["spec"]["replicatedJobs"].insert(0, init)
    return runtime


PER_NODE = {"limits": {GPU: 8, "cpu": "32", "memory": "256Gi"}}
CASES: dict[str, tuple[Manifest, Manifest, list[tuple[str, int]]]] = {
    "the runtime's numNodes": (trainjob(), TORCH_DISTRIBUTED["spec"], [("trainer-node", 1)]),
    "the TrainJob's numNodes": (
        trainjob(numNodes=4, resourcesPerNode=PER_NODE),
        TORCH_DISTRIBUTED["spec"],
        [("trainer-node", 4)],
    ),
    "an initializer first": (
        trainjob(numNodes=2),
        with_initializer(),
        [("initializer", 1), ("trainer-node", 2)],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_trainjob_runs_as_the_jobset_its_runtime_describes(case: str) -> None:
    job, runtime, pod_sets = CASES[case]
    jobset = trainjob_jobset(job, runtime)
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert jobset["metadata"] == {
        "name": "pytorch-simple",
        "namespace": "team-a",
        "labels": {"a": "b"},
    }
    templates, problems = job_pod_templates(jobset)
    assert problems == []
    assert [(t.name, t.count) for t in templates] == pod_sets


def test_the_trainer_overrides_land_on_the_trainer_container_only() -> None:
    job = trainjob(
        numNodes=2, image="train:2", command=["torchrun"], args=["x.py"], resourcesPerNode=PER_NODE
    )
    jobset = trainjob_jobset(job, with_initializer())
    init, node = jobset["spec"]["replicatedJobs"]
    container = node["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "train:2"
    assert (container["command"], container["args"]) == (["torchrun"], ["x.py"])
    assert container["resources"] == PER_NODE
    assert node["template"]["spec"]["parallelism"] == node["template"]["spec"]["completions"] == 2
    untouched = init["template"]["spec"]["template"]["spec"]["containers"]
    assert [c["image"] for c in untouched] == ["init:1", "init:1"]
    assert "parallelism" not in init["template"]["spec"]
    # the runtime itself is left as registered
    assert (
        "parallelism"
        not in with_initializer()["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]
    )
