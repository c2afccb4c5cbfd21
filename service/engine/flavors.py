"""Flavor assignment with ``flavorFungibility``, checking quota and physical room.

For each pod set and each resource group it needs, flavors are tried in the
ClusterQueue's order. Each gets a mode — ``FIT`` (quota and room now),
``RECLAIM``/``PREEMPT`` (room after evicting victims found by the preemption
search), ``NO_CANDIDATES`` (would need preemption but nobody may be evicted),
``NO_FIT`` — and a *borrowing level* (0 = within the ClusterQueue's nominal
quota; higher = quota from further up the cohort tree). ``whenCanBorrow`` /
``whenCanPreempt`` decide whether to stop at a flavor that borrows or needs
preemption, ``preference`` which of two imperfect flavors wins.

Kueue checks physical room only after choosing the flavor (TAS); across many
clusters a flavor that has quota but no room anywhere is as good as one that
needs preemption, so the physical check is part of each flavor's mode.

Reference: kueue ``pkg/scheduler/flavorassigner/flavorassigner.go``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from service.domain.quantity import format_amount
from service.domain.quota import FlavorFungibility, ResourceFlavor
from service.engine.packing import GangPlacement, PodSetRequest, place_gang, pristine_fits
from service.engine.placement import tolerates
from service.engine.quota import FlavorResource, QuotaNode
from service.engine.state import CQState, CycleState
from service.engine.workload_info import (
    FlavorPlan,
    PlanEntry,
    PlannedFlavor,
    PodSetInfo,
    WorkloadInfo,
)

__all__ = [
    "FIT",
    "NO_CANDIDATES",
    "NO_FIT",
    "PREEMPT",
    "RECLAIM",
    "Assignment",
    "PreemptionPlan",
    "admit_simply",
    "assign_flavors",
    "describe_shape",
    "flavor_mismatch",
    "flavor_plan",
    "quota_mode_only",
    "render_quota_note",
]

NO_FIT, NO_CANDIDATES, PREEMPT, RECLAIM, FIT = 0, 1, 2, 3, 4
#: Fits without borrowing: no ``flavorFungibility`` setting looks further.
_FITS_NOMINAL = (FIT, 0)

# Pending reasons, from most to least severe (Kueue's UnadmittedWorkloadsObservability).
NO_MATCHING_FLAVOR = "NoMatchingFlavor"
EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
TOPOLOGY_PLACEMENT_FAILED = "TopologyPlacementFailed"
WAITING_FOR_QUOTA = "WaitingForQuota"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
_SEVERITY = {
    NO_MATCHING_FLAVOR: 5,
    EXCEEDS_MAX_QUOTA: 4,
    TOPOLOGY_PLACEMENT_FAILED: 3,
    WAITING_FOR_QUOTA: 2,
    WAITING_FOR_CAPACITY: 1,
    "": 0,
}


@dataclass(slots=True)
class PreemptionPlan:
    """Victims (with reasons) whose eviction lets the workload in, and where it lands."""

    victims: list[tuple[object, str]]
    placement: GangPlacement
    #: Borrowing level once the victims are gone (Kueue's ``borrowAfterPreemptions``).
    borrow: int = 0


@dataclass(slots=True)
class Assignment:
    pod_set_flavors: list[dict[str, str]] = field(default_factory=list)
    usage: dict[FlavorResource, int] = field(default_factory=dict)
    mode: int = FIT
    borrow: int = 0
    frs_need_preemption: set[FlavorResource] = field(default_factory=set)
    reason: str = ""
    #: Parts of the why-not message, rendered only when asked for (most never are).
    messages: list[str | tuple[str, _Notes]] = field(default_factory=list)
    placement: GangPlacement | None = None
    plan: PreemptionPlan | None = None

    def message(self) -> str:
        return "; ".join(
            m if isinstance(m, str) else f"{m[0]}: " + "; ".join(m[1].render())
            for m in self.messages
        )


#: ``oracle(workload, assignment so far) -> plan or None``, for the preemption search.
#: Victims are workloads admitted before the cycle: where the quota tree holds none
#: (``CycleState.preemptible_in_tree``) an oracle finds no plan, and is not asked.
Oracle = Callable[[WorkloadInfo, "Assignment"], PreemptionPlan | None]


def _worse(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """The less admissible of two (mode, borrow) pairs."""
    mode = min(a[0], b[0])
    return (mode, max(a[1], b[1]))


def is_preferred(a: tuple[int, int], b: tuple[int, int], fungibility: FlavorFungibility) -> bool:
    """Whether mode ``a`` beats ``b`` (Kueue ``isPreferred``)."""
    if a[0] == NO_FIT:
        return False
    if b[0] == NO_FIT:
        return True
    if (a[0] == NO_CANDIDATES) != (b[0] == NO_CANDIDATES):
        return a[0] != NO_CANDIDATES
    if fungibility.preference == "PreemptionOverBorrowing":
        if a[1] != b[1]:
            return a[1] < b[1]
        return a[0] > b[0]
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] < b[1]


def should_try_next(mode: tuple[int, int], fungibility: FlavorFungibility) -> bool:
    if mode[0] in (NO_FIT, NO_CANDIDATES):
        return True
    if mode[0] in (PREEMPT, RECLAIM) and fungibility.when_can_preempt == "TryNextFlavor":
        return True
    return mode[1] > 0 and fungibility.when_can_borrow == "TryNextFlavor"


def _flavor_mismatch(
    state: CycleState, flavor: ResourceFlavor | None, name: str, ps: PodSetInfo
) -> str | None:
    if flavor is None:
        return f"flavor {name} not found"
    tolerations = tuple(ps.tolerations) + tuple(flavor.tolerations)
    for taint in flavor.node_taints:
        if taint.effect != "PreferNoSchedule" and not tolerates((taint,), tolerations):
            return f"untolerated taint {taint.key}={taint.value}:{taint.effect} in flavor {name}"
    for key, value in ps.node_selector.items():
        if key in flavor.node_labels and flavor.node_labels[key] != value:
            return f"flavor {name} doesn't match node affinity"
    if ps.mode != "unconstrained":
        topology = state.topologies.get(flavor.topology_name or "")
        if topology is None:
            return f"flavor {name} does not support TopologyAwareScheduling"
        if ps.level is not None and ps.level not in topology.levels:
            return f"flavor {name} does not contain the requested level {ps.level}"
    return None


#: A quota note, formatted only when a message is needed:
#: ``(fr, request, maximum)`` for ExceedsMaxQuota, ``(fr, missing, None)`` otherwise.
QuotaNote = tuple[FlavorResource, int, int | None]


def _render_quota_note(note: QuotaNote) -> str:
    (flavor, resource), amount, maximum = note
    if maximum is not None:
        return (
            f"insufficient quota for {resource} in flavor {flavor}, request "
            f"({format_amount(resource, amount)}) > maximum capacity "
            f"({format_amount(resource, maximum)})"
        )
    return (
        f"insufficient unused quota for {resource} in flavor {flavor}, "
        f"{format_amount(resource, amount)} more needed"
    )


def _quota_check(cq: CQState, fr: FlavorResource, value: int) -> tuple[int, int, int]:
    """``(mode, borrow, room)`` for ``value`` of one flavor-resource.

    ``borrow`` is -1 when ``value`` exceeds the most the ClusterQueue could ever
    use (``room`` is then that maximum); otherwise ``room`` is what is available now.
    """
    node = cq.node
    flat = node.flat_root(fr)
    if flat is not None:
        return _flat_quota_check(cq, flat, fr, value)
    maximum = node.potential_available(fr)
    if value > maximum:
        return NO_FIT, -1, maximum
    available = node.available(fr)
    if value <= available:
        if node.parent is None or node.usage.get(fr, 0) + value <= node.subtree_quota.get(fr, 0):
            return FIT, 0, available
        return FIT, node.borrowing_level(fr, value)[0], available
    borrow, may_reclaim = node.borrowing_level(fr, value)
    return _short(cq, fr, value, borrow, may_reclaim), borrow, available


def _short(cq: CQState, fr: FlavorResource, value: int, borrow: int, may_reclaim: bool) -> int:
    """The mode of a flavor-resource without enough quota available: preemption may help?"""
    if may_reclaim or cq.preempts_while_borrowing:
        return PREEMPT
    quota = cq.node.quotas.get(fr)
    nominal = quota.nominal if quota is not None else 0
    return PREEMPT if nominal >= value else NO_FIT


def _flat_quota_check(
    cq: CQState, root: QuotaNode, fr: FlavorResource, value: int
) -> tuple[int, int, int]:
    """``_quota_check`` when no node up to ``root`` limits borrowing or lending of ``fr``.

    Then no node keeps local quota (its local available is ``max(0, -usage)``)
    and the root's numbers give both the maximum and what is available now;
    this is ``QuotaNode.borrowing_level`` with that arithmetic inlined.
    """
    maximum = root.subtree_quota.get(fr, 0)
    if value > maximum:
        return NO_FIT, -1, maximum
    available = maximum - root.usage.get(fr, 0)
    node = cq.node
    if node.parent is None:
        borrow, may_reclaim = 0, False
    else:
        used = node.usage.get(fr, 0)
        if used + value <= node.subtree_quota.get(fr, 0):
            borrow, may_reclaim = 0, True
        else:
            borrow, may_reclaim = _flat_level(node, fr, value - max(0, -used))
    if value <= available:
        return FIT, borrow, available
    return _short(cq, fr, value, borrow, may_reclaim), borrow, available


def _flat_level(node: QuotaNode, fr: FlavorResource, remaining: int) -> tuple[int, bool]:
    """Height of the lowest ancestor whose subtree fits ``remaining`` more, flat quota."""
    ancestor = node
    for ancestor in node.lineage:
        used = ancestor.usage.get(fr, 0)
        if used + remaining <= ancestor.subtree_quota.get(fr, 0):
            return ancestor.height, ancestor.parent is not None
        remaining -= max(0, -used)
    return ancestor.height, ancestor.parent is not None


def _fits_quota(
    state: CycleState, cq: CQState, fr: FlavorResource, value: int
) -> tuple[int, int, str, QuotaNote | None]:
    """``(mode, borrow, reason, note)`` for ``value`` of one flavor-resource."""
    mode, borrow, room = _quota_check(cq, fr, value)
    if borrow < 0:
        return NO_FIT, 0, EXCEEDS_MAX_QUOTA, (fr, value, room)
    if mode == FIT:
        return FIT, borrow, "", None
    return mode, borrow, WAITING_FOR_QUOTA, (fr, value - room, None)


def _flavor_mode(cq: CQState, frs: PlannedFlavor) -> tuple[int, int]:
    """The ``(mode, borrow)`` of one flavor for a gang alone (``_GroupSearch.quota_mode``).

    Where a flavor-resource has a flat root this is ``_flat_quota_check``
    inlined (it runs for nearly every head): the answer is most often that
    the gang fits within the ClusterQueue's own quota, and nothing is combined.
    """
    mode, borrow = FIT, 0
    node = cq.node
    parent = node.parent
    for fr, value, root in frs:
        if root is None:
            fmode, fborrow, _ = _quota_check(cq, fr, value)
        else:
            maximum = root.subtree_quota.get(fr, 0)
            if value > maximum:
                fmode, fborrow = NO_FIT, -1
            else:
                available = maximum - root.usage.get(fr, 0)
                if parent is None:
                    fborrow, may_reclaim = 0, False
                else:
                    used = node.usage.get(fr, 0)
                    if used + value <= node.subtree_quota.get(fr, 0):
                        if value <= available:
                            continue  # fits, within the ClusterQueue's own quota
                        fborrow, may_reclaim = 0, True
                    else:
                        fborrow, may_reclaim = _flat_level(node, fr, value - max(0, -used))
                short = value > available
                fmode = _short(cq, fr, value, fborrow, may_reclaim) if short else FIT
        mode = min(mode, fmode)
        borrow = max(borrow, fborrow)
        if fmode == NO_FIT:
            break
    return mode, borrow


def _can_preempt_at_all(cq: CQState) -> bool:
    preemption = cq.spec.preemption
    return preemption.within_cluster_queue != "Never" or (
        cq.node.parent is not None and preemption.reclaim_within_cohort != "Never"
    )


def _describe_shape(ps: PodSetInfo) -> str:
    return "{" + ", ".join(f"{r}: {format_amount(r, a)}" for r, a in ps.shape) + "}"


@dataclass(slots=True)
class _Notes:
    """Why flavors were rejected or are imperfect, for the pending message."""

    attempts: list[str | QuotaNote] = field(default_factory=list)
    worst: str = ""

    def add(self, message: str | QuotaNote, reason: str) -> None:
        self.attempts.append(message)
        self.worst = _most_severe(self.worst, reason)

    def render(self) -> list[str]:
        return [a if isinstance(a, str) else _render_quota_note(a) for a in self.attempts]


@dataclass(slots=True)
class _Trial:
    """One flavor tried for one resource group of one pod set."""

    mode: tuple[int, int]
    placement: GangPlacement | None = None
    plan: PreemptionPlan | None = None
    need: set[FlavorResource] = field(default_factory=set)


@dataclass(slots=True)
class _GroupSearch:
    """Choosing the flavor of one resource group of one pod set."""

    state: CycleState
    wi: WorkloadInfo
    cq: CQState
    index: int
    resources: list[str]
    chosen: dict[str, str]
    result: Assignment
    #: Physical placement is tried once the pod set's last group has a flavor.
    place: bool
    oracle: Oracle | None
    notes: _Notes = field(default_factory=_Notes)

    @property
    def ps(self) -> PodSetInfo:
        return self.wi.pod_sets[self.index]

    def quota_mode(self, name: str) -> _Trial:
        trial = _Trial((FIT, 0))
        totals = self.ps.totals
        for resource in self.resources:
            fr = (name, resource)
            value = self.result.usage.get(fr, 0) + totals[resource]
            fmode, borrow, reason, note = _fits_quota(self.state, self.cq, fr, value)
            if note is not None:
                self.notes.add(note, reason)
            trial.mode = _worse(trial.mode, (fmode, borrow))
            if fmode in (PREEMPT, NO_FIT):
                trial.need.add(fr)
            if fmode == NO_FIT:
                break
        return trial

    def physical_mode(self, name: str, trial: _Trial) -> None:
        """Refine a quota mode with room in the fleet (and a preemption plan)."""
        state, ps = self.state, self.ps
        if trial.mode[0] == FIT:
            flavors_now = {**self.chosen, **dict.fromkeys(self.resources, name)}
            trial.placement = _try_place(state, self.wi, self.index, flavors_now)
            if trial.placement is None:
                request = state.pod_set_request(self.wi, self.index, flavors_now)
                if pristine_fits(state.inventory, [request], state.pristine_cache):
                    self.notes.add(
                        f"no cluster has room now for {ps.count} pod(s) of "
                        f"{_describe_shape(ps)} in flavor {name}",
                        WAITING_FOR_CAPACITY,
                    )
                    trial.mode = (PREEMPT, trial.mode[1])
                    trial.need |= {(name, r) for r in self.resources}
                else:
                    self.notes.add(_never_fits_message(ps, name), TOPOLOGY_PLACEMENT_FAILED)
                    trial.mode = (NO_FIT, trial.mode[1])
        if trial.mode[0] != PREEMPT:
            return
        if not _can_preempt_at_all(self.cq):
            trial.mode = (NO_CANDIDATES, trial.mode[1])
            return
        if self.oracle is None or len(self.wi.pod_sets) != 1:
            return
        if not self.state.preemptible_in_tree.get(self.cq.root):
            # What any search would find: nobody (see ``Oracle``).
            trial.mode = (NO_CANDIDATES, trial.mode[1])
            return
        flavors_now = {**self.chosen, **dict.fromkeys(self.resources, name)}
        attempt = Assignment(
            pod_set_flavors=[flavors_now],
            usage=_usage_with(self.result.usage, ps, flavors_now),
            frs_need_preemption=trial.need,
        )
        trial.plan = self.oracle(self.wi, attempt)
        if trial.plan is None:
            trial.mode = (NO_CANDIDATES, trial.mode[1])
        elif all(getattr(v, "cq", None) is not self.cq for v, _ in trial.plan.victims):
            trial.mode = (RECLAIM, trial.plan.borrow)
        else:
            trial.mode = (PREEMPT, trial.plan.borrow)

    def choose(self, flavor_names: tuple[str, ...]) -> tuple[str | None, _Trial]:
        fungibility = self.cq.spec.flavor_fungibility
        best = _Trial((NO_FIT, 1 << 30))
        best_flavor: str | None = None
        for name in flavor_names:
            mismatch = _mismatch(self.state, name, self.ps)
            if mismatch is not None:
                self.notes.add(mismatch, NO_MATCHING_FLAVOR)
                continue
            trial = self.quota_mode(name)
            if self.place and trial.mode[0] != NO_FIT:
                self.physical_mode(name, trial)
            if not should_try_next(trial.mode, fungibility):
                return name, trial
            if is_preferred(trial.mode, best.mode, fungibility):
                best, best_flavor = trial, name
        return best_flavor, best


def _mismatch(state: CycleState, name: str, ps: PodSetInfo) -> str | None:
    """``_flavor_mismatch``, memoised per flavor and pod-set constraints."""
    key = (name, ps.tolerations, ps.selector_items, ps.mode, ps.level)
    cache = state.mismatch_cache
    if key in cache:
        return cache[key]
    found = cache[key] = _flavor_mismatch(state, state.flavors.get(name), name, ps)
    return found


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
            if _mismatch(state, name, ps) is None
        )
        state.plan_skeletons[key] = skeleton
    return skeleton


def _known_flavor_mode(cq: CQState, entry: PlanEntry) -> tuple[int, int]:
    """``_flavor_mode``, memoised while usage of that flavor in the quota tree is unchanged.

    Once a flavor is used up in a quota tree, every later head that tries it
    finds the same answer: most checks late in a big cycle are such repeats.
    """
    version = entry.version[0]
    if entry.checked_at != version:
        entry.checked_at, entry.mode = version, _flavor_mode(cq, entry.frs)
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
        if mode == _FITS_NOMINAL or not should_try_next(mode, fungibility):
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
    nobody_to_preempt = not _can_preempt_at_all(cq) or not state.preemptible_in_tree.get(cq.root)
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
            search = _GroupSearch(
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
            overall = _worse(overall, best.mode)
            if best.mode[0] != FIT:
                result.frs_need_preemption |= best.need
                result.messages.append((f"couldn't assign flavors to pod set {ps.name}", notes))
                if not result.reason or _SEVERITY[notes.worst] > _SEVERITY[result.reason]:
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
    result.mode = PREEMPT if _can_preempt_at_all(cq) else NO_CANDIDATES
    result.reason = WAITING_FOR_CAPACITY
    result.messages.append("no single cluster has room now for every pod set of the gang")
    for index, flavors in enumerate(result.pod_set_flavors):
        result.frs_need_preemption |= {
            (f, r) for r, f in flavors.items() if r in wi.pod_sets[index].totals
        }


def _most_severe(a: str, b: str) -> str:
    return a if _SEVERITY.get(a, 0) >= _SEVERITY.get(b, 0) else b


def _never_fits_message(ps: PodSetInfo, flavor: str) -> str:
    where = "one island" if ps.mode == "required" else "one cluster"
    return (
        f"no schedulable cluster in flavor {flavor} could hold {ps.count} pod(s) of "
        f"{_describe_shape(ps)} within {where}, even if it were empty"
    )


def _usage_with(
    usage: dict[FlavorResource, int], ps: PodSetInfo, flavors: dict[str, str]
) -> dict[FlavorResource, int]:
    result = dict(usage)
    for resource, amount in ps.totals.items():
        fr = (flavors[resource], resource)
        result[fr] = result.get(fr, 0) + amount
    return result


def _try_place(
    state: CycleState, wi: WorkloadInfo, index: int, flavors: dict[str, str]
) -> GangPlacement | None:
    request: PodSetRequest = state.pod_set_request(wi, index, flavors)
    return place_gang(state.inventory, [request])


#: Shared with ``service.engine.feasibility``, which words never-fitting gangs alike.
describe_shape = _describe_shape
flavor_mismatch = _flavor_mismatch
render_quota_note = _render_quota_note
