"""Read-model rows to the engine's values, and its admissions back to status.

Pure: the caches parse a row once per version with these, the submit path
judges a stored spec with ``workload_from_row``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.app.admission.repository import WorkloadRow
from service.app.workloads import Problems, pod_requests
from service.domain.inventory import Cluster, Node
from service.domain.manifests import (
    WORKLOAD_CLASS_LABEL,
    cluster_queue_from_manifest,
    cohort_from_manifest,
    label_selector_from_manifest,
    local_queue_from_manifest,
    priority_class_from_manifest,
    resource_flavor_from_manifest,
    taint_from_manifest,
    toleration_from_manifest,
    topology_from_manifest,
)
from service.domain.quantity import canonical_amount, format_amount
from service.domain.times import rfc3339
from service.domain.workload import (
    Admission,
    AdmittedWorkload,
    PodSet,
    PodSetAssignment,
    RequeueState,
    TopologyRequest,
    Workload,
)
from service.engine import AdmissionDecision

Obj = dict[str, Any]


def quantities(values: Mapping[str, Any] | None) -> dict[str, int]:
    return {str(r): _amount(str(r), q) for r, q in (values or {}).items()}


@functools.lru_cache(maxsize=4096)
def _amount(resource: str, quantity: str | int | float) -> int:
    """Parsed once per distinct quantity: a fleet's nodes and gangs carry a
    few, and parsing each (with fractions) every cycle cost more than the
    engine."""
    return canonical_amount(resource, quantity)


def timestamp(value: Any, default: float) -> float:
    """Seconds since the epoch of an ISO time; ``default`` when absent."""
    if not value:
        return default
    return datetime.fromisoformat(str(value)).timestamp()


def workload_from_row(row: WorkloadRow) -> Workload:
    spec, status = row.spec, row.status
    pod_sets = []
    for raw in spec.get("podSets") or ():
        template = raw.get("template") or {}
        pod_spec = template.get("spec") or {}
        request = raw.get("topologyRequest") or {}
        topology = None
        if request.get("required"):
            topology = TopologyRequest(
                "required", request["required"], group=request.get("podSetGroupName")
            )
        elif request.get("preferred"):
            topology = TopologyRequest("preferred", request["preferred"])
        pod_sets.append(
            PodSet(
                name=str(raw.get("name", "main")),
                count=int(raw["count"]),
                requests=pod_requests(template, "", Problems()),
                topology_request=topology,
                tolerations=tuple(
                    toleration_from_manifest(t) for t in pod_spec.get("tolerations") or ()
                ),
                node_selector={
                    str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()
                },
            )
        )
    requeue = status.get("requeueState")
    created = row.created_at.timestamp()
    return Workload(
        namespace=row.namespace,
        name=row.name,
        queue_name=str(spec["queueName"]),
        pod_sets=tuple(pod_sets),
        creation_time=created,
        priority=spec.get("priority"),
        priority_class_name=spec.get("priorityClassName"),
        workload_class=spec.get("workloadClass", "training"),
        min_replicas=int(spec.get("minReplicas") or 0),
        cluster_selector=label_selector_from_manifest(spec.get("clusterSelector")),
        active=bool(spec.get("active", True)),
        requeue_state=RequeueState(
            count=int(requeue.get("count", 0)),
            requeue_at=timestamp(requeue.get("requeueAt"), 0.0) or None,
        )
        if requeue
        else None,
        queued_at=timestamp(status.get("queuedAt"), created) if status.get("queuedAt") else None,
    )


def admission_from_status(raw: Mapping[str, Any]) -> Admission:
    return Admission(
        cluster_queue=str(raw["clusterQueue"]),
        cluster=str(raw["cluster"]),
        pod_set_assignments=tuple(
            PodSetAssignment(
                name=str(p["name"]),
                count=int(p["count"]),
                flavors=dict(p.get("flavors") or {}),
                resource_usage=quantities(p.get("resourceUsage")),
                placement=tuple(
                    (str(n["node"]), int(n["count"])) for n in p.get("placement") or ()
                ),
                islands=tuple(p.get("islands") or ()),
            )
            for p in raw.get("podSetAssignments") or ()
        ),
    )


@dataclass(frozen=True)
class Units:
    """A serving workload's units as the engine sees them (docs/serving.md)."""

    admitted: tuple[AdmittedWorkload, ...]
    #: The indexes below ``spec.replicas`` with no admission, in index order:
    #: each its own gang, queued at its workload's queue time.
    pending: tuple[Workload, ...]


#: Workload states whose missing units wait for admission.
_WAITING = frozenset({"Pending", "Admitted", "Running"})
#: Workload states whose units hold quota and capacity (lifecycle.HOLDS_QUOTA).
_HOLDING = frozenset({"Admitted", "Running", "Cancelling"})


def units_of(row: WorkloadRow, workload: Workload) -> Units:
    """The admitted units (``status.replicaAdmissions``) and the missing ones
    of serving workload ``row``, whose domain value (the workload as one
    replica) is ``workload``."""
    state = row.status.get("state", "Pending")
    admitted: list[AdmittedWorkload] = []
    taken: set[int] = set()
    if state in _HOLDING:
        for entry in row.status.get("replicaAdmissions") or ():
            replica = int(entry["replica"])
            raw = entry["admission"]
            taken.add(replica)
            admitted.append(
                AdmittedWorkload(
                    workload=dataclasses.replace(workload, replica=replica),
                    admission=admission_from_status(raw),
                    admitted_at=timestamp(
                        entry.get("admittedAt") or raw.get("admittedAt"), workload.creation_time
                    ),
                    pods_ready=entry.get("podsReady"),
                )
            )
    pending: tuple[Workload, ...] = ()
    if state in _WAITING:
        replicas = int(row.spec.get("replicas") or 1)
        pending = tuple(
            dataclasses.replace(workload, replica=i) for i in range(replicas) if i not in taken
        )
    return Units(tuple(admitted), pending)


def admission_to_status(decision: AdmissionDecision, admitted_at: datetime) -> Obj:
    admission = decision.admission
    islands = {i for p in admission.pod_set_assignments for i in p.islands}
    borrowed: dict[str, dict[str, str]] = {}
    for (flavor, resource), amount in sorted(decision.borrowed.items()):
        borrowed.setdefault(flavor, {})[resource] = format_amount(resource, amount)
    return {
        "clusterQueue": admission.cluster_queue,
        "cluster": admission.cluster,
        "island": next(iter(islands)) if len(islands) == 1 else None,
        "podSetAssignments": [
            {
                "name": p.name,
                "count": p.count,
                "flavors": dict(p.flavors),
                "resourceUsage": {r: format_amount(r, a) for r, a in p.resource_usage.items()},
                "placement": [{"node": node, "count": pods} for node, pods in p.placement],
                "islands": list(p.islands),
            }
            for p in admission.pod_set_assignments
        ],
        "borrowed": borrowed,
        "preempted": list(decision.preempted),
        "admittedAt": rfc3339(admitted_at),
    }


def _node(cluster: str, raw: Mapping[str, Any]) -> Node:
    return Node(
        name=str(raw["name"]),
        cluster=cluster,
        flavor=str(raw["flavor"]),
        island=str(raw.get("island") or f"{cluster}-{raw['flavor']}"),
        allocatable=quantities(raw.get("allocatable")),
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
        taints=tuple(taint_from_manifest(t) for t in raw.get("taints") or ()),
        reserved=quantities(raw.get("reserved")),
        ready=bool(raw.get("ready", True)),
        unschedulable=bool(raw.get("unschedulable", False)),
    )


def _manifest(row: Any) -> Obj:
    labels = dict(row.labels or {})
    if row.kind == "ClusterQueue":
        labels[WORKLOAD_CLASS_LABEL] = row.spec.get("workloadClass", "training")
    return {
        "metadata": {"name": row.name, "namespace": row.namespace or None, "labels": labels},
        "spec": row.spec,
    }


def _cluster(row: Any) -> tuple[Cluster, list[Node]]:
    status = row.status or {}
    cluster = Cluster(
        name=row.name,
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        healthy=status.get("state", "Ready") != "Lost",
        cordoned=bool(row.spec.get("cordoned", False)),
    )
    return cluster, [_node(row.name, n) for n in (status.get("inventory") or {}).get("nodes") or ()]


#: Each configuration kind's domain value, from its read-model row (a
#: Cluster's: the Cluster and its nodes).
CONFIG_VALUES: dict[str, Callable[[Any], Any]] = {
    "ClusterQueue": lambda r: cluster_queue_from_manifest(_manifest(r)),
    "ResourceFlavor": lambda r: resource_flavor_from_manifest(_manifest(r)),
    "Cohort": lambda r: cohort_from_manifest(_manifest(r)),
    "LocalQueue": lambda r: local_queue_from_manifest(_manifest(r)),
    "WorkloadPriorityClass": lambda r: priority_class_from_manifest({"name": r.name, **r.spec}),
    "Topology": lambda r: topology_from_manifest(_manifest(r)),
    "Cluster": _cluster,
}
