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
from service.app.kube_schemas import BUILT_IN_KINDS, custom_problems, schema_problems
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
from service.domain.jobs import (
    GANG_ANNOTATION,
    JOB_API_VERSIONS,
    SERVING_KINDS,
    VOLCANO_JOB,
    JobPodTemplate,
    job_class,
    job_kind,
    job_pod_templates,
    job_replicas,
)
from service.domain.quantity import MAX_SAFE_INTEGER, QuantityError, canonical_amount

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
CLASS_ANNOTATION = "quartermaster.dev/workload-class"
#: On a serving job manifest: its ``spec.minReplicas`` (e.g. its HPA's ``minReplicas``).
MIN_REPLICAS_ANNOTATION = "quartermaster.dev/min-replicas"
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
    podSetGroupName: LabelName | None = Field(
        default=None,
        description=(
            "Kueue's podSetGroupName: pod sets of this workload naming the same group "
            "with a required topology land in one domain of it (a LeaderWorkerSet "
            "group's leader and workers in one island)."
        ),
    )

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
    workloadClass: WorkloadClass = Field(
        default="training",
        description=(
            "training (exclusive gangs) or inference (serving). When left out it comes "
            "from the kind of spec.job: Deployment, StatefulSet and LeaderWorkerSet are "
            "inference, every other kind training; with no spec.job, the queue's class. "
            "A job manifest submitted as is says otherwise with its annotation "
            f"{CLASS_ANNOTATION}. It must be the class its ClusterQueue serves."
        ),
    )
    podSets: list[PodSet] = Field(min_length=1, max_length=MAX_POD_SETS)
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description=(
            "How many gangs of the pod sets above a serving spec.job runs, each admitted "
            "whole: a Deployment's or StatefulSet's replicas (a pod each), a "
            "LeaderWorkerSet's groups. Derived from spec.job, never written; absent for "
            'one gang. A StatefulSet annotated quartermaster.dev/gang: "true" is one gang.'
        ),
    )
    minReplicas: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNT,
        description=(
            "Of a serving workload: the replicas no preemption takes it below (a "
            "training reclaim, fair sharing, a higher priority); above it replicas are "
            "preempted one at a time, newest first. A job manifest says it with the "
            f"annotation {MIN_REPLICAS_ANNOTATION} (e.g. its HPA's minReplicas). "
            "At most spec.replicas; absent: 0."
        ),
    )
    clusterSelector: LabelSelector | None = None
    active: bool = True
    job: dict[str, Any] | None = Field(
        default=None, description="The job manifest to run on the member cluster."
    )
    _totals: dict[str, int] | None = PrivateAttr(default=None)
    _templates: list[tuple[str, Mapping[str, Any]]] | None = PrivateAttr(default=None)
    _class_field: str | None = PrivateAttr(default=None)

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
    """Kubernetes' schema problems of a job manifest: a built-in kind (Job,
    Deployment, StatefulSet) against Kubernetes' OpenAPI; a custom kind
    against its CRD, and each of its pod templates against the
    PodTemplateSpec schema. A Volcano Job is a custom kind (``job_kind``)."""
    kind = job_kind(manifest)
    if kind is not None and kind in BUILT_IN_KINDS:
        return schema_problems(kind, manifest, prefix.rstrip("."))
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
    pod_sets = [_pod_set(t) for t in templates if t.count > 0]
    if manifest.get("kind") == "LeaderWorkerSet":
        _one_island(pod_sets, templates, prefix)
    return pod_sets, [(f"{prefix}{t.path}", t.template) for t in templates]


def _pod_set(found: JobPodTemplate) -> dict[str, Any]:
    """A pod set of a job's template; what its controller adds to the pods
    (a Ray head's autoscaler) is charged with it."""
    template = dict(found.template)
    if found.added:
        spec = dict(template.get("spec") or {})
        spec["containers"] = [*(spec.get("containers") or []), *map(dict, found.added)]
        template["spec"] = spec
    pod_set: dict[str, Any] = {"name": found.name, "count": found.count, "template": template}
    topology = _template_topology(found.template)
    if topology:
        pod_set["topologyRequest"] = topology
    return pod_set


def _one_island(
    pod_sets: list[dict[str, Any]], templates: list[JobPodTemplate], prefix: str
) -> None:
    """A LeaderWorkerSet group runs in one island: the level its leader or
    worker template requires (Kueue's annotation) is required of both."""
    levels = sorted(
        {
            str(requested["required"])
            for t in templates
            if (requested := _template_topology(t.template) or {}).get("required")
        }
    )
    if len(levels) != 1:
        path = f"{prefix}{templates[0].path}.metadata.annotations.{REQUIRED_TOPOLOGY}"
        found = ", ".join(levels) or "none"
        raise SubmissionError(
            "invalid",
            [(path, f"a LeaderWorkerSet group runs in one island: name its level once ({found})")],
        )
    group = {"podSetGroupName": "group"} if len(pod_sets) > 1 else {}
    for pod_set in pod_sets:
        pod_set["topologyRequest"] = {"required": levels[0], **group}


def _replicas_of(job: Mapping[str, Any]) -> dict[str, int]:
    """``spec.replicas`` of a workload running ``job``: only where it runs
    more than one gang (or none: refused by the field's bound)."""
    replicas = job_replicas(job)
    return {} if replicas == 1 else {"replicas": replicas}


def _volcano_fields(manifest: Mapping[str, Any]) -> dict[str, str]:
    """What a Volcano Job names in its own fields, read where Kueue's labels
    are absent (the labels win): ``spec.queue`` as the LocalQueue of its
    namespace (``qmctl apply`` of a Volcano Queue makes a ClusterQueue of
    the same name: docs/volcano.md) and ``spec.priorityClassName`` as the
    WorkloadPriorityClass."""
    spec = manifest.get("spec")
    if job_kind(manifest) != VOLCANO_JOB or not isinstance(spec, Mapping):
        return {}
    found = {"queueName": spec.get("queue"), "priorityClassName": spec.get("priorityClassName")}
    return {k: v for k, v in found.items() if isinstance(v, str) and v}


def volcano_island(job: Mapping[str, Any] | None) -> str | None:
    """What a Volcano Job's ``spec.networkTopology`` asks of its gang:
    ``required`` — inside one tier-1 HyperNode (``mode: hard``, Volcano's
    default, with ``highestTierAllowed: 1``), which is one fabric island;
    ``preferred`` — the same, best effort (``mode: soft``); else nothing (a
    higher tier is wider than an island, and a gang already lands in one
    cluster)."""
    if job is None or job_kind(job) != VOLCANO_JOB:
        return None
    topology = (job.get("spec") or {}).get("networkTopology")
    if not isinstance(topology, Mapping) or topology.get("highestTierAllowed") != 1:
        return None
    return "preferred" if topology.get("mode") == "soft" else "required"


def workload_from_job(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload object (plain dict) for a job manifest of any accepted
    kind, its class the annotation's or its kind's."""
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
    volcano = _volcano_fields(manifest)
    queue = queue or volcano.get("queueName")
    if not queue:
        also = " (or, on a Volcano Job, spec.queue)" if job_kind(manifest) == VOLCANO_JOB else ""
        raise SubmissionError(
            "invalid", [(f"metadata.labels.{QUEUE_LABEL}", f"the queue label is required{also}")]
        )
    workload_spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": pod_sets,
        "job": dict(manifest),
        **_replicas_of(manifest),
    }
    if labels.get(PRIORITY_LABEL):
        workload_spec["priorityClassName"] = labels[PRIORITY_LABEL]
    elif volcano.get("priorityClassName"):
        workload_spec["priorityClassName"] = volcano["priorityClassName"]
    floor = annotations.get(MIN_REPLICAS_ANNOTATION) if isinstance(annotations, Mapping) else None
    if floor is not None:
        text = str(floor)
        if not text.isdigit():
            raise SubmissionError(
                "invalid",
                [(f"metadata.annotations.{MIN_REPLICAS_ANNOTATION}", "must be a whole number")],
            )
        workload_spec["minReplicas"] = int(text)
    named = annotations.get(CLASS_ANNOTATION) if isinstance(annotations, Mapping) else None
    workload_spec["workloadClass"] = named or job_class(str(manifest["kind"]))
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
    replicas = _replicas_of(spec["job"]).get("replicas")
    if spec.get("replicas") not in (None, replicas):
        raise SubmissionError(
            "invalid", [("spec.replicas", f"must be spec.job's: {replicas}, or left out")]
        )
    spec.pop("replicas", None)
    if replicas is not None:
        spec["replicas"] = replicas
    spec.setdefault("workloadClass", job_class(str(spec["job"]["kind"])))
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
    carries_job = False
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
        carries_job = True
        body = _with_job_pod_sets(body)
        _, templates = job_pod_sets(body["spec"]["job"], "spec.job.")
    try:
        workload = WorkloadObject.model_validate(body)
    except ValidationError as error:
        raise SubmissionError("invalid", validation_problems(error)) from None
    if workload.spec.replicas is not None and kind not in JOB_KINDS and not carries_job:
        raise SubmissionError(
            "invalid", [("spec.replicas", "is derived from a serving spec.job; leave it out")]
        )
    if workload.spec.minReplicas is not None and workload.spec.minReplicas > (
        workload.spec.replicas or 1
    ):
        field = "spec.minReplicas"
        if kind in JOB_KINDS:
            field = f"metadata.annotations.{MIN_REPLICAS_ANNOTATION}"
        raise SubmissionError(
            "invalid", [(field, f"must be at most spec.replicas ({workload.spec.replicas or 1})")]
        )
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
    gangs = workload.spec.replicas or 1
    for index, pod_set in enumerate(workload.spec.podSets):
        per_pod = pod_requests(pod_set.template, f"spec.podSets[{index}].template", problems)
        for resource, amount in per_pod.items():
            totals[resource] = totals.get(resource, 0) + amount * pod_set.count * gangs
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
    """Where the workload's class was chosen or is said otherwise (a
    Workload's ``spec.workloadClass``, a job's annotation): a class named
    there or taken from a job's kind must be its queue's. None when neither
    names it: then it is its queue's."""
    if "workloadClass" not in spec.model_fields_set:
        return None
    return spec._class_field or "spec.workloadClass"


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
    """The whole workload's requests, per resource (canonical units): every
    gang of it (``spec.replicas``); worked out once per parsed spec."""
    if spec._totals is None:
        total: dict[str, int] = {}
        gangs = spec.replicas or 1
        for pod_set in spec.podSets:
            per_pod = pod_requests(pod_set.template, "", Problems())
            for resource, amount in per_pod.items():
                total[resource] = total.get(resource, 0) + amount * pod_set.count * gangs
        spec._totals = total
    return dict(spec._totals)


def scale_problems(spec: Mapping[str, Any], body: Any) -> tuple[int, list[tuple[str, str]]]:
    """The replicas a scale request (Kubernetes' ``Scale``: ``{"spec":
    {"replicas": n}}``) asks of a workload with ``spec``, and what is wrong
    with it: only a serving workload run replica by replica scales."""
    asked = body.get("spec") if isinstance(body, Mapping) else None
    replicas = asked.get("replicas") if isinstance(asked, Mapping) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        return 0, [("spec.replicas", f"must be an integer from 1 to {MAX_COUNT}")]
    if not 1 <= replicas <= MAX_COUNT:
        return 0, [("spec.replicas", f"must be an integer from 1 to {MAX_COUNT}")]
    floor = spec.get("minReplicas") or 0
    if replicas < floor:
        return replicas, [("spec.replicas", f"must be at least spec.minReplicas ({floor})")]
    job = spec.get("job")
    kind = job.get("kind") if isinstance(job, Mapping) else None
    annotations = ((job or {}).get("metadata") or {}).get("annotations") or {}
    if kind not in SERVING_KINDS or annotations.get(GANG_ANNOTATION) == "true":
        return replicas, [
            (
                "spec.replicas",
                "only a serving workload scales: a Deployment, a LeaderWorkerSet, or a "
                "StatefulSet admitted replica by replica",
            )
        ]
    return replicas, []
