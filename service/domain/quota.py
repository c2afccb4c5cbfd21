"""The quota model, in Kueue's nouns (``kueue.x-k8s.io/v1beta2``).

Every amount is an ``int`` in the resource's canonical unit (see
:mod:`service.domain.quantity`). Objects are immutable values; the engine builds
its own mutable working state from them each cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DEFAULT_WORKLOAD_CLASS",
    "WORKLOAD_CLASSES",
    "BorrowWithinCohort",
    "ClusterQueue",
    "Cohort",
    "FlavorFungibility",
    "FlavorQuotas",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LocalQueue",
    "PreemptionBudget",
    "PreemptionPolicy",
    "PreemptionProtection",
    "ResourceFlavor",
    "ResourceGroup",
    "ResourceQuota",
    "Taint",
    "Toleration",
    "Topology",
    "WorkloadPriorityClass",
]

WithinClusterQueue = Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"]
ReclaimWithinCohort = Literal["Never", "LowerPriority", "Any"]
BorrowPolicy = Literal["Never", "LowerPriority"]
ReclaimNominal = Literal["Immediate", "Protected"]
FungibilityAction = Literal["MayStopSearch", "TryNextFlavor"]
FungibilityPreference = Literal["BorrowingOverPreemption", "PreemptionOverBorrowing"]
QueueingStrategy = Literal["StrictFIFO", "BestEffortFIFO"]
StopPolicy = Literal["None", "Hold", "HoldAndDrain"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
WorkloadClass = Literal["training", "inference"]

WORKLOAD_CLASSES: tuple[WorkloadClass, ...] = ("training", "inference")
#: A ClusterQueue or workload that names no class is a training one.
DEFAULT_WORKLOAD_CLASS: WorkloadClass = "training"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration; ``operator`` is ``Equal`` or ``Exists``, empty key with Exists = all."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Topology:
    """Ordered node-label levels, widest first; ``levels[0]`` is the fabric island."""

    name: str
    levels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ResourceFlavor:
    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    topology_name: str | None = None


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """Quota of one resource in one flavor; ``None`` limits mean unlimited."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    name: str
    resources: Mapping[str, ResourceQuota]


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    """Resources that are assigned a flavor together, flavors in preference order."""

    covered_resources: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True, slots=True)
class BorrowWithinCohort:
    policy: BorrowPolicy = "Never"
    max_priority_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class PreemptionProtection:
    """``preemption.protection``: how long this ClusterQueue's gangs run before they
    may be preempted for borrowing reclaim beyond nominal, fair sharing or
    consolidation (issue 24; see ``service.engine.protection``). ``reclaimNominal:
    Protected`` makes a lender's reclaim of its nominal quota wait too.
    ``islandGangGraceSeconds``: a gang of this ClusterQueue that must run whole
    in one island is no victim of a smaller preemptor of another ClusterQueue,
    of no higher priority, until that preemptor has been queued this long
    (``service.engine.preemption._protected_gang``); ``None``: no such grace."""

    min_runtime_seconds: int = 0
    reclaim_nominal: ReclaimNominal = "Immediate"
    island_gang_grace_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class PreemptionBudget:
    """``preemption.budget``: a token bucket of ``preemptions`` tokens refilled at
    ``preemptions`` per ``period_seconds``; each protected preemption of one of
    this ClusterQueue's gangs takes a token."""

    preemptions: int
    period_seconds: int


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    within_cluster_queue: WithinClusterQueue = "Never"
    reclaim_within_cohort: ReclaimWithinCohort = "Never"
    borrow_within_cohort: BorrowWithinCohort = field(default_factory=BorrowWithinCohort)
    protection: PreemptionProtection = field(default_factory=PreemptionProtection)
    budget: PreemptionBudget | None = None


@dataclass(frozen=True, slots=True)
class FlavorFungibility:
    """How far the flavor search goes (v1beta2 enums and defaults).

    ``preference`` unset keeps Kueue's legacy order: a flavor that fits without
    borrowing beats one that needs preemption, which beats one that needs both.
    """

    when_can_borrow: FungibilityAction = "MayStopSearch"
    when_can_preempt: FungibilityAction = "TryNextFlavor"
    preference: FungibilityPreference | None = None


@dataclass(frozen=True, slots=True)
class LabelSelectorRequirement:
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector; the empty selector matches everything."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            requirement.matches(labels) for requirement in self.match_expressions
        )


@dataclass(frozen=True, slots=True)
class Cohort:
    name: str
    parent_name: str | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()
    #: ``fairSharing.weight`` in thousandths (the default weight 1 is 1000).
    fair_weight_milli: int = 1000


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...] = ()
    cohort_name: str | None = None
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    flavor_fungibility: FlavorFungibility = field(default_factory=FlavorFungibility)
    queueing_strategy: QueueingStrategy = "BestEffortFIFO"
    #: ``None`` is Kueue's nil selector: no namespace is eligible. The empty
    #: selector (the default here, ``{}`` in a manifest) admits every namespace.
    namespace_selector: LabelSelector | None = field(default_factory=LabelSelector)
    stop_policy: StopPolicy = "None"
    fair_weight_milli: int = 1000
    #: Quartermaster's class isolation, from label ``quartermaster.dev/workload-class``.
    workload_class: WorkloadClass = DEFAULT_WORKLOAD_CLASS
    #: ``admissionScope.admissionMode`` (admission fair sharing), on unless set to No….
    admission_fair_sharing: bool = True
    #: Label ``quartermaster.dev/mixed-islands: "true"``: its workloads may share
    #: islands with the other class (docs/serving.md); otherwise an island holds
    #: one class at a time.
    mixed_islands: bool = False

    def flavor_names(self) -> tuple[str, ...]:
        return tuple(f.name for group in self.resource_groups for f in group.flavors)


@dataclass(frozen=True, slots=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    stop_policy: StopPolicy = "None"
    fair_weight_milli: int = 1000

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class WorkloadPriorityClass:
    name: str
    value: int
    description: str = ""
