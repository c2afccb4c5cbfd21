"""Workloads (gangs of pod sets) and their admissions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from service.domain.quota import (
    DEFAULT_WORKLOAD_CLASS,
    LabelSelector,
    Toleration,
    WorkloadClass,
)

__all__ = [
    "Admission",
    "AdmittedWorkload",
    "PodSet",
    "PodSetAssignment",
    "RequeueState",
    "TopologyRequest",
    "Workload",
]

TopologyMode = Literal["required", "preferred", "unconstrained"]


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """``podSets[].topologyRequest``: all pods within one domain of ``level``.

    ``level`` is a node-label key of the flavor's topology (usually the island
    level); ``None`` means the island level of whichever flavor is assigned.
    """

    mode: TopologyMode = "required"
    level: str | None = None
    #: Kueue's ``podSetGroupName``: pod sets of one gang naming the same group
    #: with a required topology land in the *same* domain (a LeaderWorkerSet
    #: group's leader and workers in one island; docs/serving.md).
    group: str | None = None


@dataclass(frozen=True, slots=True)
class PodSet:
    name: str
    count: int
    #: Requests of one pod, canonical integer units.
    requests: Mapping[str, int]
    topology_request: TopologyRequest | None = None
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)

    def total(self) -> dict[str, int]:
        return {resource: amount * self.count for resource, amount in self.requests.items()}


@dataclass(frozen=True, slots=True)
class RequeueState:
    """``status.requeueState``: evictions for readiness timeout so far, and when to retry."""

    count: int = 0
    requeue_at: float | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A gang: admitted whole, in one cluster, or not at all.

    ``priority`` is the resolved value; when ``None`` the engine resolves
    ``priority_class_name`` against the snapshot's WorkloadPriorityClasses
    (missing class → 0). Times are seconds on the injected clock.
    """

    namespace: str
    name: str
    queue_name: str
    pod_sets: tuple[PodSet, ...]
    creation_time: float = 0.0
    priority: int | None = None
    priority_class_name: str | None = None
    workload_class: WorkloadClass = DEFAULT_WORKLOAD_CLASS
    #: Member clusters the workload may run in, by cluster labels.
    cluster_selector: LabelSelector | None = None
    active: bool = True
    requeue_state: RequeueState | None = None
    #: When the workload was last queued (after an eviction); orders it in queue
    #: like Kueue's ``queueOrderingTimestamp``. ``None`` → ``creation_time``.
    queued_at: float | None = None
    #: A serving workload's replica, admitted as its own gang (a *unit*, see
    #: docs/serving.md): its index; ``None`` for a workload admitted whole.
    replica: int | None = None
    #: Of a unit: the admitted units of its workload no preemption goes below.
    min_replicas: int = 0

    @property
    def key(self) -> str:
        if self.replica is not None:
            return f"{self.namespace}/{self.name}#{self.replica}"
        return f"{self.namespace}/{self.name}"

    @property
    def replica_of(self) -> str | None:
        """The key of the serving workload a unit is a replica of."""
        return None if self.replica is None else f"{self.namespace}/{self.name}"

    @property
    def queue_key(self) -> str:
        return f"{self.namespace}/{self.queue_name}"

    @property
    def ordering_time(self) -> float:
        return self.creation_time if self.queued_at is None else self.queued_at


@dataclass(frozen=True, slots=True)
class PodSetAssignment:
    """Where one pod set goes: flavor per resource, islands, and pods per node."""

    name: str
    count: int
    flavors: Mapping[str, str]
    resource_usage: Mapping[str, int]
    #: ``(node name, pods on it)`` in a stable order.
    placement: tuple[tuple[str, int], ...] = ()
    islands: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Admission:
    cluster_queue: str
    cluster: str
    pod_set_assignments: tuple[PodSetAssignment, ...]


@dataclass(frozen=True, slots=True)
class AdmittedWorkload:
    """A workload holding quota and capacity (admitted and not yet finished or evicted)."""

    workload: Workload
    admission: Admission
    admitted_at: float = 0.0
    #: Whether all pods reported Ready (``waitForPodsReady``); ``None`` = not tracked.
    pods_ready: bool | None = None
    #: When it last saved its work (the ``quartermaster.dev/last-checkpoint``
    #: annotation of its job); ``None``: never, so a preemption loses all since admission.
    last_checkpoint: float | None = None
