"""One workload's admission attempt: flavors, placement, and victims if need be.

The one-pod-set fast path first (``admit_simply``); otherwise the general flavor
assignment, with the preemption search as its oracle.

Reference: kueue ``pkg/scheduler/scheduler.go`` (``nominate``, ``admit``).
"""

from __future__ import annotations

import math

from service.engine.decisions import Decisions
from service.engine.flavorassigner import (
    FIT,
    PREEMPT,
    RECLAIM,
    Assignment,
    admit_simply,
    assign_flavors,
)
from service.engine.preemption import find_preemption_plan
from service.engine.state import CycleState
from service.engine.workload_info import AdmittedInfo, WorkloadInfo

__all__ = ["try_admit"]


def try_admit(state: CycleState, wi: WorkloadInfo, decisions: Decisions) -> Assignment | None:
    """Admit ``wi`` if it fits now or once a preemption plan's victims are evicted.

    ``None``: admitted (its victims evicted first); otherwise the flavor
    assignment that says why it does not fit.
    """
    assert wi.cq is not None
    state.floored = frozenset()
    state.graced = {}
    simple = admit_simply(state, wi)
    if simple is not None:
        decisions.admit(wi, *simple, [])
        return None
    assignment = assign_flavors(
        state, wi, physical=True, oracle=lambda w, a: find_preemption_plan(state, w, a)
    )
    if assignment.mode == FIT and assignment.placement is not None:
        decisions.admit(wi, assignment.usage, assignment.pod_set_flavors, assignment.placement, [])
        return None
    if assignment.mode in (PREEMPT, RECLAIM):
        plan = assignment.plan or find_preemption_plan(state, wi, assignment)
        if plan is not None:
            victims = []
            for victim, reason in plan.victims:
                assert isinstance(victim, AdmittedInfo)
                victims.append((victim, reason))
            decisions.admit(
                wi, assignment.usage, assignment.pod_set_flavors, plan.placement, victims
            )
            return None
    if state.floored:
        queues = ", ".join(sorted(state.floored))
        assignment.messages.append(
            f"preemption stops at the minReplicas of serving workloads in {queues}"
        )
    if state.graced:
        queues = ", ".join(sorted(state.graced))
        left = math.ceil(min(state.graced.values()))
        assignment.messages.append(
            f"preemption waits for the islandGangGraceSeconds of island gangs in {queues}: "
            f"the first lapses in {left} s"
        )
    return assignment
