"""Fast paths for one-pod-set gangs in one resource group (a ``FlavorPlan``).

A plan is built once per gang shape and ClusterQueue; its flavors' quota
modes are memoised while usage of the flavor in the quota tree is unchanged,
so the cross-ClusterQueue order and most admissions skip the general search.
"""

from __future__ import annotations

from service.engine.flavorassigner.fits import can_preempt_at_all, flavor_mode
from service.engine.flavorassigner.matching import known_mismatch
from service.engine.flavorassigner.modes import (
    FIT,
    FITS_NOMINAL,
    NO_FIT,
    PREEMPT,
    is_preferred,
    should_try_next,
)
from service.engine.packing import GangPlacement, pristine_fits
from service.engine.quota import FlavorResource, QuotaNode
from service.engine.state import CQState, CycleState
from service.engine.workload_info import (
    FlavorPlan,
    PlanEntry,
    PodSetInfo,
    WorkloadInfo,
)

__all__ = ["admit_simply", "flavor_plan", "quota_mode_only"]


def flavor_plan(state: CycleState, wi: WorkloadInfo, cq: CQState) -> FlavorPlan:
    """The gang shape's :class:`FlavorPlan` for ``cq``, built once per cycle."""
    shape = wi.shape
    plan = shape.plans.get(cq.name)
    if plan is None:
        plan = shape.plans[cq.name] = _build_plan(state, wi, cq)
    return plan


def _build_plan(state: CycleState, wi: WorkloadInfo, cq: CQState) -> FlavorPlan:
    if len(wi.pod_sets) != 1:
        return FlavorPlan(general=True)
    ps = wi.pod_sets[0]
    group: int | None = None
    for resource in ps.totals:
        found = cq.group_of.get(resource)
        if found is None:
            return FlavorPlan(uncovered=True)
        if group is None:
            group = found
        elif group != found:
            return FlavorPlan(general=True)
    if group is None:
        return FlavorPlan(general=True)
    totals = ps.totals
    # Lists, not generators: a plan is built for every gang shape in every ClusterQueue.
    return FlavorPlan(
        flavors=tuple(
            [
                PlanEntry(name, tuple([(fr, totals[fr[1]], root) for fr, root in frs]), version)
                for name, frs, version in _plan_skeleton(state, cq, group, ps)
            ]
        )
    )


#: A flavor a pod set may use: its name, each flavor-resource with its flat root
#: (``QuotaNode.flat_root``), and its ``CycleState.flavor_version`` counter.
_SkeletonEntry = tuple[str, tuple[tuple[FlavorResource, QuotaNode | None], ...], list[int]]


def _plan_skeleton(
    state: CycleState, cq: CQState, group: int, ps: PodSetInfo
) -> tuple[_SkeletonEntry, ...]:
    """What a plan holds but the amounts: shared by gang shapes with the same constraints."""
    key = (cq.name, group, ps.tolerations, ps.selector_items, ps.mode, ps.level, tuple(ps.totals))
    skeleton = state.plan_skeletons.get(key)
    if skeleton is None:
        node = cq.node
        skeleton = tuple(
            (
                name,
                tuple(((name, r), node.flat_root((name, r))) for r in ps.totals),
                state.flavor_counter(cq.root, name),
            )
            for name in cq.groups[group][1]
            if known_mismatch(state, name, ps) is None
        )
        state.plan_skeletons[key] = skeleton
    return skeleton


def _known_flavor_mode(cq: CQState, entry: PlanEntry) -> tuple[int, int]:
    """``flavor_mode``, memoised while usage of that flavor in the quota tree is unchanged.

    Once a flavor is used up in a quota tree, every later head that tries it
    finds the same answer: most checks late in a big cycle are such repeats.
    """
    version = entry.version[0]
    if entry.checked_at != version:
        entry.checked_at, entry.mode = version, flavor_mode(cq, entry.frs)
    return entry.mode


def quota_mode_only(state: CycleState, wi: WorkloadInfo) -> tuple[int, int] | None:
    """``(mode, borrow)`` of ``assign_flavors(physical=False)`` for one pod set and group.

    The cross-ClusterQueue order needs only this, for every head, so it skips
    building the assignment and its messages. ``None``: use ``assign_flavors``.
    The answer is the plan's (the gang shape's in this ClusterQueue), kept
    while usage in the quota tree is unchanged.
    """
    cq = wi.cq
    assert cq is not None
    plan = wi.shape.plans.get(cq.name) or flavor_plan(state, wi, cq)
    if plan.general:
        return None
    if plan.uncovered:
        return NO_FIT, 0
    stamp = state.usage_version.get(cq.root, 0)
    if plan.stamp != stamp:
        plan.stamp, plan.mode = stamp, _plan_mode(cq, plan)
    return plan.mode


def _plan_mode(cq: CQState, plan: FlavorPlan) -> tuple[int, int]:
    fungibility = cq.spec.flavor_fungibility
    best: tuple[int, int] = (NO_FIT, 1 << 30)
    for entry in plan.flavors:
        # ``_known_flavor_mode``, its common case inlined: this runs for nearly every head.
        mode = entry.mode if entry.checked_at == entry.version[0] else _known_flavor_mode(cq, entry)
        if mode == FITS_NOMINAL or not should_try_next(mode, fungibility):
            return mode
        if is_preferred(mode, best, fungibility):
            best = mode
    return best if best[0] != NO_FIT else (NO_FIT, 0)


def admit_simply(
    state: CycleState, wi: WorkloadInfo
) -> tuple[dict[FlavorResource, int], list[dict[str, str]], GangPlacement] | None:
    """``assign_flavors``' usage, flavors and placement when it admits without preemption.

    For a one-pod-set gang in one resource group (a :class:`FlavorPlan`), the
    flavor search stops at the first flavor with quota and room, unless it
    borrows and ``whenCanBorrow`` says try the next. Flavors on the way that
    fail are skipped as the general search skips them, as long as nobody in
    the quota tree could be preempted (then a flavor that needs preemption
    has no candidates). ``None``: anything else happened — run the general
    search, which also explains failures.
    """
    cq = wi.cq
    assert cq is not None
    plan = wi.shape.plans.get(cq.name) or flavor_plan(state, wi, cq)
    if plan.general or plan.uncovered:
        return None
    fungibility = cq.spec.flavor_fungibility
    nobody_to_preempt = not can_preempt_at_all(cq) or not state.preemptible_in_tree.get(cq.root)
    ps = wi.pod_sets[0]
    for entry in plan.flavors:
        name, frs = entry.name, entry.frs
        mode = _known_flavor_mode(cq, entry)
        if mode[0] == FIT:
            placement = state.place_simply(wi, name)
            if placement is not None:
                if mode[1] > 0 and fungibility.when_can_borrow == "TryNextFlavor":
                    return None
                return (
                    {fr: value for fr, value, _ in frs},
                    [dict.fromkeys(ps.totals, name)],
                    placement,
                )
            request = state.pod_set_request(wi, 0, dict.fromkeys(ps.totals, name))
            if pristine_fits(state.inventory, [request], state.pristine_cache):
                mode = (PREEMPT, mode[1])
        if mode[0] == PREEMPT and not nobody_to_preempt:
            return None
    return None
