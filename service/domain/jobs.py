"""The job kinds a submission may carry, and every pod template in each.

One reading of a job manifest for the whole service: the pod sets a
submission is charged for, the templates the security floor checks and the
templates the reconciler pins to their islands are the same list, so that
what is checked is what runs (a summary written beside the manifest is
never trusted). Pod sets are named and counted as Kueue's job integrations
do (``pkg/controller/jobs/{job,jobset,kubeflow,raycluster,rayjob,
leaderworkerset,statefulset,deployment}``), a Volcano Job's one per task; a
serving kind's pod sets are
those of one replica, the gang Kueue admits as one Workload, and
:func:`job_replicas` says how many such gangs it runs (docs/workload-kinds.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GANG_ANNOTATION",
    "JOB_API_VERSIONS",
    "MEMBER_JOB_KINDS",
    "RUN_AS",
    "SERVING_KINDS",
    "TRAINJOB_ANNOTATION",
    "VOLCANO_JOB",
    "VOLCANO_JOB_API_VERSION",
    "JobPodTemplate",
    "job_class",
    "job_kind",
    "job_pod_templates",
    "job_replicas",
    "kind_not_runnable",
    "runs_as_units",
    "trainjob_jobset",
]

#: Volcano's Job (``vcjob``) is named ``Job`` as batch/v1's is; it is told
#: apart by its apiVersion and read as ``VOLCANO_JOB`` (:func:`job_kind`).
VOLCANO_JOB_API_VERSION = "batch.volcano.sh/v1alpha1"
VOLCANO_JOB = "VolcanoJob"
#: The job kinds a submission may carry, with the apiVersions accepted.
JOB_API_VERSIONS: Mapping[str, tuple[str, ...]] = {
    "Job": ("batch/v1", VOLCANO_JOB_API_VERSION),
    "JobSet": ("jobset.x-k8s.io/v1alpha2",),
    "PyTorchJob": ("kubeflow.org/v1",),
    "MPIJob": ("kubeflow.org/v2beta1", "kubeflow.org/v1"),
    "RayJob": ("ray.io/v1",),
    "RayCluster": ("ray.io/v1",),
    "TrainJob": ("trainer.kubeflow.org/v1alpha1",),
    "Deployment": ("apps/v1",),
    "StatefulSet": ("apps/v1",),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1",),
}
#: The kinds the workers can apply to a member cluster today; a workload of
#: another accepted kind is held pending until they can (issue 22).
MEMBER_JOB_KINDS: tuple[str, ...] = (
    "Job",
    "JobSet",
    "PyTorchJob",
    "MPIJob",
    "RayJob",
    "RayCluster",
)
#: Kinds the workers run as another kind on a member: a Volcano Job as the
#: JobSet of its tasks on a Kueue member (docs/volcano.md).
RUN_AS: Mapping[str, str] = {VOLCANO_JOB: "JobSet"}
#: Kinds that serve: their workloads are ``inference`` unless they say otherwise.
SERVING_KINDS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet"})
#: On a StatefulSet: ``"true"`` admits all its replicas as one gang (as
#: Kueue's StatefulSet integration always does); otherwise each is its own.
GANG_ANNOTATION = "quartermaster.dev/gang"
#: What KubeRay adds to a head pod beside its template, and Kueue charges for
#: (``raycluster.autoscalerContainer``, ``rayjob.defaultSubmitterResources``).
_RAY_AUTOSCALER = {
    "name": "autoscaler",
    "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
}
_RAY_SUBMITTER = {
    "name": "ray-job-submitter",
    "resources": {"requests": {"cpu": "500m", "memory": "200Mi"}},
}


@dataclass(frozen=True)
class JobPodTemplate:
    """One pod template of a job manifest: the pod set it makes, the pods it
    runs and where it stands (a JSON path from the manifest's root)."""

    name: str
    count: int
    path: str
    template: Any
    """The template as found; a problem is reported where it is not a mapping."""
    added: tuple[Mapping[str, Any], ...] = ()
    """Containers the kind's controller adds to these pods (their requests
    only): charged, never written (the controller writes them)."""


def _count(value: Any, default: int, path: str, problems: list[tuple[str, str]]) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append((path, "must be a non-negative integer"))
        return default
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _job(spec: Mapping[str, Any], problems: list[tuple[str, str]]) -> Iterator[JobPodTemplate]:
    parallelism = _count(spec.get("parallelism"), 1, "spec.parallelism", problems)
    completions = spec.get("completions")
    count = parallelism
    if isinstance(completions, int) and not isinstance(completions, bool) and completions > 0:
        count = min(parallelism, completions)
    yield JobPodTemplate("main", max(count, 1), "spec.template", spec.get("template"))


def _jobset(spec: Mapping[str, Any], problems: list[tuple[str, str]]) -> Iterator[JobPodTemplate]:
    replicated = spec.get("replicatedJobs")
    if not isinstance(replicated, list) or not replicated:
        problems.append(("spec.replicatedJobs", "at least one replicated job is required"))
        return
    for index, job in enumerate(replicated):
        path = f"spec.replicatedJobs[{index}]"
        if not isinstance(job, Mapping):
            problems.append((path, "must be an object"))
            continue
        replicas = _count(job.get("replicas"), 1, f"{path}.replicas", problems)
        job_spec = _mapping(_mapping(job.get("template")).get("spec"))
        spec_path = f"{path}.template.spec"
        parallelism = _count(job_spec.get("parallelism"), 1, f"{spec_path}.parallelism", problems)
        name = str(job.get("name") or f"job-{index}")
        yield JobPodTemplate(
            name, replicas * parallelism, f"{spec_path}.template", job_spec.get("template")
        )


def _replicas(
    spec: Mapping[str, Any], field_name: str, problems: list[tuple[str, str]]
) -> Iterator[JobPodTemplate]:
    replicas = spec.get(field_name)
    if not isinstance(replicas, Mapping) or not replicas:
        problems.append((f"spec.{field_name}", "at least one replica type is required"))
        return
    for replica_type, replica in replicas.items():
        path = f"spec.{field_name}.{replica_type}"
        if not isinstance(replica, Mapping):
            problems.append((path, "must be an object"))
            continue
        count = _count(replica.get("replicas"), 1, f"{path}.replicas", problems)
        yield JobPodTemplate(
            str(replica_type).lower(), count, f"{path}.template", replica.get("template")
        )


def _ray_cluster(
    spec: Mapping[str, Any], path: str, problems: list[tuple[str, str]], *head_added: Any
) -> Iterator[JobPodTemplate]:
    """A RayCluster spec's pod sets: ``head`` of one pod, then one per worker
    group of ``replicas * numOfHosts`` pods (``raycluster.BuildPodSets``)."""
    head = _mapping(spec.get("headGroupSpec"))
    added = list(head_added)
    if spec.get("enableInTreeAutoscaling") is True:
        resources = _mapping(spec.get("autoscalerOptions")).get("resources")
        added.append({**_RAY_AUTOSCALER, **({"resources": resources} if resources else {})})
    yield JobPodTemplate(
        "head", 1, f"{path}.headGroupSpec.template", head.get("template"), tuple(added)
    )
    groups = spec.get("workerGroupSpecs") or []
    if not isinstance(groups, list):
        problems.append((f"{path}.workerGroupSpecs", "must be a list"))
        return
    for index, raw in enumerate(groups):
        at = f"{path}.workerGroupSpecs[{index}]"
        group = _mapping(raw)
        name = str(group.get("groupName") or f"group-{index}")
        if name == "head":
            problems.append((f"{at}.groupName", '"head" is the head group\'s pod set'))
        replicas = _count(group.get("replicas"), 1, f"{at}.replicas", problems)
        hosts = _count(group.get("numOfHosts"), 1, f"{at}.numOfHosts", problems)
        yield JobPodTemplate(
            name, replicas * max(hosts, 1), f"{at}.template", group.get("template")
        )


def _ray_job(spec: Mapping[str, Any], problems: list[tuple[str, str]]) -> Iterator[JobPodTemplate]:
    """A RayJob's cluster, and its submitter pod (``rayjob.PodSets``): a pod
    set of its own in K8sJobMode, a container of the head in SidecarMode."""
    cluster = spec.get("rayClusterSpec")
    if not isinstance(cluster, Mapping):
        problems.append(
            (
                "spec.rayClusterSpec",
                "is required: a RayJob on an existing RayCluster (spec.clusterSelector) "
                "is admitted with that RayCluster",
            )
        )
        return
    if spec.get("clusterSelector"):
        problems.append(
            (
                "spec.clusterSelector",
                "a RayJob with its own rayClusterSpec uses no existing cluster",
            )
        )
    if spec.get("shutdownAfterJobFinishes") is not True:
        # Kueue's webhook: a cluster left up holds its quota after the job.
        problems.append(
            ("spec.shutdownAfterJobFinishes", "must be true: the cluster ends with its job")
        )
    mode = spec.get("submissionMode") or "K8sJobMode"
    sidecar = (_RAY_SUBMITTER,) if mode == "SidecarMode" else ()
    yield from _ray_cluster(cluster, "spec.rayClusterSpec", problems, *sidecar)
    if mode != "K8sJobMode":
        return
    template = spec.get("submitterPodTemplate")
    if template is None:
        # KubeRay would build one the security floor never saw.
        problems.append(
            (
                "spec.submitterPodTemplate",
                "is required in K8sJobMode: the submitter pod runs, and what runs is checked",
            )
        )
        return
    yield JobPodTemplate("submitter", 1, "spec.submitterPodTemplate", template)


def _lws(spec: Mapping[str, Any], problems: list[tuple[str, str]]) -> Iterator[JobPodTemplate]:
    """One LeaderWorkerSet group: ``leader`` (1) and ``worker`` (size - 1),
    or ``main`` (size) without a leader template (``leaderworkerset.podSets``)."""
    group = _mapping(spec.get("leaderWorkerTemplate"))
    path = "spec.leaderWorkerTemplate"
    size = _count(group.get("size"), 1, f"{path}.size", problems)
    if size < 1:
        problems.append((f"{path}.size", "must be at least 1"))
    workers = group.get("workerTemplate")
    if group.get("leaderTemplate") is None:
        yield JobPodTemplate("main", size, f"{path}.workerTemplate", workers)
        return
    yield JobPodTemplate("leader", 1, f"{path}.leaderTemplate", group.get("leaderTemplate"))
    yield JobPodTemplate("worker", max(size - 1, 0), f"{path}.workerTemplate", workers)


def _replica_set(
    manifest: Mapping[str, Any], spec: Mapping[str, Any], problems: list[tuple[str, str]]
) -> Iterator[JobPodTemplate]:
    """A Deployment's or StatefulSet's one template: a pod per replica, or
    every replica in one gang for a StatefulSet that asks."""
    replicas = _count(spec.get("replicas"), 1, "spec.replicas", problems)
    count = replicas if _is_gang(manifest) else 1
    yield JobPodTemplate("main", count, "spec.template", spec.get("template"))


def _is_gang(manifest: Mapping[str, Any]) -> bool:
    annotations = _mapping(_mapping(manifest.get("metadata")).get("annotations"))
    return manifest.get("kind") == "StatefulSet" and annotations.get(GANG_ANNOTATION) == "true"


def job_kind(manifest: Mapping[str, Any]) -> str | None:
    """The kind a job manifest is read as: its ``kind``, except a Volcano
    Job's, ``VolcanoJob`` (two API groups call their kind ``Job``)."""
    kind = manifest.get("kind")
    if not isinstance(kind, str):
        return None
    if kind == "Job" and manifest.get("apiVersion") == VOLCANO_JOB_API_VERSION:
        return VOLCANO_JOB
    return kind


def _volcano_job(
    spec: Mapping[str, Any], problems: list[tuple[str, str]]
) -> Iterator[JobPodTemplate]:
    """A Volcano Job's pod sets, one per task (its name, its ``replicas``
    pods), held to Volcano's job webhook (``validateJobCreate``): a task at
    least, task names unique, no ``minAvailable`` above the replicas it
    counts. The gang is every pod of every task (docs/volcano.md)."""
    tasks = spec.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        problems.append(("spec.tasks", "at least one task is required"))
        return
    names: set[str] = set()
    total = 0
    for index, raw in enumerate(tasks):
        path = f"spec.tasks[{index}]"
        if not isinstance(raw, Mapping):
            problems.append((path, "must be an object"))
            continue
        # Volcano's mutating webhook names an unnamed task default<index>.
        name = str(raw.get("name") or f"default{index}")
        if name in names:
            problems.append((f"{path}.name", f"duplicated task name {name}"))
        names.add(name)
        replicas = _count(raw.get("replicas"), 0, f"{path}.replicas", problems)
        least = _count(raw.get("minAvailable"), 0, f"{path}.minAvailable", problems)
        if least > replicas:
            problems.append(
                (f"{path}.minAvailable", f"{least} is greater than task {name}'s replicas")
            )
        total += replicas
        yield JobPodTemplate(name, replicas, f"{path}.template", raw.get("template"))
    least = _count(spec.get("minAvailable"), 0, "spec.minAvailable", problems)
    if least > total:
        problems.append(
            ("spec.minAvailable", f"{least} is greater than the tasks' replicas in all ({total})")
        )
    if total == 0:
        problems.append(("spec.tasks", "the tasks run no pod: a task needs replicas"))


def job_replicas(manifest: Mapping[str, Any]) -> int:
    """How many gangs of its pod sets a manifest runs: a serving kind's
    ``spec.replicas`` (one for a StatefulSet admitted as one gang), else one."""
    if manifest.get("kind") not in SERVING_KINDS or _is_gang(manifest):
        return 1
    replicas = _mapping(manifest.get("spec")).get("replicas", 1)
    return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 1


def runs_as_units(workload_spec: Mapping[str, Any]) -> bool:
    """Whether a workload is served replica by replica: its job is a serving
    kind (a StatefulSet not asked to be one gang), each replica admitted as
    a unit of its own (docs/serving.md)."""
    job = _mapping(workload_spec.get("job"))
    return job.get("kind") in SERVING_KINDS and not _is_gang(job)


def kind_not_runnable(workload_spec: Mapping[str, Any]) -> str | None:
    """The kind of a workload's job when the workers cannot apply it to a
    member yet (its workload is held pending, never admitted), else None. A
    serving workload run as units is admitted unit by unit."""
    job = _mapping(workload_spec.get("job"))
    kind = job_kind(job)
    if kind is None or kind not in _READERS or kind in MEMBER_JOB_KINDS or kind in RUN_AS:
        return None
    if runs_as_units(workload_spec):
        return None
    return kind


def job_class(kind: str) -> str:
    """The workload class a kind runs as when it names none."""
    return "inference" if kind in SERVING_KINDS else "training"


def _trainjob(spec: Mapping[str, Any], problems: list[tuple[str, str]]) -> Iterator[JobPodTemplate]:
    """A TrainJob's pods come from its registered runtime, which the submit path
    resolves into the JobSet it runs as (:func:`trainjob_jobset`) before this reading;
    one that reaches it unresolved (carried in a Workload's ``spec.job``) is refused,
    naming the reference (docs/workload-kinds.md)."""
    runtime = _mapping(spec.get("runtimeRef"))
    problems.append(
        (
            "spec.runtimeRef",
            f"{runtime.get('kind') or 'ClusterTrainingRuntime'} {runtime.get('name')!r}: "
            "a TrainJob's pod sets come from its registered TrainingRuntime or "
            "ClusterTrainingRuntime: submit the TrainJob itself, not inside a Workload",
        )
    )
    return iter(())


#: Kubeflow Trainer's names (``pkg/constants`` at kubeflow/trainer ``a55f03a8``): the
#: replicated job a TrainJob's ``spec.trainer`` shapes, and its container.
TRAINER_NODE = "trainer-node"
TRAINER_CONTAINER = "trainer"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
#: On the JobSet a TrainJob was submitted as: the runtime it was made from.
TRAINJOB_ANNOTATION = "quartermaster.dev/training-runtime"


def trainjob_jobset(trainjob: Mapping[str, Any], runtime_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSet a TrainJob runs as: its runtime's ``template`` with the TrainJob's
    ``spec.trainer`` applied to the ``trainer-node`` job as Trainer's JobSet builder
    applies it (``numNodes``, else the runtime's ``mlPolicy.numNodes``, as its
    parallelism and completions; ``image``, ``command``, ``args`` and
    ``resourcesPerNode`` on the ``trainer`` container), the TrainJob's labels and
    annotations (and ``spec.labels`` / ``spec.annotations``) on it. Kueue's trainjob
    integration reads the pod sets from this very JobSet (docs/workload-kinds.md)."""
    spec = _mapping(trainjob.get("spec"))
    template = _mapping(runtime_spec.get("template"))
    jobset_spec: dict[str, Any] = copy.deepcopy(dict(_mapping(template.get("spec"))))
    trainer = _mapping(spec.get("trainer"))
    nodes = trainer.get("numNodes", _mapping(runtime_spec.get("mlPolicy")).get("numNodes"))
    for job in jobset_spec.get("replicatedJobs") or ():
        if not isinstance(job, dict) or job.get("name") != TRAINER_NODE:
            continue
        job_spec = job.setdefault("template", {}).setdefault("spec", {})
        if nodes is not None:
            job_spec["parallelism"] = job_spec["completions"] = nodes
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        for container in pod_spec.get("containers") or ():
            if isinstance(container, dict) and container.get("name") == TRAINER_CONTAINER:
                for field, key in (
                    ("image", "image"),
                    ("command", "command"),
                    ("args", "args"),
                    ("resourcesPerNode", "resources"),
                ):
                    if trainer.get(field) is not None:
                        container[key] = copy.deepcopy(trainer[field])
    meta = _mapping(trainjob.get("metadata"))
    runtime_meta = _mapping(template.get("metadata"))
    labels = {**_mapping(runtime_meta.get("labels")), **_mapping(spec.get("labels"))}
    labels.update(_mapping(meta.get("labels")))
    annotations = {
        **_mapping(runtime_meta.get("annotations")),
        **_mapping(spec.get("annotations")),
        **_mapping(meta.get("annotations")),
    }
    metadata: dict[str, Any] = {"name": meta.get("name")}
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    if spec.get("suspend") is not None:
        jobset_spec["suspend"] = spec["suspend"]
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": jobset_spec,
    }


Problems = list[tuple[str, str]]
#: Per kind: its pod templates, read from (manifest, spec), problems noted.
_READERS: Mapping[
    str, Callable[[Mapping[str, Any], Mapping[str, Any], Problems], Iterator[JobPodTemplate]]
] = {
    "Job": lambda _, spec, problems: _job(spec, problems),
    "JobSet": lambda _, spec, problems: _jobset(spec, problems),
    "PyTorchJob": lambda _, spec, problems: _replicas(spec, "pytorchReplicaSpecs", problems),
    "MPIJob": lambda _, spec, problems: _replicas(spec, "mpiReplicaSpecs", problems),
    "RayJob": lambda _, spec, problems: _ray_job(spec, problems),
    "RayCluster": lambda _, spec, problems: _ray_cluster(spec, "spec", problems),
    "LeaderWorkerSet": lambda _, spec, problems: _lws(spec, problems),
    "Deployment": _replica_set,
    "StatefulSet": _replica_set,
    "TrainJob": lambda _, spec, problems: _trainjob(spec, problems),
    VOLCANO_JOB: lambda _, spec, problems: _volcano_job(spec, problems),
}


def job_pod_templates(
    manifest: Mapping[str, Any],
) -> tuple[list[JobPodTemplate], list[tuple[str, str]]]:
    """Every pod template of a job manifest of a supported kind, in pod set
    order, those of replicas that run no pod included (what is written to a
    member is checked whole), with the problems found in its shape."""
    problems: list[tuple[str, str]] = []
    kind = job_kind(manifest)
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        return [], [("spec", "spec is required")]
    read = _READERS.get(kind) if kind is not None else None
    if read is None:
        return [], [("kind", f"unsupported kind {manifest.get('kind')!r}")]
    found = list(read(manifest, spec, problems))
    for template in found:
        if not isinstance(template.template, Mapping):
            problems.append((template.path, "a pod template is required"))
    return found, problems
