"""The kinds a GPU team submits beyond Job, JobSet, PyTorchJob and MPIJob
(issues 22 and 23): each read against its real CRD or Kubernetes' own
schema, its pod sets derived as Kueue's integration for the kind derives
them (a Volcano Job's one per task), its class from its kind. Manifests in
the shape of each project's own examples (LWS ``docs/examples``, KubeRay
``ray-operator/config/samples``, Kubeflow trainer's, Volcano ``example/``),
re-expressed with pod templates that meet the security floor."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from service.app.floor import check_pod
from service.app.schemas import SecurityPolicy
from service.app.workloads import (
    SubmissionError,
    parse_submission,
    pod_templates,
    total_requests,
)
from tests.floor.test_floor import clean

QUEUE = {"kueue.x-k8s.io/queue-name": "q"}
ISLAND = "example.com/fabric-block"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
GIB = 1 << 30
Manifest = dict[str, Any]


def pod(gpus: int = 8, cpu: str = "8", memory: str = "64Gi", **annotations: str) -> Manifest:
    template = clean()
    template["metadata"] = {"annotations": dict(annotations), "labels": {"app": "serve"}}
    template["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus},
        "limits": {"nvidia.com/gpu": gpus},
    }
    return template


def _meta(name: str, **annotations: str) -> Manifest:
    return {"name": name, "labels": dict(QUEUE), "annotations": dict(annotations)}


def vllm_lws() -> Manifest:
    """LWS ``docs/examples/vllm``: two groups of a leader and a worker, 8 GPUs each."""
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _meta("vllm"),
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod(**{REQUIRED: ISLAND}),
                "workerTemplate": pod(),
            },
        },
    }


def workers_only_lws() -> Manifest:
    """LWS ``docs/examples/sample``: no leader template, groups of 4 alike."""
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _meta("lws-sample"),
        "spec": {
            "replicas": 3,
            "leaderWorkerTemplate": {
                "size": 4,
                "workerTemplate": pod(gpus=4, **{REQUIRED: ISLAND}),
            },
        },
    }


def _ray_cluster_spec() -> Manifest:
    """KubeRay ``ray-cluster.sample.yaml``'s shape: a head and one worker group."""
    head = pod(gpus=0, cpu="1", memory="2Gi")
    head["spec"]["containers"][0]["ports"] = [{"containerPort": 6379, "name": "gcs-server"}]
    return {
        "rayVersion": "2.52.0",
        "headGroupSpec": {"rayStartParams": {}, "template": head},
        "workerGroupSpecs": [
            {
                "replicas": 2,
                "minReplicas": 1,
                "maxReplicas": 5,
                "groupName": "gpu-group",
                "rayStartParams": {},
                "template": pod(gpus=8, cpu="16", memory="128Gi"),
            }
        ],
    }


def rayjob() -> Manifest:
    """KubeRay ``ray-job.sample.yaml``: K8sJobMode, so a submitter pod, given."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _meta("rayjob-sample"),
        "spec": {
            "entrypoint": "python /home/ray/samples/sample_code.py",
            "shutdownAfterJobFinishes": True,
            "runtimeEnvYAML": "pip:\n  - requests==2.26.0\n",
            "rayClusterSpec": _ray_cluster_spec(),
            "submitterPodTemplate": pod(gpus=0, cpu="500m", memory="200Mi"),
        },
    }


def sidecar_rayjob() -> Manifest:
    """KubeRay ``ray-job.sidecar-mode.yaml``: the submitter runs in the head
    pod; a TPU-style multi-host group (``numOfHosts``)."""
    manifest = rayjob()
    spec = manifest["spec"]
    del spec["submitterPodTemplate"]
    spec["submissionMode"] = "SidecarMode"
    spec["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] = 4
    manifest["metadata"]["name"] = "rayjob-sidecar"
    return manifest


def raycluster() -> Manifest:
    """KubeRay ``ray-cluster.autoscaler.yaml``: in-tree autoscaling adds a
    sidecar to the head, which Kueue charges for."""
    spec = _ray_cluster_spec()
    spec["enableInTreeAutoscaling"] = True
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _meta("raycluster-autoscaler"),
        "spec": spec,
    }


def _apps(kind: str, name: str, replicas: int, **annotations: str) -> Manifest:
    template = pod(gpus=1, cpu="4", memory="16Gi")
    spec: Manifest = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": "serve"}},
        "template": template,
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": _meta(name, **annotations),
        "spec": spec,
    }


def deployment() -> Manifest:
    return _apps("Deployment", "llama-8b", 3)


def statefulset() -> Manifest:
    return _apps("StatefulSet", "kv-cache", 4)


def gang_statefulset() -> Manifest:
    return _apps("StatefulSet", "sharded", 4, **{"quartermaster.dev/gang": "true"})


def trainjob() -> Manifest:
    """Kubeflow trainer's ``pytorch`` example: a runtime reference and a trainer."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _meta("pytorch-simple"),
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}},
        },
    }


def volcano_tf_mnist(template: Callable[..., Manifest] | None = None) -> Manifest:
    """Volcano ``example/integrations/tensorflow/dist-mnist``: a parameter
    server and two workers, ``minAvailable`` 3, the workers' completion
    ending the job; here the workers train on 8 GPUs each."""
    make = template or (lambda gpus: pod(gpus=gpus, cpu="8" if gpus else "2"))
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _meta("tensorflow-dist-mnist"),
        "spec": {
            "minAvailable": 3,
            "schedulerName": "volcano",
            "plugins": {"env": [], "svc": []},
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "queue": "default",
            "tasks": [
                {"replicas": 1, "name": "ps", "template": make(0)},
                {
                    "replicas": 2,
                    "name": "worker",
                    "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                    "template": make(8),
                },
            ],
        },
    }


def volcano_mpi(template: Callable[..., Manifest] | None = None) -> Manifest:
    """Volcano ``example/integrations/mpi/mpi-example.yaml``: a master whose
    completion completes the job and two workers that serve it until then
    (``sshd -D``: they never end by themselves), ``minAvailable`` 3."""
    make = template or (lambda gpus, ends=True: pod(gpus=gpus, cpu="8" if gpus else "2"))
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _meta("lm-mpi-job"),
        "spec": {
            "minAvailable": 3,
            "schedulerName": "volcano",
            "plugins": {"ssh": [], "svc": []},
            "tasks": [
                {
                    "replicas": 1,
                    "name": "mpimaster",
                    "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                    "template": make(0),
                },
                {"replicas": 2, "name": "mpiworker", "template": make(8, ends=False)},
            ],
        },
    }


def volcano_job() -> Manifest:
    """Volcano ``example/job.yaml``: one unnamed-looking task of six pods
    that may start once three are bound (``minAvailable`` 3 < replicas)."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _meta("test-job"),
        "spec": {
            "minAvailable": 3,
            "schedulerName": "volcano",
            "maxRetry": 5,
            "queue": "default",
            "plugins": {"ssh": [], "env": [], "svc": []},
            "tasks": [{"replicas": 6, "template": pod(gpus=1, cpu="1", memory="4Gi")}],
        },
    }


@dataclass(frozen=True)
class Want:
    """A derived pod set: name, pods per gang, one pod's requests (cpu in
    millicores, memory in bytes, GPUs), the island level it requires."""

    name: str
    count: int
    cpu: int
    memory: int
    gpus: int
    island: str | None = None


@dataclass(frozen=True)
class Case:
    manifest: Callable[[], Manifest]
    pod_sets: list[Want]
    replicas: int | None
    workload_class: str
    templates: int
    """Pod templates in the manifest: what the security floor reads."""


CASES = {
    "LeaderWorkerSet with a leader": Case(
        vllm_lws,
        [
            Want("leader", 1, 8000, 64 * GIB, 8, ISLAND),
            Want("worker", 1, 8000, 64 * GIB, 8, ISLAND),
        ],
        2,
        "inference",
        2,
    ),
    "LeaderWorkerSet of workers only": Case(
        workers_only_lws, [Want("main", 4, 8000, 64 * GIB, 4, ISLAND)], 3, "inference", 1
    ),
    "RayJob in K8sJobMode": Case(
        rayjob,
        [
            Want("head", 1, 1000, 2 * GIB, 0),
            Want("gpu-group", 2, 16000, 128 * GIB, 8),
            Want("submitter", 1, 500, 200 << 20, 0),
        ],
        None,
        "training",
        3,
    ),
    "RayJob in SidecarMode, multi-host": Case(
        sidecar_rayjob,
        [
            # The head's own 1 CPU and 2Gi, and KubeRay's submitter container.
            Want("head", 1, 1500, 2 * GIB + (200 << 20), 0),
            Want("gpu-group", 8, 16000, 128 * GIB, 8),
        ],
        None,
        "training",
        2,
    ),
    "RayCluster with in-tree autoscaling": Case(
        raycluster,
        [
            Want("head", 1, 1500, 2 * GIB + (512 << 20), 0),
            Want("gpu-group", 2, 16000, 128 * GIB, 8),
        ],
        None,
        "training",
        2,
    ),
    "Deployment, a gang per replica": Case(
        deployment, [Want("main", 1, 4000, 16 * GIB, 1)], 3, "inference", 1
    ),
    "StatefulSet, a gang per replica": Case(
        statefulset, [Want("main", 1, 4000, 16 * GIB, 1)], 4, "inference", 1
    ),
    "StatefulSet as one gang": Case(
        gang_statefulset, [Want("main", 4, 4000, 16 * GIB, 1)], None, "inference", 1
    ),
    "Volcano Job of two tasks": Case(
        volcano_tf_mnist,
        [Want("ps", 1, 2000, 64 * GIB, 0), Want("worker", 2, 8000, 64 * GIB, 8)],
        None,
        "training",
        2,
    ),
    # Every replica is admitted, not minAvailable's three (docs/volcano.md);
    # the unnamed task is named as Volcano's webhook names it.
    "Volcano Job, minAvailable below its replicas": Case(
        volcano_job, [Want("default0", 6, 1000, 4 * GIB, 1)], None, "training", 1
    ),
}


def _requests(template: Manifest) -> tuple[int, int, int]:
    """One pod's cpu (m), memory (bytes) and GPUs, summed over containers
    from their stated requests (not through the code under test)."""
    units = {"m": 1, "": 1000}
    cpu = memory = gpus = 0
    for container in template["spec"]["containers"]:
        requests = container["resources"]["requests"]
        value = str(requests.get("cpu", "0"))
        suffix = "m" if value.endswith("m") else ""
        cpu += int(value.rstrip("m")) * units[suffix]
        raw = str(requests.get("memory", "0"))
        memory += int(raw[:-2]) << {"Mi": 20, "Gi": 30}[raw[-2:]] if raw != "0" else 0
        gpus += int(requests.get("nvidia.com/gpu", 0))
    return cpu, memory, gpus


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_each_kind_derives_its_pod_sets_as_kueue_does(case: Case) -> None:
    workload = parse_submission(case.manifest())
    spec = workload.spec
    got = [
        Want(
            p.name,
            p.count,
            *_requests(p.template),
            p.topologyRequest.required if p.topologyRequest else None,
        )
        for p in spec.podSets
    ]
    assert got == case.pod_sets
    # A LeaderWorkerSet group's pod sets share one podSetGroupName: one island.
    grouped = case.manifest()["kind"] == "LeaderWorkerSet" and len(spec.podSets) > 1
    groups = [p.topologyRequest and p.topologyRequest.podSetGroupName for p in spec.podSets]
    assert groups == (["group"] * len(groups) if grouped else [None] * len(groups))
    assert spec.replicas == case.replicas
    assert spec.workloadClass == case.workload_class
    gangs = case.replicas or 1
    gpus = sum(w.count * w.gpus for w in case.pod_sets) * gangs
    assert total_requests(spec).get("nvidia.com/gpu", 0) == gpus
    # The floor reads the manifest's own templates, every one of them.
    assert len(pod_templates(spec)) == case.templates
    assert all(path.startswith("spec.") for path, _ in pod_templates(spec))


def test_a_leaderworkerset_group_without_leader_pods_keeps_its_floor_reading() -> None:
    manifest = vllm_lws()
    manifest["spec"]["leaderWorkerTemplate"]["size"] = 1
    spec = parse_submission(manifest).spec
    assert [(p.name, p.count) for p in spec.podSets] == [("leader", 1)]
    assert [path for path, _ in pod_templates(spec)] == [
        "spec.leaderWorkerTemplate.leaderTemplate",
        "spec.leaderWorkerTemplate.workerTemplate",
    ]


def test_the_class_annotation_says_otherwise() -> None:
    manifest = deployment()
    manifest["metadata"]["annotations"]["quartermaster.dev/workload-class"] = "training"
    assert parse_submission(manifest).spec.workloadClass == "training"


def _fields(manifest: Manifest) -> list[str]:
    with pytest.raises(SubmissionError) as refused:
        parse_submission(manifest)
    return [path for path, _ in refused.value.problems]


def _set(manifest: Manifest, path: list[str | int], value: Any) -> Manifest:
    broken = copy.deepcopy(manifest)
    node: Any = broken
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return broken


REFUSALS = {
    "LeaderWorkerSet size not an integer": (
        _set(vllm_lws(), ["spec", "leaderWorkerTemplate", "size"], "two"),
        "spec.leaderWorkerTemplate.size",
    ),
    "LeaderWorkerSet unknown field": (
        _set(vllm_lws(), ["spec", "leaderWorkerTemplate", "groupSize"], 2),
        "spec.leaderWorkerTemplate.groupSize",
    ),
    "LeaderWorkerSet pod template unknown field": (
        _set(vllm_lws(), ["spec", "leaderWorkerTemplate", "workerTemplate", "spec", "gpus"], 8),
        "spec.leaderWorkerTemplate.workerTemplate.spec.gpus",
    ),
    "LeaderWorkerSet group in no island": (
        _set(vllm_lws(), ["spec", "leaderWorkerTemplate", "leaderTemplate", "metadata"], {}),
        f"spec.leaderWorkerTemplate.leaderTemplate.metadata.annotations.{REQUIRED}",
    ),
    "RayJob worker group replicas not an integer": (
        _set(rayjob(), ["spec", "rayClusterSpec", "workerGroupSpecs", 0, "replicas"], "2"),
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas",
    ),
    "RayJob unknown field": (
        _set(rayjob(), ["spec", "entryPoint"], "python x.py"),
        "spec.entryPoint",
    ),
    "RayJob submitter unseen by the floor": (
        _set(rayjob(), ["spec", "submitterPodTemplate"], None),
        "spec.submitterPodTemplate",
    ),
    "RayJob whose cluster outlives it": (
        _set(rayjob(), ["spec", "shutdownAfterJobFinishes"], False),
        "spec.shutdownAfterJobFinishes",
    ),
    "RayJob on an existing cluster and its own": (
        _set(rayjob(), ["spec", "clusterSelector"], {"ray.io/cluster": "shared"}),
        "spec.clusterSelector",
    ),
    "RayJob worker group named head": (
        _set(rayjob(), ["spec", "rayClusterSpec", "workerGroupSpecs", 0, "groupName"], "head"),
        "spec.rayClusterSpec.workerGroupSpecs[0].groupName",
    ),
    "RayCluster without a head": (
        _set(raycluster(), ["spec", "headGroupSpec"], None),
        "spec.headGroupSpec.template",
    ),
    "Deployment replicas not an integer": (
        _set(deployment(), ["spec", "replicas"], "3"),
        "spec.replicas",
    ),
    "Deployment of no replica": (_set(deployment(), ["spec", "replicas"], 0), "spec.replicas"),
    "StatefulSet unknown field": (
        _set(statefulset(), ["spec", "ordinal"], 0),
        "spec.ordinal",
    ),
    "TrainJob unknown field": (
        _set(trainjob(), ["spec", "trainer", "nodes"], 2),
        "spec.trainer.nodes",
    ),
    "TrainJob runtime not registrable": (trainjob(), "spec.runtimeRef"),
    # Volcano's job webhook refuses these three (example/invalid_jobs/).
    "Volcano Job of no task": (_set(volcano_tf_mnist(), ["spec", "tasks"], []), "spec.tasks"),
    "Volcano Job with a task name twice": (
        _set(volcano_tf_mnist(), ["spec", "tasks", 1, "name"], "ps"),
        "spec.tasks[1].name",
    ),
    "Volcano Job minAvailable above its replicas": (
        _set(volcano_tf_mnist(), ["spec", "minAvailable"], 4),
        "spec.minAvailable",
    ),
    "Volcano Job task minAvailable above its replicas": (
        _set(volcano_tf_mnist(), ["spec", "tasks", 0, "minAvailable"], 2),
        "spec.tasks[0].minAvailable",
    ),
    "Volcano Job unknown task field": (
        _set(volcano_tf_mnist(), ["spec", "tasks", 0, "replica"], 1),
        "spec.tasks[0].replica",
    ),
    "Volcano Job task template unknown field": (
        _set(volcano_tf_mnist(), ["spec", "tasks", 1, "template", "spec", "gpus"], 8),
        "spec.tasks[1].template.spec.gpus",
    ),
    "Volcano Job replicas not an integer": (
        _set(volcano_tf_mnist(), ["spec", "tasks", 1, "replicas"], "2"),
        "spec.tasks[1].replicas",
    ),
}


@pytest.mark.parametrize(("manifest", "field"), REFUSALS.values(), ids=list(REFUSALS))
def test_each_kind_is_refused_naming_the_broken_field(manifest: Manifest, field: str) -> None:
    assert field in _fields(manifest)


def test_a_workload_carrying_a_serving_job_gets_its_replicas_and_class() -> None:
    body = {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": "wrapped"},
        "spec": {"queueName": "q", "job": deployment()},
    }
    spec = parse_submission(body).spec
    assert (spec.replicas, spec.workloadClass) == (3, "inference")
    body["spec"]["replicas"] = 5
    assert _fields(body) == ["spec.replicas"]
    plain = {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": "plain"},
        "spec": {
            "queueName": "q",
            "replicas": 2,
            "podSets": [{"name": "main", "count": 1, "template": pod()}],
        },
    }
    assert _fields(plain) == ["spec.replicas"]


def test_the_floor_reads_every_task_of_a_volcano_job_as_submitted_or_wrapped() -> None:
    """The security floor sees each task's template, one of no pod too, at
    its path in what was sent: the manifest itself or a Workload's spec.job."""
    manifest = volcano_tf_mnist()
    manifest["spec"]["tasks"].append({"replicas": 0, "name": "idle", "template": pod()})
    manifest["spec"]["tasks"][2]["template"]["spec"]["hostPID"] = True
    spec = parse_submission(manifest).spec
    assert [(p.name, p.count) for p in spec.podSets] == [("ps", 1), ("worker", 2)]
    found = [p for path, t in pod_templates(spec) for p, _ in check_pod(t, path, SecurityPolicy())]
    assert found == ["spec.tasks[2].template.spec.hostPID"]
    wrapped = {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": "wrapped"},
        "spec": {"queueName": "q", "job": manifest},
    }
    spec = parse_submission(wrapped).spec
    assert [path for path, _ in pod_templates(spec)] == [
        f"spec.job.spec.tasks[{i}].template" for i in range(3)
    ]
    assert spec.workloadClass == "training"
    assert _fields(_set(wrapped, ["spec", "job", "spec", "tasks", 1, "name"], "ps")) == [
        "spec.job.spec.tasks[1].name"
    ]


def test_a_batch_job_is_still_read_as_a_batch_job() -> None:
    """Volcano's kind is named Job too: the apiVersion tells which is meant,
    and each is held to its own schema."""
    plain = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta("plain"),
        "spec": {"parallelism": 2, "template": pod()},
    }
    assert [(p.name, p.count) for p in parse_submission(plain).spec.podSets] == [("main", 2)]
    assert _fields(_set(plain, ["spec", "tasks"], [])) == ["spec.tasks"]
    tasks = _set(volcano_tf_mnist(), ["spec", "parallelism"], 2)
    assert _fields(tasks) == ["spec.parallelism"]
    wrong = _set(volcano_tf_mnist(), ["apiVersion"], "batch.volcano.sh/v1")
    assert _fields(wrong) == ["apiVersion"]


def test_min_replicas_comes_from_the_manifest_annotation() -> None:
    floor = "quartermaster.dev/min-replicas"
    web = deployment()
    web["metadata"]["annotations"][floor] = "2"
    assert parse_submission(web).spec.minReplicas == 2
    for value, reason in (("two", "whole number"), ("4", "at most spec.replicas (3)")):
        web["metadata"]["annotations"][floor] = value
        with pytest.raises(SubmissionError) as refused:
            parse_submission(web)
        ((path, message),) = refused.value.problems
        assert path == f"metadata.annotations.{floor}" and reason in message
