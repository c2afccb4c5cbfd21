"""The job kinds a submission may carry, and every pod template in each.

One reading of a job manifest for the whole service: the pod sets a
submission is charged for, the templates the security floor checks and the
templates the reconciler pins to their islands are the same list, so that
what is checked is what runs (a summary written beside the manifest is
never trusted). Pod sets are named and counted as Kueue's job integrations
do (``pkg/controller/jobs/{job,jobset,kubeflow}``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "JOB_API_VERSIONS",
    "JobPodTemplate",
    "job_pod_templates",
]

#: The job kinds a submission may carry, with the apiVersions accepted.
JOB_API_VERSIONS: Mapping[str, tuple[str, ...]] = {
    "Job": ("batch/v1",),
    "JobSet": ("jobset.x-k8s.io/v1alpha2",),
    "PyTorchJob": ("kubeflow.org/v1",),
    "MPIJob": ("kubeflow.org/v2beta1", "kubeflow.org/v1"),
}
_REPLICA_SPECS = {"PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}


@dataclass(frozen=True)
class JobPodTemplate:
    """One pod template of a job manifest: the pod set it makes, the pods it
    runs and where it stands (a JSON path from the manifest's root)."""

    name: str
    count: int
    path: str
    template: Any
    """The template as found; a problem is reported where it is not a mapping."""


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


def job_pod_templates(
    manifest: Mapping[str, Any],
) -> tuple[list[JobPodTemplate], list[tuple[str, str]]]:
    """Every pod template of a job manifest of a supported kind, in pod set
    order, those of replicas that run no pod included (what is written to a
    member is checked whole), with the problems found in its shape."""
    problems: list[tuple[str, str]] = []
    kind = manifest.get("kind")
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        return [], [("spec", "spec is required")]
    if kind == "Job":
        found = list(_job(spec, problems))
    elif kind == "JobSet":
        found = list(_jobset(spec, problems))
    elif isinstance(kind, str) and kind in _REPLICA_SPECS:
        found = list(_replicas(spec, _REPLICA_SPECS[kind], problems))
    else:
        return [], [("kind", f"unsupported kind {kind!r}")]
    for template in found:
        if not isinstance(template.template, Mapping):
            problems.append((template.path, "a pod template is required"))
    return found, problems
