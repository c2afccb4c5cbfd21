"""One admission cycle: evictions, queueing checks, ordering, admission, why-not.

The cycle differs from Kueue's in one deliberate way: there is no
one-head-per-ClusterQueue ceiling (kueue#14477). A ClusterQueue whose head is
admitted immediately nominates its next workload, and the cycle goes on until
no head is left, so one cycle admits everything that fits, in order.

Most gangs that cannot fit are rejected without a flavor search: per
ClusterQueue the cycle remembers which gangs failed (shape, priority, time,
size); a later gang of the same shape that is at least as big, no higher in
priority and no older cannot fit either, because within a cycle free quota and
capacity only shrink — until something is evicted, which resets the memory.
When nothing in the ClusterQueue's quota tree could be preempted at all (only
workloads admitted before the cycle can), priority and age do not matter.

The steps, each a module: ``eviction`` (stopped queues, PodsReady timeouts),
``queueing`` (which workloads may queue, and where), ``admission_loop`` (heads
in order, each tried by ``attempt``, decisions recorded by ``decisions``) and
``result`` (the decisions, and why each workload left waiting waits);
``reservation`` (off by default) holds one island for the gang that has
waited longest while the loop runs.
"""

from __future__ import annotations

from service.engine.admission_loop import AdmissionLoop
from service.engine.consolidation import consolidate
from service.engine.decisions import Decisions
from service.engine.eviction import evict_stopped_and_unready
from service.engine.queueing import Queueing
from service.engine.reservation import reserve
from service.engine.result import build_result
from service.engine.state import CycleState
from service.engine.types import CycleResult, Snapshot

__all__ = ["run_cycle"]


def run_cycle(snapshot: Snapshot, now: float) -> CycleResult:
    """Decide one admission cycle over ``snapshot`` at ``now`` (seconds)."""
    state = CycleState(snapshot, now)
    decisions = Decisions(state)
    evict_stopped_and_unready(state, decisions)
    queueing = Queueing(state)
    queueing.classify(list(snapshot.pending))
    reservation = reserve(state, queueing.queues)
    AdmissionLoop(state, queueing.queues, decisions, reservation).run()
    consolidate(state, queueing.queues, decisions, reservation)
    if reservation is not None:
        # Why-not reasons and their numbers see the fleet as it is.
        reservation.release()
    return build_result(state, queueing, decisions)
