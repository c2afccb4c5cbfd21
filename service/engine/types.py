"""Inputs and outputs of one admission cycle: :class:`Snapshot` in, :class:`CycleResult` out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from service.domain.inventory import Cluster, Node
from service.domain.quantity import format_amount
from service.domain.quota import (
    ClusterQueue,
    Cohort,
    LocalQueue,
    ResourceFlavor,
    Topology,
    WorkloadPriorityClass,
)
from service.domain.workload import Admission, AdmittedWorkload, RequeueState, Workload

__all__ = [
    "DEFAULT_ACCELERATORS",
    "AdmissionDecision",
    "AdmissionFairSharingConfig",
    "ConsolidationConfig",
    "CycleResult",
    "EngineConfig",
    "Eviction",
    "EvictionReason",
    "FairSharingConfig",
    "Fragmentation",
    "LocalQueueUsage",
    "PendingReason",
    "Preemption",
    "PreemptionBudgetState",
    "PreemptionReason",
    "ReservationConfig",
    "Snapshot",
    "SpreadPacking",
    "WaitForPodsReadyConfig",
]

FairSharingStrategy = Literal["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
#: Where a pod set that may spread goes (see :attr:`EngineConfig.spread_packing`).
SpreadPacking = Literal["IslandFirst", "ClusterFirst"]

#: Resources whose free amount indexes node capacity (see :mod:`service.engine.placement`).
DEFAULT_ACCELERATORS: tuple[str, ...] = (
    "nvidia.com/gpu",
    "amd.com/gpu",
    "google.com/tpu",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron",
)


@dataclass(frozen=True, slots=True)
class FairSharingConfig:
    """Kueue's ``fairSharing`` configuration: DRS ordering and fair-sharing preemption."""

    enable: bool = False
    preemption_strategies: tuple[FairSharingStrategy, ...] = (
        "LessThanOrEqualToFinalShare",
        "LessThanInitialShare",
    )
    #: Kueue's ``FairSharingPrioritizeNonBorrowing`` (beta, on by default
    #: since v0.17; kueue#9406): at every level of the tournament, a nominee
    #: whose subtree would not borrow on the flavors it asks for goes before
    #: one whose subtree would, whatever their shares; then the DRS decides.
    #: Without it, borrowing on one flavor pushes a ClusterQueue's work that
    #: fits its own nominal quota of another flavor behind others' borrowing.
    prioritize_non_borrowing: bool = True


@dataclass(frozen=True, slots=True)
class AdmissionFairSharingConfig:
    """Ordering by decayed historical usage of each LocalQueue (Kueue KEP-4136).

    On by default with a one-week half-life: with a zero half-life the history
    is forgotten at once and the ordering degenerates (kueue#11134).
    ``resource_weights`` empty means every resource weighs 1, with cpu counted
    in cores and memory in GiB so that bytes do not drown accelerators.
    """

    enable: bool = True
    usage_half_life_seconds: float = 7 * 24 * 3600.0
    usage_sampling_interval_seconds: float = 300.0
    resource_weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WaitForPodsReadyConfig:
    """Readiness timeout: evict and requeue with backoff ``base * 2**(n-1)``, capped.

    After ``backoff_limit_count`` requeues the workload is deactivated.
    """

    enable: bool = False
    timeout_seconds: float = 300.0
    backoff_base_seconds: float = 60.0
    backoff_max_seconds: float = 3600.0
    backoff_limit_count: int | None = None


@dataclass(frozen=True, slots=True)
class ConsolidationConfig:
    """Consolidation (``service.engine.consolidation``): a gang blocked only by
    fragmentation may preempt lower-priority gangs inside one island.

    Off by default. ``victim_placement``: ``Immediate`` issues a move only when
    every victim fits again elsewhere at once (quota and room, one restart, no
    wait); ``Any`` does not ask."""

    enable: bool = False
    victim_placement: Literal["Immediate", "Any"] = "Immediate"


@dataclass(frozen=True, slots=True)
class ReservationConfig:
    """Head-of-line reservation (``service.engine.reservation``): the island
    closest to fitting the gang that has waited longest takes no backfill.

    Off by default. Only gangs whose every pod set must land in one island,
    asking for at least ``min_accelerators`` (``accelerator_resources``, all
    pod sets) and queued at least ``min_wait_seconds`` ago, are candidates."""

    enable: bool = False
    min_accelerators: int = 1
    min_wait_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    fair_sharing: FairSharingConfig = field(default_factory=FairSharingConfig)
    admission_fair_sharing: AdmissionFairSharingConfig = field(
        default_factory=AdmissionFairSharingConfig
    )
    wait_for_pods_ready: WaitForPodsReadyConfig = field(default_factory=WaitForPodsReadyConfig)
    #: ``None``: admit everything that fits in one cycle. ``1`` reproduces Kueue's
    #: one-head-per-ClusterQueue-per-cycle ceiling (kueue#14477), for baselines.
    max_heads_per_cluster_queue: int | None = None
    accelerator_resources: tuple[str, ...] = DEFAULT_ACCELERATORS
    #: A pod set without a required topology: ``IslandFirst`` puts it whole in
    #: the island (of any cluster) that holds it with the least free
    #: accelerators, on its least-free nodes, and spreads it over the least-free
    #: cluster only when no island holds it, so whole islands stay free for
    #: gangs (issue 24). ``ClusterFirst`` is the placement before: the
    #: least-free nodes anywhere in the least-free cluster; kept to compare.
    spread_packing: SpreadPacking = "IslandFirst"
    consolidation: ConsolidationConfig = field(default_factory=ConsolidationConfig)
    reservation: ReservationConfig = field(default_factory=ReservationConfig)
    #: Preemption victims: after Kueue's rules (ClusterQueue, priority), a gang
    #: that must restart whole in one island and is bigger than the preemptor
    #: goes after every other candidate (``service.engine.preemption``). Off
    #: by default.
    spare_island_gangs: bool = False
    #: An inference pod set goes first to the islands already holding inference
    #: pods (tightest first), then to the others by best fit, so that one-GPU
    #: serving replicas do not scatter over islands a training gang needs whole
    #: (issue 22; kueue PR #10406). ``False``: best fit alone, to compare.
    serving_islands_first: bool = True


@dataclass(frozen=True, slots=True)
class LocalQueueUsage:
    """Decayed historical usage of one LocalQueue, per resource (canonical units)."""

    consumed: Mapping[str, float]
    last_update: float


@dataclass(frozen=True, slots=True)
class PreemptionBudgetState:
    """One ClusterQueue's preemption token bucket (``service.engine.protection``)."""

    tokens: float
    last_update: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the engine needs for one cycle; the engine never mutates it.

    ``admitted`` holds every workload that holds quota (admitted, not yet
    finished or evicted), with its placement; capacity they use is derived from
    their ``placement``, so ``Node.reserved`` must only hold what Quartermaster
    does not manage. ``namespaces`` maps namespace → labels for
    ``namespaceSelector``. ``local_queue_usage`` is the persisted admission
    fair-sharing history (see :attr:`CycleResult.local_queue_usage`).
    """

    cluster_queues: Sequence[ClusterQueue]
    resource_flavors: Sequence[ResourceFlavor] = ()
    cohorts: Sequence[Cohort] = ()
    local_queues: Sequence[LocalQueue] = ()
    priority_classes: Sequence[WorkloadPriorityClass] = ()
    topologies: Sequence[Topology] = ()
    clusters: Sequence[Cluster] = ()
    nodes: Sequence[Node] = ()
    admitted: Sequence[AdmittedWorkload] = ()
    pending: Sequence[Workload] = ()
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    local_queue_usage: Mapping[str, LocalQueueUsage] = field(default_factory=dict)
    config: EngineConfig = field(default_factory=EngineConfig)
    #: Per ClusterQueue with a ``preemption.budget``: its bucket as the last cycle
    #: left it (absent: full). See :attr:`CycleResult.preemption_budgets`.
    preemption_budgets: Mapping[str, PreemptionBudgetState] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """A workload admitted this cycle: where, and what it displaced.

    ``borrowed`` is, per ``(flavor, resource)``, how much of the ClusterQueue's
    usage is above its nominal quota once this workload is in. ``preempted``
    lists the victims (keys) that must be evicted whole before its pods start.
    """

    workload: str
    cluster_queue: str
    admission: Admission
    borrowed: Mapping[tuple[str, str], int] = field(default_factory=dict)
    preempted: tuple[str, ...] = ()


PreemptionReason = Literal[
    "InClusterQueue",
    "InCohortReclamation",
    "InCohortFairSharing",
    "InCohortReclaimWhileBorrowing",
    "Consolidation",
]


@dataclass(frozen=True, slots=True)
class Preemption:
    """A whole gang evicted to make room for ``preemptor``."""

    workload: str
    cluster_queue: str
    cluster: str
    preemptor: str
    preemptor_cluster_queue: str
    reason: PreemptionReason
    message: str
    #: ``/root/…/cluster-queue`` of the preemptor and of the victim.
    preemptor_path: str
    victim_path: str
    # Out of ``repr`` (as below): bench/digest.py hashes reprs, and with
    # protection and consolidation off these add nothing to a decision.
    #: Accelerator-seconds since the victim's last checkpoint (or admission).
    work_destroyed: float = field(default=0.0, repr=False)
    #: The preemption took a token of the victim's ClusterQueue's budget.
    budgeted: bool = field(default=False, repr=False)


EvictionReason = Literal["ClusterQueueStopped", "LocalQueueStopped", "PodsReadyTimeout"]


@dataclass(frozen=True, slots=True)
class Eviction:
    """A whole gang evicted for a reason other than preemption.

    For ``PodsReadyTimeout`` the new ``requeue_state`` (backoff) is given and
    ``deactivated`` says the requeue limit was exceeded.
    """

    workload: str
    cluster_queue: str
    cluster: str
    reason: EvictionReason
    message: str
    requeue_state: RequeueState | None = None
    deactivated: bool = False


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """The numbers of a fragmented wait: what the pod set needs, what the
    eligible islands hold free together, and the largest free island."""

    flavor: str
    resource: str
    requested: int
    fleet_free: int
    largest_free: int
    #: ``cluster/island`` of the largest free island (ties: the first in fleet order).
    largest_island: str

    def message(self) -> str:
        """The why-not words, with the numbers."""
        amount = format_amount
        r = self.resource
        return (
            f"fragmented across islands: {amount(r, self.fleet_free)} {r} of flavor "
            f"{self.flavor} are free in the fleet, {amount(r, self.requested)} needed in "
            f"one island, but the largest free island ({self.largest_island}) has "
            f"{amount(r, self.largest_free)}"
        )


@dataclass(frozen=True, slots=True)
class PendingReason:
    """Why a workload still waits, like Kueue's ``QuotaReserved=False`` condition.

    ``position_in_cluster_queue`` / ``position_in_local_queue`` are 0-based
    positions in queue order after this cycle (``None`` when the workload is
    not queued at all, e.g. its LocalQueue does not exist). An inadmissible
    gang's ``reason`` and ``message`` are its verdict's: the true cause, never
    "N more needed".
    """

    workload: str
    reason: str
    message: str
    cluster_queue: str | None = None
    local_queue: str | None = None
    position_in_cluster_queue: int | None = None
    position_in_local_queue: int | None = None
    #: No empty fleet could admit it (``service.engine.feasibility``): it waits for ever.
    inadmissible: bool = False
    #: Then why, e.g. ``TooBigForAnyIsland``; ``None`` for a gang that may yet fit.
    cause: str | None = None
    #: The workload (key) a StrictFIFO queue holds it behind, if any.
    waiting_behind: str | None = None
    #: Its numbers when ``cause`` is ``FragmentedAcrossIslands`` (``service.engine.fragmentation``).
    fragmentation: Fragmentation | None = None


@dataclass(frozen=True, slots=True)
class CycleResult:
    admissions: tuple[AdmissionDecision, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    #: Every pending workload that was not admitted, by key.
    pending: Mapping[str, PendingReason] = field(default_factory=dict)
    #: Admission fair-sharing history sampled at ``now``; persist and feed back.
    local_queue_usage: Mapping[str, LocalQueueUsage] = field(default_factory=dict)
    #: Preemption budgets refilled to ``now`` and charged; persist and feed back.
    preemption_budgets: Mapping[str, PreemptionBudgetState] = field(
        default_factory=dict, repr=False
    )
