"""Preemption: a minimal set of whole gangs to evict so that a workload gets in.

Candidates follow the ClusterQueue's policy — ``withinClusterQueue`` for its own
workloads, ``reclaimWithinCohort`` for workloads of ClusterQueues that borrow,
``borrowWithinCohort`` (+ ``maxPriorityThreshold``) for preempting while the
preemptor itself borrows — and, with fair sharing, Kueue's DRS-driven target
ordering and strategies. The heuristic is Kueue's: remove candidates in order
until the workload fits, then put back, newest-removed-first, every victim that
is not needed. "Fits" means both quota (as the cohort tree allows) *and*
physical room for the whole gang in one cluster (and island when required), so
victims are chosen where the preemptor will land and a preemption that would
not let it in is never issued.

References: kueue ``pkg/scheduler/preemption/preemption.go``,
``classical/hierarchical_preemption.go``, ``classical/candidate_generator.go``,
``fair_strategy.go``, ``fairsharing/ordering.go``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from service.engine.fair_sharing import ZERO_SHARE, Share, dominant_resource_share
from service.engine.flavorassigner import Assignment, PreemptionPlan
from service.engine.packing import GangPlacement, place_gang, pristine_capacity_of
from service.engine.protection import preemptor_borrows
from service.engine.quota import QuotaNode
from service.engine.replicas import ReplicaGuard
from service.engine.state import CQState, CycleState
from service.engine.workload_info import AdmittedInfo, WorkloadInfo

__all__ = [
    "IN_CLUSTER_QUEUE",
    "IN_COHORT_FAIR_SHARING",
    "IN_COHORT_RECLAIM_WHILE_BORROWING",
    "IN_COHORT_RECLAMATION",
    "find_preemption_plan",
]

IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_FAIR_SHARING = "InCohortFairSharing"
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"

# Candidate variants (Kueue ``preemptionVariant``).
_NEVER, _WITHIN_CQ, _HIERARCHICAL, _WITHOUT_BORROWING, _WHILE_BORROWING = range(5)
_REASON = {
    _WITHIN_CQ: IN_CLUSTER_QUEUE,
    _HIERARCHICAL: IN_COHORT_RECLAMATION,
    _WITHOUT_BORROWING: IN_COHORT_RECLAMATION,
    _WHILE_BORROWING: IN_COHORT_RECLAIM_WHILE_BORROWING,
}


class _Search:
    """Shared state of one preemption search for one workload and assignment."""

    def __init__(self, state: CycleState, wi: WorkloadInfo, assignment: Assignment) -> None:
        assert wi.cq is not None
        self.state = state
        self.wi = wi
        self.cq: CQState = wi.cq
        self.usage = assignment.usage
        self.frs = frozenset(assignment.frs_need_preemption)
        self._flavors = assignment.pod_set_flavors
        # What an island allows its class statically: islands that hold the other
        # class now may be emptied by the search (``island_classes``).
        self.requests = [
            state.pod_set_request(wi, i, flavors, now=False)
            for i, flavors in enumerate(assignment.pod_set_flavors)
        ]
        self._eligible_islands = {seq for request in self.requests for seq in request.eligible}
        self._last_placement: GangPlacement | None = None
        self._physical_dirty = True
        #: Whether the preemptor borrows once in: its reclaim is then protected.
        self.borrows = preemptor_borrows(self.cq, self.usage)
        #: Serving units: never below ``min_replicas``, newest first (``replicas``).
        self.replicas = ReplicaGuard(state.units)
        #: ClusterQueue -> seconds left of the grace that kept its gangs from us.
        self.graced: dict[str, float] = {}

    # --- fit checks ---------------------------------------------------------------------

    def quota_fits(self, allow_borrowing: bool) -> bool:
        node = self.cq.node
        for fr, value in self.usage.items():
            if not allow_borrowing and node.borrowing_with(fr, value):
                return False
            if value > node.available(fr):
                return False
        return True

    def fits(self, allow_borrowing: bool) -> GangPlacement | None:
        if not self.quota_fits(allow_borrowing):
            return None
        if not self._physical_dirty:
            return self._last_placement
        # The islands open to the class as the victims removed so far leave them.
        requests = [self.state.pod_set_request(self.wi, i, f) for i, f in enumerate(self._flavors)]
        self._last_placement = place_gang(self.state.inventory, requests)
        self._physical_dirty = False
        return self._last_placement

    def remove(self, victim: AdmittedInfo) -> None:
        self.state.simulate_remove(victim)
        self._touch(victim)

    def restore(self, victim: AdmittedInfo) -> None:
        self.state.simulate_restore(victim)
        self._touch(victim)

    def landing_islands(self) -> set[int]:
        """Islands the gang could land in once emptied: for a pod set required
        in one island, those large enough to hold it whole."""
        seqs: set[int] = set()
        cache = self.state.pristine_cache
        for request in self.requests:
            if request.mode == "required" and request.level is None:
                seqs.update(
                    seq
                    for seq, island in request.eligible.items()
                    if pristine_capacity_of(island, request.shape, cache) >= request.count
                )
            else:
                seqs.update(request.eligible)
        return seqs

    def occupies(self, victim: AdmittedInfo, islands: set[int] | frozenset[int]) -> bool:
        return any(
            node.island is not None and node.island.seq in islands
            for node, _, _ in victim.placements
        )

    def _touch(self, victim: AdmittedInfo) -> None:
        if self.occupies(victim, self._eligible_islands):
            self._physical_dirty = True

    # --- the heuristic ------------------------------------------------------------------

    def minimal(
        self,
        candidates: Iterator[tuple[AdmittedInfo, str]],
        allow_borrowing: bool,
        fits: Callable[[], GangPlacement | None] | None = None,
    ) -> PreemptionPlan | None:
        check = fits or (lambda: self.fits(allow_borrowing))
        # Replicas first: the unit the guard puts in a candidate's place must
        # itself pass protection (never below the floor, all the same).
        candidates = self.replicas.order(candidates)
        protection = self.state.protection
        if protection.active:
            candidates = protection.admissible(candidates, self.borrows)
        targets: list[tuple[AdmittedInfo, str]] = []
        placement: GangPlacement | None = None
        for victim, reason in candidates:
            self.remove(victim)
            targets.append((victim, reason))
            placement = check()
            if placement is not None:
                break
        if placement is None:
            for victim, _ in reversed(targets):
                self.restore(victim)
            return None
        # Put back every victim that is not needed, the last one removed excepted.
        for i in range(len(targets) - 2, -1, -1):
            victim = targets[i][0]
            if not self.replicas.may_restore(victim, [t for t, _ in targets]):
                continue
            self.restore(victim)
            if check() is not None:
                del targets[i]
            else:
                self.remove(victim)
        placement = check()
        assert placement is not None
        node = self.cq.node
        borrow = max((node.borrowing_level(fr, v)[0] for fr, v in self.usage.items()), default=0)
        for victim, _ in targets:
            self.restore(victim)
        if protection.active and not protection.affordable(targets, self.borrows):
            return None
        return PreemptionPlan(victims=list(targets), placement=placement, borrow=borrow)


def _ordering_key(
    state: CycleState, cq: CQState, wi: WorkloadInfo
) -> Callable[[AdmittedInfo], tuple[bool, int, bool, float, float, str]]:
    """Other ClusterQueues first, lower priority first (Kueue's rules), then the
    least work destroyed per accelerator freed — the seconds since the last
    checkpoint (issue 24; kueue#477) — then most recently admitted first.

    Per accelerator freed, not in all: ordered by whole GPU-seconds the search
    took many small victims where one would do, and on cluster04 preempted 23 %
    more and delayed jobs 28 % longer (docs/scheduling-quality.md). With no
    checkpoint reported this is newest-first, as Kueue orders.

    With ``EngineConfig.spare_island_gangs``, right after the priority: a gang
    that must restart whole in one island and holds more accelerators than the
    preemptor asks for goes after every other candidate, since its restart
    waits for a whole island again (docs/scheduling-quality.md, "Big gangs")."""
    now = state.now
    if not state.config.spare_island_gangs:
        return lambda c: (
            c.cq is cq,
            c.priority,
            False,
            c.seconds_at_risk(now),
            -c.admitted_at,
            c.key,
        )
    names = state.config.accelerator_resources
    need = sum(wi.resources.get(name, 0) for name in names)
    return lambda c: (
        c.cq is cq,
        c.priority,
        c.accelerators(names) > need and _island_gang(c),
        c.seconds_at_risk(now),
        -c.admitted_at,
        c.key,
    )


def _island_gang(info: AdmittedInfo) -> bool:
    """Whether a pod set of the gang must land in one island (or a domain of it)."""
    return any(
        ps.topology_request is not None and ps.topology_request.mode == "required"
        for ps in info.wl.pod_sets
    )


def _not_a_victim(search: _Search, candidate: AdmittedInfo) -> bool:
    """Whether ``candidate`` may not be preempted for ``search.wi``: its priority
    is too high for the policy, or it is a protected island gang."""
    return _too_high(search, candidate) or _protected_gang(search, candidate)


def _protected_gang(search: _Search, candidate: AdmittedInfo) -> bool:
    """``preemption.protection.islandGangGraceSeconds`` of the candidate's
    ClusterQueue: a gang that must restart whole in one island, bigger than a
    preemptor of another ClusterQueue and of no lower priority, is no victim of
    it until the preemptor has been queued that long. Its restart would wait for
    a whole island again; the grace delays a lender's reclaim, never denies it
    (YuniKorn's ``preemption.delay``, "how long a task must be waiting before
    preemption will be considered", bounds every preemption so)."""
    cq = candidate.cq
    if cq is None or cq is search.cq:
        return False
    grace = cq.spec.preemption.protection.island_gang_grace_seconds
    if grace is None:
        return False
    if candidate.priority < search.wi.priority:
        return False
    left = grace - (search.state.now - search.wi.time)
    if left <= 0:
        return False
    names = search.state.config.accelerator_resources
    need = sum(search.wi.resources.get(name, 0) for name in names)
    if candidate.accelerators(names) <= need or not _island_gang(candidate):
        return False
    search.graced[cq.name] = min(left, search.graced.get(cq.name, left))
    return True


def _too_high(search: _Search, candidate: AdmittedInfo) -> bool:
    spec = search.cq.spec.preemption
    policy = spec.within_cluster_queue if candidate.cq is search.cq else spec.reclaim_within_cohort
    wi = search.wi
    lower = wi.priority > candidate.priority
    if policy == "LowerPriority":
        return not lower
    if policy == "LowerOrNewerEqualPriority":
        newer_equal = wi.priority == candidate.priority and wi.time < candidate.time
        return not (lower or newer_equal)
    return policy != "Any"


def _classify(search: _Search, candidate: AdmittedInfo, advantage: bool) -> int:
    if candidate.fresh or not candidate.uses_any(search.frs):
        return _NEVER
    if _not_a_victim(search, candidate):
        return _NEVER
    if candidate.cq is search.cq:
        return _WITHIN_CQ
    if advantage:
        return _HIERARCHICAL
    borrow = search.cq.spec.preemption.borrow_within_cohort
    if borrow.policy == "Never":
        return _WITHOUT_BORROWING
    wi = search.wi
    threshold = borrow.max_priority_threshold
    if candidate.priority >= wi.priority or (
        threshold is not None and candidate.priority > threshold
    ):
        return _WITHOUT_BORROWING
    return _WHILE_BORROWING


def _collect_subtree(
    search: _Search,
    current: QuotaNode,
    skip: QuotaNode | None,
    advantage: bool,
    lca: QuotaNode,
    out: list[tuple[AdmittedInfo, int, QuotaNode]],
) -> None:
    frs = list(search.frs)
    for child in current.children:
        if child is skip:
            continue
        if child.is_cluster_queue:
            cq = search.state.cqs.get(child.name)
            if cq is None or not cq.preemptible or child is search.cq.node:
                continue
            if child.within_nominal(frs):
                continue
            for candidate in cq.preemptible.values():
                variant = _classify(search, candidate, advantage)
                if variant != _NEVER:
                    out.append((candidate, variant, lca))
        elif not child.within_nominal(frs):
            _collect_subtree(search, child, skip, advantage, lca, out)


def _classical(search: _Search) -> PreemptionPlan | None:
    cq = search.cq
    spec = cq.spec.preemption
    key = _ordering_key(search.state, cq, search.wi)
    same: list[tuple[AdmittedInfo, int, QuotaNode | None]] = []
    if spec.within_cluster_queue != "Never":
        for candidate in cq.preemptible.values():
            variant = _classify(search, candidate, False)
            if variant != _NEVER:
                same.append((candidate, variant, None))
    hierarchy: list[tuple[AdmittedInfo, int, QuotaNode]] = []
    by_priority: list[tuple[AdmittedInfo, int, QuotaNode]] = []
    node = cq.node
    if node.parent is not None and spec.reclaim_within_cohort != "Never":
        advantage, remaining = node.fits_in_subtree(search.usage)
        previous: QuotaNode | None = None
        for ancestor in node.ancestors():
            target = hierarchy if advantage else by_priority
            _collect_subtree(search, ancestor, previous, advantage, ancestor, target)
            fits, remaining = ancestor.fits_in_subtree(remaining)
            advantage = advantage or fits
            previous = ancestor
    for group in (same, hierarchy, by_priority):
        group.sort(key=lambda item: key(item[0]))
    ordered: list[tuple[AdmittedInfo, int, QuotaNode | None]] = [*hierarchy, *by_priority, *same]
    frs = list(search.frs)

    def valid(item: tuple[AdmittedInfo, int, QuotaNode | None], borrow: bool) -> bool:
        candidate, variant, lca = item
        if candidate.cq is cq:
            return True
        if borrow and variant == _WITHOUT_BORROWING:
            return False
        assert candidate.cq is not None
        if candidate.cq.node.within_nominal(frs):
            return False
        for ancestor in candidate.cq.node.ancestors():
            if ancestor is lca:
                break
            if ancestor.within_nominal(frs):
                return False
        return True

    def run(borrow: bool) -> Iterator[tuple[AdmittedInfo, str]]:
        for item in ordered:
            if valid(item, borrow):
                yield item[0], _REASON[item[1]]

    forbidden = spec.borrow_within_cohort.policy == "Never"
    if (not hierarchy and not by_priority) or (forbidden and not _under_nominal(search)):
        options = [True]
    elif forbidden and not hierarchy:
        options = [False, True]
    else:
        options = [True, False]
    for borrow in options:
        plan = search.minimal(run(borrow), borrow)
        if plan is not None:
            return plan
    # Kueue's order can spend the candidates on quota alone: removing a
    # borrower's gang that frees no room where the gang could land may end that
    # queue's borrowing, and with it the right to take the gang that does
    # occupy the landing island. Try again with the gangs in islands the gang
    # could land in first, every other rule unchanged.
    landing = search.landing_islands()
    first = [item for item in ordered if search.occupies(item[0], landing)]
    if not first or len(first) == len(ordered):
        return None
    ordered = [*first, *(item for item in ordered if not search.occupies(item[0], landing))]
    for borrow in options:
        plan = search.minimal(run(borrow), borrow)
        if plan is not None:
            return plan
    return None


def _under_nominal(search: _Search) -> bool:
    node = search.cq.node
    for fr in search.frs:
        quota = node.quotas.get(fr)
        if quota is None or node.usage.get(fr, 0) >= quota.nominal:
            return False
    return True


# --- fair sharing ---------------------------------------------------------------------------


def _fair_candidates(search: _Search) -> list[AdmittedInfo]:
    cq = search.cq
    spec = cq.spec.preemption
    result: list[AdmittedInfo] = []
    if spec.within_cluster_queue != "Never":
        result.extend(
            c
            for c in cq.preemptible.values()
            if not c.fresh and c.uses_any(search.frs) and not _not_a_victim(search, c)
        )
    if cq.node.parent is not None and spec.reclaim_within_cohort != "Never":
        for other_node in cq.node.root().cluster_queues:
            if other_node is cq.node:
                continue
            if not any(other_node.borrowing(fr) for fr in search.frs):
                continue
            other = search.state.cqs[other_node.name]
            result.extend(
                c
                for c in other.preemptible.values()
                if not c.fresh and c.uses_any(search.frs) and not _not_a_victim(search, c)
            )
    key = _ordering_key(search.state, cq, search.wi)
    result.sort(key=key)
    return result


class _TargetOrdering:
    """Kueue's ``TargetClusterQueueOrdering``: most unfair subtree first, down to a CQ."""

    def __init__(self, search: _Search, candidates: list[AdmittedInfo]) -> None:
        self.search = search
        self.preemptor = search.cq.node
        self.ancestors = set(map(id, self.preemptor.ancestors()))
        self.targets: dict[str, list[AdmittedInfo]] = {}
        for candidate in candidates:
            self.targets.setdefault(candidate.cq_name, []).append(candidate)
        self.pruned: set[int] = set()

    def share(self, node: QuotaNode) -> Share:
        return dominant_resource_share(node, self.search.state.lendable_cache)

    def has_workload(self, node: QuotaNode) -> bool:
        return bool(self.targets.get(node.name))

    def __iter__(self) -> Iterator[QuotaNode]:
        if self.preemptor.parent is None:
            while self.has_workload(self.preemptor):
                yield self.preemptor
            return
        root = self.preemptor.root()
        while id(root) not in self.pruned:
            target = self._next(root)
            if target is not None:
                yield target

    def drop(self, node: QuotaNode) -> None:
        self.pruned.add(id(node))

    def pop(self, node: QuotaNode) -> AdmittedInfo:
        return self.targets[node.name].pop(0)

    def _next(self, cohort: QuotaNode) -> QuotaNode | None:
        best_cq: QuotaNode | None = None
        best_cq_share: Share = (-1, -1.0)
        best_cohort: QuotaNode | None = None
        best_cohort_share: Share = (-1, -1.0)
        for child in cohort.children:
            if id(child) in self.pruned:
                continue
            share = self.share(child)
            if child.is_cluster_queue:
                if (share == ZERO_SHARE and child is not self.preemptor) or not self.has_workload(
                    child
                ):
                    self.pruned.add(id(child))
                elif share >= best_cq_share:
                    best_cq, best_cq_share = child, share
            elif share == ZERO_SHARE and id(child) not in self.ancestors:
                self.pruned.add(id(child))
            elif share >= best_cohort_share:
                best_cohort, best_cohort_share = child, share
        if best_cq is None and best_cohort is None:
            self.pruned.add(id(cohort))
            return None
        if best_cohort is not None and best_cohort_share >= best_cq_share:
            return self._next(best_cohort)
        return best_cq


def _almost_lcas(preemptor: QuotaNode, target: QuotaNode) -> tuple[QuotaNode, QuotaNode]:
    """The children of the lowest common ancestor on the way to each of the two."""
    preemptor_path = [preemptor, *preemptor.ancestors()]
    target_path = [target, *target.ancestors()]
    target_ids = {id(n): i for i, n in enumerate(target_path)}
    for i, node in enumerate(preemptor_path):
        j = target_ids.get(id(node))
        if j is not None:
            return preemptor_path[max(i - 1, 0)], target_path[max(j - 1, 0)]
    return preemptor_path[-1], target_path[-1]


def _passes(strategy: str, preemptor_new: Share, target_old: Share, target_new: Share) -> bool:
    if strategy == "LessThanInitialShare":
        return preemptor_new < target_old
    return preemptor_new <= target_new


def _shares(node: QuotaNode, target: QuotaNode, ordering: _TargetOrdering) -> tuple[Share, Share]:
    mine, theirs = _almost_lcas(node, target)
    return ordering.share(mine), ordering.share(theirs)


def _fair(search: _Search) -> PreemptionPlan | None:
    candidates = _fair_candidates(search)
    if not candidates:
        return None
    state = search.state
    node = search.cq.node
    strategies = state.config.fair_sharing.preemption_strategies or (
        "LessThanOrEqualToFinalShare",
        "LessThanInitialShare",
    )
    node.add(search.usage)

    def fits() -> GangPlacement | None:
        node.remove(search.usage)
        try:
            return search.fits(True)
        finally:
            node.add(search.usage)

    # A preemptor that stays within its nominal quota even with the incoming
    # workload reclaims what others borrowed regardless of shares (Kueue's
    # FairSharingPreemptWithinNominal).
    within_nominal = not any(node.borrowing(fr) for fr in search.frs)

    def generate() -> Iterator[tuple[AdmittedInfo, str]]:
        retry: list[AdmittedInfo] = []
        ordering = _TargetOrdering(search, candidates)
        first = strategies[0]
        for target in ordering:
            if target is node:
                yield ordering.pop(target), IN_CLUSTER_QUEUE
                continue
            if within_nominal:
                yield ordering.pop(target), IN_COHORT_RECLAMATION
                continue
            preemptor_new, target_old = _shares(node, target, ordering)
            while ordering.has_workload(target):
                candidate = ordering.pop(target)
                state.simulate_remove(candidate)
                _, almost = _almost_lcas(node, target)
                target_new = ordering.share(almost)
                state.simulate_restore(candidate)
                if _passes(first, preemptor_new, target_old, target_new):
                    yield candidate, IN_COHORT_FAIR_SHARING
                    break
                retry.append(candidate)
        if len(strategies) < 2 or not retry:
            return
        ordering = _TargetOrdering(search, retry)
        for target in ordering:
            if target is node:
                ordering.drop(target)
                continue
            preemptor_new, target_old = _shares(node, target, ordering)
            candidate = ordering.pop(target)
            if _passes(strategies[1], preemptor_new, target_old, ZERO_SHARE):
                yield candidate, IN_COHORT_FAIR_SHARING
            ordering.drop(target)

    try:
        return search.minimal(generate(), True, fits)
    finally:
        node.remove(search.usage)


def find_preemption_plan(
    state: CycleState, wi: WorkloadInfo, assignment: Assignment
) -> PreemptionPlan | None:
    """Victims and landing place for ``wi`` under ``assignment``, or ``None``."""
    state.floored = frozenset()
    state.graced = {}
    if not assignment.frs_need_preemption:
        return None
    assert wi.cq is not None
    if not state.preemptible_in_tree.get(wi.cq.root):
        return None
    search = _Search(state, wi, assignment)
    plan = _fair(search) if state.config.fair_sharing.enable else _classical(search)
    state.floored = frozenset(search.replicas.floored) if plan is None else frozenset()
    state.graced = dict(search.graced) if plan is None else {}
    return plan
