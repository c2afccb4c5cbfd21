"""Submissions: a Workload, or a job manifest whose pod sets are derived
from it the way Kueue's job integrations derive them; and the security floor.

Pure functions over plain mappings. Every problem names the field at fault
with a JSON path (``spec.template.spec.containers[0].image``) so that the API
can answer 422 with all of them at once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, field_validator

from service.app.schemas import (
    LabelName,
    LabelSelector,
    Name,
    ObjectMeta,
    SecurityPolicy,
    Strict,
    WorkloadClass,
    check_quantity,
)
from service.domain.quantity import QuantityError, canonical_amount

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
CLASS_ANNOTATION = "quartermaster.dev/workload-class"
GPU = "nvidia.com/gpu"
MAX_POD_SETS = 8
MAX_COUNT = 100_000

JOB_KINDS: dict[str, tuple[str, ...]] = {
    "Job": ("batch/v1",),
    "JobSet": ("jobset.x-k8s.io/v1alpha2",),
    "PyTorchJob": ("kubeflow.org/v1",),
    "MPIJob": ("kubeflow.org/v2beta1", "kubeflow.org/v1"),
}
WORKLOAD_API_VERSIONS = ("quartermaster.dev/v1", "kueue.x-k8s.io/v1beta2")


@dataclass
class Problems:
    """Every field error found, as (path, message)."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def __bool__(self) -> bool:
        return bool(self.items)


class SubmissionError(ValueError):
    def __init__(self, kind: str, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{p}: {m}" for p, m in problems))
        self.kind = kind
        self.problems = problems


# -- the Workload shape ------------------------------------------------------------------


class TopologyRequest(Strict):
    required: str | None = Field(default=None, description="node label of the island level")
    preferred: str | None = None

    @field_validator("required", "preferred")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("must not be empty")
        return value


class PodSet(Strict):
    name: LabelName = "main"
    count: int = Field(ge=1, le=MAX_COUNT)
    minCount: int | None = Field(default=None, ge=1)
    template: dict[str, Any] = Field(description="A core/v1 PodTemplateSpec")
    topologyRequest: TopologyRequest | None = None


class WorkloadSpec(Strict):
    queueName: LabelName
    priorityClassName: Name | None = None
    workloadClass: WorkloadClass = "training"
    podSets: list[PodSet] = Field(min_length=1, max_length=MAX_POD_SETS)
    clusterSelector: LabelSelector | None = None
    active: bool = True
    job: dict[str, Any] | None = Field(
        default=None, description="The job manifest to run on the member cluster."
    )
    _totals: dict[str, int] | None = PrivateAttr(default=None)

    @field_validator("podSets")
    @classmethod
    def _unique(cls, value: list[PodSet]) -> list[PodSet]:
        names = [p.name for p in value]
        if len(set(names)) != len(names):
            raise ValueError("pod set names must be unique")
        return value


class WorkloadObject(Strict):
    apiVersion: str = "quartermaster.dev/v1"
    kind: str = "Workload"
    metadata: ObjectMeta
    spec: WorkloadSpec


# -- job manifests → pod sets ------------------------------------------------------------


def _get(obj: Mapping[str, Any], path: str, *keys: str) -> tuple[Any, str]:
    value: Any = obj
    for key in keys:
        if not isinstance(value, Mapping):
            return None, path
        value = value.get(key)
        path = f"{path}.{key}"
    return value, path


def _int(value: Any, default: int, path: str, problems: Problems) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.add(path, "must be a non-negative integer")
        return default
    return value


def _template_topology(template: Mapping[str, Any]) -> dict[str, str] | None:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    if not isinstance(annotations, Mapping):
        return None
    request = {
        key: annotations[annotation]
        for key, annotation in (("required", REQUIRED_TOPOLOGY), ("preferred", PREFERRED_TOPOLOGY))
        if annotation in annotations
    }
    return request or None


def _pod_set(name: str, count: int, template: Any, path: str, problems: Problems) -> dict[str, Any]:
    if not isinstance(template, Mapping):
        problems.add(path, "a pod template is required")
        template = {}
    pod_set: dict[str, Any] = {"name": name, "count": count, "template": dict(template)}
    topology = _template_topology(template)
    if topology:
        pod_set["topologyRequest"] = topology
    return pod_set


def _job_pod_sets(spec: Mapping[str, Any], problems: Problems) -> list[dict[str, Any]]:
    parallelism = _int(spec.get("parallelism"), 1, "spec.parallelism", problems)
    completions = spec.get("completions")
    count = parallelism
    if isinstance(completions, int) and not isinstance(completions, bool) and completions > 0:
        count = min(parallelism, completions)
    return [_pod_set("main", max(count, 1), spec.get("template"), "spec.template", problems)]


def _jobset_pod_sets(spec: Mapping[str, Any], problems: Problems) -> list[dict[str, Any]]:
    replicated = spec.get("replicatedJobs")
    if not isinstance(replicated, list) or not replicated:
        problems.add("spec.replicatedJobs", "at least one replicated job is required")
        return []
    sets = []
    for index, job in enumerate(replicated):
        path = f"spec.replicatedJobs[{index}]"
        if not isinstance(job, Mapping):
            problems.add(path, "must be an object")
            continue
        replicas = _int(job.get("replicas"), 1, f"{path}.replicas", problems)
        job_spec, spec_path = _get(job, path, "template", "spec")
        job_spec = job_spec if isinstance(job_spec, Mapping) else {}
        parallelism = _int(job_spec.get("parallelism"), 1, f"{spec_path}.parallelism", problems)
        name = str(job.get("name") or f"job-{index}")
        sets.append(
            _pod_set(
                name,
                replicas * parallelism,
                job_spec.get("template"),
                f"{spec_path}.template",
                problems,
            )
        )
    return sets


def _replica_pod_sets(
    spec: Mapping[str, Any], field_name: str, problems: Problems
) -> list[dict[str, Any]]:
    replicas = spec.get(field_name)
    if not isinstance(replicas, Mapping) or not replicas:
        problems.add(f"spec.{field_name}", "at least one replica type is required")
        return []
    sets = []
    for replica_type, replica in replicas.items():
        path = f"spec.{field_name}.{replica_type}"
        if not isinstance(replica, Mapping):
            problems.add(path, "must be an object")
            continue
        count = _int(replica.get("replicas"), 1, f"{path}.replicas", problems)
        if count == 0:
            continue
        sets.append(
            _pod_set(
                str(replica_type).lower(),
                count,
                replica.get("template"),
                f"{path}.template",
                problems,
            )
        )
    return sets


def workload_from_job(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload object (plain dict) for a Job, JobSet, PyTorchJob or MPIJob."""
    problems = Problems()
    kind = manifest.get("kind")
    api_version = manifest.get("apiVersion")
    if not isinstance(kind, str) or kind not in JOB_KINDS:
        raise SubmissionError("unsupported-kind", [("kind", f"unsupported kind {kind!r}")])
    if api_version not in JOB_KINDS[kind]:
        raise SubmissionError(
            "unsupported-kind",
            [("apiVersion", f"{kind} must have apiVersion one of {list(JOB_KINDS[kind])}")],
        )
    metadata = manifest.get("metadata")
    spec = manifest.get("spec")
    if not isinstance(metadata, Mapping):
        raise SubmissionError("invalid", [("metadata", "metadata is required")])
    if not isinstance(spec, Mapping):
        raise SubmissionError("invalid", [("spec", "spec is required")])
    if kind == "Job":
        pod_sets = _job_pod_sets(spec, problems)
    elif kind == "JobSet":
        pod_sets = _jobset_pod_sets(spec, problems)
    elif kind == "PyTorchJob":
        pod_sets = _replica_pod_sets(spec, "pytorchReplicaSpecs", problems)
    else:
        pod_sets = _replica_pod_sets(spec, "mpiReplicaSpecs", problems)
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    queue = labels.get(QUEUE_LABEL) if isinstance(labels, Mapping) else None
    if not queue:
        problems.add(f"metadata.labels.{QUEUE_LABEL}", "the queue label is required")
    if problems:
        raise SubmissionError("invalid", problems.items)
    workload_spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets, "job": dict(manifest)}
    if labels.get(PRIORITY_LABEL):
        workload_spec["priorityClassName"] = labels[PRIORITY_LABEL]
    if isinstance(annotations, Mapping) and annotations.get(CLASS_ANNOTATION):
        workload_spec["workloadClass"] = annotations[CLASS_ANNOTATION]
    meta = {k: metadata[k] for k in ("name", "namespace", "labels", "annotations") if k in metadata}
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": meta,
        "spec": workload_spec,
    }


def parse_submission(body: Any) -> WorkloadObject:
    """A Workload from any accepted submission shape; SubmissionError otherwise."""
    if not isinstance(body, Mapping):
        raise SubmissionError("invalid", [("", "the body must be an object")])
    kind = body.get("kind", "Workload")
    if not isinstance(kind, str):
        raise SubmissionError("invalid", [("kind", "must be a string")])
    if kind in JOB_KINDS:
        body = workload_from_job(body)
    elif kind != "Workload":
        raise SubmissionError("unsupported-kind", [("kind", f"unsupported kind {body['kind']!r}")])
    elif body.get("apiVersion", WORKLOAD_API_VERSIONS[0]) not in WORKLOAD_API_VERSIONS:
        raise SubmissionError(
            "invalid", [("apiVersion", f"must be one of {list(WORKLOAD_API_VERSIONS)}")]
        )
    try:
        workload = WorkloadObject.model_validate(body)
    except ValidationError as error:
        raise SubmissionError("invalid", validation_problems(error)) from None
    problems = Problems()
    totals: dict[str, int] = {}
    for index, pod_set in enumerate(workload.spec.podSets):
        per_pod = pod_requests(pod_set.template, f"spec.podSets[{index}].template", problems)
        for resource, amount in per_pod.items():
            totals[resource] = totals.get(resource, 0) + amount * pod_set.count
    if problems:
        raise SubmissionError("invalid", problems.items)
    workload.spec._totals = totals
    return workload


def validation_problems(error: ValidationError) -> list[tuple[str, str]]:
    return [(json_path(e["loc"]), e["msg"]) for e in error.errors()]


def json_path(loc: tuple[Any, ...] | list[Any]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


# -- requests ----------------------------------------------------------------------------


def _containers(pod_spec: Mapping[str, Any], key: str, path: str) -> Iterator[tuple[str, Any]]:
    containers = pod_spec.get(key) or []
    if not isinstance(containers, list):
        yield f"{path}.{key}", None
        return
    for index, container in enumerate(containers):
        yield f"{path}.{key}[{index}]", container


def _container_requests(container: Any, path: str, problems: Problems) -> dict[str, int]:
    if not isinstance(container, Mapping):
        problems.add(path, "must be an object")
        return {}
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        problems.add(f"{path}.resources", "must be an object")
        return {}
    # Kubernetes defaults requests to limits where only limits are given.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    amounts: dict[str, int] = {}
    for resource, value in merged.items():
        if isinstance(value, bool) or not isinstance(value, int | str):
            problems.add(
                f"{path}.resources.requests.{resource}",
                "must be a quantity: a number or a string such as '500m' or '64Gi'",
            )
            continue
        try:
            amounts[str(resource)] = _amount(str(resource), value)
        except (QuantityError, ValueError, TypeError) as error:
            problems.add(f"{path}.resources.requests.{resource}", str(error))
    return amounts


@functools.lru_cache(maxsize=4096)
def _amount(resource: str, value: int | str) -> int:
    """Canonical amount of one request; parsing a quantity is exact (a
    Fraction) and slow, and a fleet's requests repeat a few values."""
    check_quantity(value)
    return canonical_amount(resource, value)


def pod_requests(template: Mapping[str, Any], path: str, problems: Problems) -> dict[str, int]:
    """Per-pod requests as the scheduler counts them: the sum over containers,
    or the largest init container if that is more, per resource."""
    pod_spec = template.get("spec")
    if not isinstance(pod_spec, Mapping):
        problems.add(f"{path}.spec", "a pod spec is required")
        return {}
    total: dict[str, int] = {}
    containers = list(_containers(pod_spec, "containers", f"{path}.spec"))
    if not containers:
        problems.add(f"{path}.spec.containers", "at least one container is required")
    for container_path, container in containers:
        for resource, amount in _container_requests(container, container_path, problems).items():
            total[resource] = total.get(resource, 0) + amount
    for container_path, container in _containers(pod_spec, "initContainers", f"{path}.spec"):
        for resource, amount in _container_requests(container, container_path, problems).items():
            total[resource] = max(total.get(resource, 0), amount)
    return total


# -- the security floor ------------------------------------------------------------------


def security_violations(spec: WorkloadSpec, policy: SecurityPolicy) -> list[tuple[str, str]]:
    """Every rule of ``policy`` that the workload's pod templates break."""
    problems = Problems()
    for index, pod_set in enumerate(spec.podSets):
        _check_pod(pod_set.template, f"spec.podSets[{index}].template.spec", policy, problems)
    return problems.items


def _check_pod(
    template: Mapping[str, Any], path: str, policy: SecurityPolicy, problems: Problems
) -> None:
    pod = template.get("spec") or {}
    account = pod.get("serviceAccountName") or pod.get("serviceAccount") or "default"
    if policy.forbidDefaultServiceAccount and account == "default":
        problems.add(f"{path}.serviceAccountName", "must name a service account other than default")
    if not policy.allowHostNetwork:
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key):
                problems.add(f"{path}.{key}", f"{key} is not allowed")
    if not policy.allowHostPath:
        for index, volume in enumerate(pod.get("volumes") or []):
            if isinstance(volume, Mapping) and "hostPath" in volume:
                problems.add(
                    f"{path}.volumes[{index}].hostPath", "hostPath volumes are not allowed"
                )
    uses_gpu = False
    for key in ("initContainers", "containers"):
        for container_path, container in _containers(pod, key, path):
            if not isinstance(container, Mapping):
                continue
            uses_gpu |= _uses_gpu(container)
            _check_container(container, container_path, policy, problems)
    if policy.requireRuntimeClassForGPU and uses_gpu and not pod.get("runtimeClassName"):
        problems.add(f"{path}.runtimeClassName", "GPU pods must name a runtime class")


def _uses_gpu(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return (
        any(GPU in (resources.get(part) or {}) for part in ("requests", "limits"))
        if isinstance(resources, Mapping)
        else False
    )


def _check_container(
    container: Mapping[str, Any], path: str, policy: SecurityPolicy, problems: Problems
) -> None:
    image = container.get("image")
    if policy.requireImageDigest and (not isinstance(image, str) or "@sha256:" not in image):
        problems.add(f"{path}.image", "the image must be pinned by digest (name@sha256:...)")
    context = container.get("securityContext") or {}
    if not isinstance(context, Mapping):
        return
    if not policy.allowPrivileged and context.get("privileged"):
        problems.add(f"{path}.securityContext.privileged", "privileged containers are not allowed")
    if not policy.allowPrivilegeEscalation and context.get("allowPrivilegeEscalation") is True:
        problems.add(
            f"{path}.securityContext.allowPrivilegeEscalation",
            "privilege escalation is not allowed",
        )


def total_requests(spec: WorkloadSpec) -> dict[str, int]:
    """The whole gang's requests, per resource (canonical units); worked out
    once per parsed spec."""
    if spec._totals is None:
        total: dict[str, int] = {}
        for pod_set in spec.podSets:
            per_pod = pod_requests(pod_set.template, "", Problems())
            for resource, amount in per_pod.items():
                total[resource] = total.get(resource, 0) + amount * pod_set.count
        spec._totals = total
    return dict(spec._totals)
