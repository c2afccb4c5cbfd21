"""Flavor assignment of a whole gang: every pod set and resource group, and placement.

Reference: kueue ``pkg/scheduler/flavorassigner/flavorassigner.go``
(``AssignFlavors``).
"""

from __future__ import annotations

from service.engine.flavorassigner.assignment import Assignment, Oracle
from service.engine.flavorassigner.fits import can_preempt_at_all
from service.engine.flavorassigner.modes import (
    FIT,
    NO_CANDIDATES,
    NO_FIT,
    NO_MATCHING_FLAVOR,
    PREEMPT,
    SEVERITY,
    WAITING_FOR_CAPACITY,
    worse,
)
from service.engine.flavorassigner.search import GroupSearch
from service.engine.packing import place_gang
from service.engine.state import CQState, CycleState
from service.engine.workload_info import (
    PodSetInfo,
    WorkloadInfo,
)

__all__ = ["assign_flavors"]


def _resource_groups(cq: CQState, ps: PodSetInfo, result: Assignment) -> list[int] | None:
    """The ClusterQueue's resource groups the pod set needs, or ``None`` (and why)."""
    groups: list[int] = []
    for resource in ps.totals:
        group = cq.group_of.get(resource)
        if group is None:
            result.mode = NO_FIT
            result.reason = NO_MATCHING_FLAVOR
            result.messages.append(
                f"couldn't assign flavors to pod set {ps.name}: resource {resource} "
                "unavailable in ClusterQueue"
            )
            return None
        if group not in groups:
            groups.append(group)
    return sorted(groups)


def assign_flavors(
    state: CycleState,
    wi: WorkloadInfo,
    physical: bool = True,
    oracle: Oracle | None = None,
) -> Assignment:
    """Choose a flavor per pod set and resource; with ``physical``, also a placement."""
    cq = wi.cq
    assert cq is not None
    result = Assignment()
    overall = (FIT, 0)
    single = len(wi.pod_sets) == 1
    for index, ps in enumerate(wi.pod_sets):
        groups = _resource_groups(cq, ps, result)
        if groups is None:
            return result
        chosen: dict[str, str] = {}
        for position, group in enumerate(groups):
            covered, flavor_names = cq.groups[group]
            search = GroupSearch(
                state=state,
                wi=wi,
                cq=cq,
                index=index,
                resources=[r for r in ps.totals if r in covered],
                chosen=chosen,
                result=result,
                place=physical and position == len(groups) - 1,
                oracle=oracle,
            )
            flavor, best = search.choose(flavor_names)
            notes = search.notes
            if flavor is None or best.mode[0] == NO_FIT:
                result.mode = NO_FIT
                result.reason = notes.worst or NO_MATCHING_FLAVOR
                result.messages.append((f"couldn't assign flavors to pod set {ps.name}", notes))
                return result
            for resource in search.resources:
                chosen[resource] = flavor
                fr = (flavor, resource)
                result.usage[fr] = result.usage.get(fr, 0) + ps.totals[resource]
            overall = worse(overall, best.mode)
            if best.mode[0] != FIT:
                result.frs_need_preemption |= best.need
                result.fragmentation = result.fragmentation or best.fragmentation
                result.messages.append((f"couldn't assign flavors to pod set {ps.name}", notes))
                if not result.reason or SEVERITY[notes.worst] > SEVERITY[result.reason]:
                    result.reason = notes.worst
            if best.placement is not None and single:
                result.placement = best.placement
            if best.plan is not None:
                result.plan = best.plan
        result.pod_set_flavors.append(chosen)
    result.mode, result.borrow = overall
    if result.mode == FIT and physical and not single:
        _place_whole_gang(state, wi, cq, result)
    return result


def _place_whole_gang(state: CycleState, wi: WorkloadInfo, cq: CQState, result: Assignment) -> None:
    """Several pod sets: all of them in one cluster, or the gang waits for capacity."""
    result.placement = place_gang(
        state.inventory,
        [state.pod_set_request(wi, i, f) for i, f in enumerate(result.pod_set_flavors)],
    )
    if result.placement is not None:
        return
    result.mode = PREEMPT if can_preempt_at_all(cq) else NO_CANDIDATES
    result.reason = WAITING_FOR_CAPACITY
    result.messages.append("no single cluster has room now for every pod set of the gang")
    for index, flavors in enumerate(result.pod_set_flavors):
        result.frs_need_preemption |= {
            (f, r) for r, f in flavors.items() if r in wi.pod_sets[index].totals
        }
