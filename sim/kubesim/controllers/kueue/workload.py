"""What a Workload is to the Kueue-like controller (Kueue's ``pkg/workload``): the names
it is known by, the pod sets it copies from its job and the quota its admission holds."""

from __future__ import annotations

import hashlib
from typing import Any

from service.domain.quantity import canonical_amount
from sim.kubesim.controllers.base import is_true
from sim.kubesim.quantity import canonical_list
from sim.kubesim.store import clone

__all__ = [
    "CLUSTER_QUEUES",
    "FLAVORS",
    "LOCAL_QUEUES",
    "QUEUE_LABEL",
    "WORKLOADS",
    "admission_usage",
    "amount_of",
    "is_pending",
    "is_reserving",
    "pod_set_template",
    "workload_name",
]

Obj = dict[str, Any]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
WORKLOADS = "workloads.kueue.x-k8s.io"
CLUSTER_QUEUES = "clusterqueues.kueue.x-k8s.io"
LOCAL_QUEUES = "localqueues.kueue.x-k8s.io"
FLAVORS = "resourceflavors.kueue.x-k8s.io"


def workload_name(kind: str, job_name: str, job_uid: str) -> str:
    digest = hashlib.sha256(f"{job_name}/{job_uid}".encode()).hexdigest()[:5]
    prefix = f"{kind.lower()}-{job_name}"[: 63 - 6].rstrip("-.")
    return f"{prefix}-{digest}"


def amount_of(resource: str, value: Any) -> int:
    """A quantity as an amount in Kueue's canonical unit (milli-cpu, bytes, units)."""
    return canonical_amount(resource, value)


def pod_set_template(template: Obj) -> Obj:
    """A pod template as a Workload pod set keeps it (labels, annotations and spec).

    Kueue decodes the job into Go types (quantities canonical) and, in
    ``workload.AdjustResources``, requests what a container limits but does not request.
    """
    metadata = template.get("metadata") or {}
    kept = {k: clone(metadata[k]) for k in ("labels", "annotations") if metadata.get(k)}
    spec = clone(template.get("spec") or {})
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        for key in ("limits", "requests"):
            if key in resources:
                resources[key] = canonical_list(resources[key])
        if resources.get("limits"):
            resources["requests"] = {**resources["limits"], **(resources.get("requests") or {})}
    return {"metadata": kept, "spec": spec}


def is_reserving(workload: Obj) -> bool:
    return (
        is_true(workload, "QuotaReserved")
        and not is_true(workload, "Finished")
        and bool((workload.get("status") or {}).get("admission"))
    )


def is_pending(workload: Obj) -> bool:
    return (
        workload["spec"].get("active", True) is not False
        and not is_true(workload, "QuotaReserved")
        and not is_true(workload, "Finished")
        and not workload["metadata"].get("deletionTimestamp")
    )


def admission_usage(admission: Obj) -> list[tuple[str, str, int]]:
    usage = []
    for assignment in admission.get("podSetAssignments") or ():
        flavors = assignment.get("flavors") or {}
        for resource, amount in (assignment.get("resourceUsage") or {}).items():
            if resource in flavors:
                usage.append((flavors[resource], resource, amount_of(resource, amount)))
    return usage
