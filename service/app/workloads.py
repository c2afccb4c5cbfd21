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

from service.app import floor
from service.app.kube_schemas import custom_problems, schema_problems
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
from service.domain.jobs import JOB_API_VERSIONS, job_pod_templates
from service.domain.quantity import MAX_SAFE_INTEGER, QuantityError, canonical_amount

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
CLASS_ANNOTATION = "quartermaster.dev/workload-class"
GPU = "nvidia.com/gpu"
MAX_POD_SETS = 8
MAX_COUNT = 100_000

JOB_KINDS = JOB_API_VERSIONS
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
    _templates: list[tuple[str, Mapping[str, Any]]] | None = PrivateAttr(default=None)
    _class_field: str = PrivateAttr(default="spec.workloadClass")

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


def _check_kind(manifest: Mapping[str, Any], prefix: str) -> str:
    kind = manifest.get("kind")
    api_version = manifest.get("apiVersion")
    if not isinstance(kind, str) or kind not in JOB_KINDS:
        raise SubmissionError("unsupported-kind", [(f"{prefix}kind", f"unsupported kind {kind!r}")])
    if api_version not in JOB_KINDS[kind]:
        raise SubmissionError(
            "unsupported-kind",
            [
                (
                    f"{prefix}apiVersion",
                    f"{kind} must have apiVersion one of {list(JOB_KINDS[kind])}",
                )
            ],
        )
    return kind


def _schema_problems(manifest: Mapping[str, Any], prefix: str) -> list[tuple[str, str]]:
    """Kubernetes' schema problems of a job manifest: batch/v1 Job against
    Kubernetes' OpenAPI; a custom kind against its CRD, and each of its pod
    templates against the PodTemplateSpec schema."""
    if manifest.get("kind") == "Job":
        return schema_problems("Job", manifest, prefix.rstrip("."))
    templates, _ = job_pod_templates(manifest)
    found = custom_problems(manifest, prefix) + [
        problem
        for t in templates
        if isinstance(t.template, Mapping)
        for problem in schema_problems("PodTemplateSpec", t.template, f"{prefix}{t.path}")
    ]
    return list(dict.fromkeys(found))


def job_pod_sets(
    manifest: Mapping[str, Any], prefix: str = ""
) -> tuple[list[dict[str, Any]], list[tuple[str, Mapping[str, Any]]]]:
    """The pod sets a job manifest runs (those of no pod left out) and every
    pod template in it with its path under ``prefix``; SubmissionError for a
    kind not supported or a manifest Kubernetes' schemas refuse."""
    _check_kind(manifest, prefix)
    templates, shape = job_pod_templates(manifest)
    problems = [(f"{prefix}{path}", message) for path, message in shape]
    problems += _schema_problems(manifest, prefix)
    if problems:
        raise SubmissionError("invalid", problems)
    pod_sets = []
    for t in templates:
        if t.count == 0:
            continue
        pod_set: dict[str, Any] = {"name": t.name, "count": t.count, "template": dict(t.template)}
        topology = _template_topology(t.template)
        if topology:
            pod_set["topologyRequest"] = topology
        pod_sets.append(pod_set)
    return pod_sets, [(f"{prefix}{t.path}", t.template) for t in templates]


def workload_from_job(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload object (plain dict) for a Job, JobSet, PyTorchJob or MPIJob."""
    _check_kind(manifest, "")
    metadata = manifest.get("metadata")
    if not isinstance(metadata, Mapping):
        raise SubmissionError("invalid", [("metadata", "metadata is required")])
    if not isinstance(manifest.get("spec"), Mapping):
        raise SubmissionError("invalid", [("spec", "spec is required")])
    pod_sets, _ = job_pod_sets(manifest)
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    queue = labels.get(QUEUE_LABEL) if isinstance(labels, Mapping) else None
    if not queue:
        raise SubmissionError(
            "invalid", [(f"metadata.labels.{QUEUE_LABEL}", "the queue label is required")]
        )
    workload_spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets, "job": dict(manifest)}
    if labels.get(PRIORITY_LABEL):
        workload_spec["priorityClassName"] = labels[PRIORITY_LABEL]
    if isinstance(annotations, Mapping) and annotations.get(CLASS_ANNOTATION):
        workload_spec["workloadClass"] = annotations[CLASS_ANNOTATION]
    # Kubernetes reads a null (say, a key holding only a comment) as absent.
    meta = {
        k: metadata[k]
        for k in ("name", "namespace", "labels", "annotations")
        if metadata.get(k) is not None
    }
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": meta,
        "spec": workload_spec,
    }


def _with_job_pod_sets(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload that carries ``spec.job`` runs that job as written: its pod
    sets are the job's, derived here; pod sets written beside it must be
    those or be left out (a summary beside the manifest is never trusted)."""
    spec = dict(body["spec"])
    derived, _ = job_pod_sets(spec["job"], "spec.job.")
    given = spec.get("podSets")
    if given is None:
        spec["podSets"] = derived
        return {**body, "spec": spec}
    if not isinstance(given, list):
        raise SubmissionError("invalid", [("spec.podSets", "must be a list")])
    problems = []
    if len(given) != len(derived):
        problems.append(
            ("spec.podSets", f"spec.job runs {len(derived)} pod set(s), not {len(given)}")
        )
    for index, (mine, theirs) in enumerate(zip(given, derived, strict=False)):
        path = f"spec.podSets[{index}]"
        if not isinstance(mine, Mapping):
            problems.append((path, "must be an object"))
            continue
        for key in ("name", "count", "template"):
            if mine.get(key, "main" if key == "name" else None) != theirs[key]:
                problems.append(
                    (f"{path}.{key}", f"must be the {key} of spec.job's pod set {theirs['name']}")
                )
        if mine.get("minCount") is not None:
            problems.append((f"{path}.minCount", "spec.job runs every pod of its pod sets"))
    if problems:
        raise SubmissionError(
            "invalid",
            [
                *problems,
                ("spec.podSets", "leave spec.podSets out to have them derived from spec.job"),
            ],
        )
    spec["podSets"] = [
        {
            **theirs,
            **({"topologyRequest": m["topologyRequest"]} if m.get("topologyRequest") else {}),
        }
        for m, theirs in zip(given, derived, strict=True)
    ]
    return {**body, "spec": spec}


def parse_submission(body: Any) -> WorkloadObject:
    """A Workload from any accepted submission shape; SubmissionError otherwise."""
    if not isinstance(body, Mapping):
        raise SubmissionError("invalid", [("", "the body must be an object")])
    kind = body.get("kind", "Workload")
    if not isinstance(kind, str):
        raise SubmissionError("invalid", [("kind", "must be a string")])
    templates: list[tuple[str, Mapping[str, Any]]] | None = None
    if kind in JOB_KINDS:
        _, templates = job_pod_sets(body)
        body = workload_from_job(body)
    elif kind != "Workload":
        raise SubmissionError("unsupported-kind", [("kind", f"unsupported kind {body['kind']!r}")])
    elif body.get("apiVersion", WORKLOAD_API_VERSIONS[0]) not in WORKLOAD_API_VERSIONS:
        raise SubmissionError(
            "invalid", [("apiVersion", f"must be one of {list(WORKLOAD_API_VERSIONS)}")]
        )
    elif isinstance(body.get("spec"), Mapping) and isinstance(body["spec"].get("job"), Mapping):
        body = _with_job_pod_sets(body)
        _, templates = job_pod_sets(body["spec"]["job"], "spec.job.")
    try:
        workload = WorkloadObject.model_validate(body)
    except ValidationError as error:
        raise SubmissionError("invalid", validation_problems(error)) from None
    if templates is None:
        templates = [
            (f"spec.podSets[{i}].template", p.template) for i, p in enumerate(workload.spec.podSets)
        ]
        schema = [
            problem
            for path, template in templates
            for problem in schema_problems("PodTemplateSpec", template, path)
        ]
        if schema:
            raise SubmissionError("invalid", schema)
    problems = Problems()
    totals: dict[str, int] = {}
    for index, pod_set in enumerate(workload.spec.podSets):
        per_pod = pod_requests(pod_set.template, f"spec.podSets[{index}].template", problems)
        for resource, amount in per_pod.items():
            totals[resource] = totals.get(resource, 0) + amount * pod_set.count
    for resource in [r for r, total in totals.items() if total > MAX_SAFE_INTEGER]:
        problems.add("spec.podSets", f"the gang's {resource} exceeds {MAX_SAFE_INTEGER} in all")
    if problems:
        raise SubmissionError("invalid", problems.items)
    workload.spec._totals = totals
    workload.spec._templates = templates
    if kind in JOB_KINDS:
        workload.spec._class_field = f"metadata.annotations.{CLASS_ANNOTATION}"
    return workload


def class_field(spec: WorkloadSpec) -> str | None:
    """Where the submitter chose the workload's class (a Workload's
    ``spec.workloadClass``, a job's annotation), or None: then its queue's."""
    return spec._class_field if "workloadClass" in spec.model_fields_set else None


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


def pod_templates(spec: WorkloadSpec) -> list[tuple[str, Mapping[str, Any]]]:
    """Every pod template the workload runs on a member, with its path in
    what was submitted: the job's own when it carries one, else its pod sets'."""
    if spec._templates is not None:
        return spec._templates
    if isinstance(spec.job, Mapping) and spec.job.get("kind") in JOB_KINDS:
        found, _ = job_pod_templates(spec.job)
        return [
            (f"spec.job.{t.path}", t.template) for t in found if isinstance(t.template, Mapping)
        ]
    return [(f"spec.podSets[{i}].template", p.template) for i, p in enumerate(spec.podSets)]


def security_violations(spec: WorkloadSpec, policy: SecurityPolicy) -> list[tuple[str, str]]:
    """Every rule of ``policy`` that a pod template the workload runs breaks."""
    return floor.violations(pod_templates(spec), policy)


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
