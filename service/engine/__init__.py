"""Quartermaster's admission engine: pure, deterministic, no I/O.

One call decides a whole cycle for the fleet::

    result = admission_cycle(snapshot, now)

``snapshot`` (:class:`Snapshot`) holds the quota model (ResourceFlavors,
Topologies, Cohorts, ClusterQueues, LocalQueues, WorkloadPriorityClasses), the
fleet (clusters with health/cordon state and their nodes by flavor and fabric
island), the admitted workloads with their placements, the pending workloads,
namespace labels, the persisted admission fair-sharing history and the
:class:`EngineConfig`. ``now`` is the injected clock (seconds, or a timezone-
aware ``datetime``). The result (:class:`CycleResult`) lists, in decision
order, the admissions (cluster, flavor per pod set and resource, islands,
pods per node, borrowed amounts, victims), the preemptions (victim,
preemptor, reason, cohort paths), other evictions (stopped queues, readiness
timeouts with their requeue backoff) and, for every workload left waiting, a
:class:`PendingReason` with Kueue-style reason, message and queue positions.

The same snapshot and clock always give the same result. Callers apply the
result: evict every victim (whole) before starting the preemptor's pods, store
the admissions, requeue evicted workloads, and persist
``result.local_queue_usage`` and ``result.preemption_budgets`` for the next
cycle (the service derives the budgets from its ledger: see
``service.engine.protection``).

A big cycle allocates hundreds of thousands of objects that live until it
ends and form no garbage cycles; with a large snapshot alive, Python's
generational collector rescans them over and over (at 100,000 pending gangs it
costs more than half again the cycle's own time). The engine leaves the
process-wide collector alone: callers that run big cycles pause it around the
call (``gc.disable()`` / ``gc.enable()``), as the service, the replay
simulator and ``bench/engine.py`` do.
"""

from __future__ import annotations

from datetime import datetime

from service.engine.cycle import run_cycle
from service.engine.types import (
    AdmissionDecision,
    AdmissionFairSharingConfig,
    ConsolidationConfig,
    CycleResult,
    EngineConfig,
    Eviction,
    FairSharingConfig,
    Fragmentation,
    LocalQueueUsage,
    PendingReason,
    Preemption,
    PreemptionBudgetState,
    ReservationConfig,
    Snapshot,
    WaitForPodsReadyConfig,
)

__all__ = [
    "AdmissionDecision",
    "AdmissionFairSharingConfig",
    "ConsolidationConfig",
    "CycleResult",
    "EngineConfig",
    "Eviction",
    "FairSharingConfig",
    "Fragmentation",
    "LocalQueueUsage",
    "PendingReason",
    "Preemption",
    "PreemptionBudgetState",
    "ReservationConfig",
    "Snapshot",
    "WaitForPodsReadyConfig",
    "admission_cycle",
]


def admission_cycle(snapshot: Snapshot, now: datetime | float) -> CycleResult:
    """Decide admissions, preemptions and why-not reasons for one cycle.

    Pure: reads ``snapshot``, never mutates it, performs no I/O.
    """
    clock = now.timestamp() if isinstance(now, datetime) else float(now)
    return run_cycle(snapshot, clock)
