"""Consolidation: empty part of one island for a gang that only fragmentation blocks.

After the admission loop, a gang left waiting with cause
``FragmentedAcrossIslands`` (its quota fits, the fleet's free total covers it,
no island holds it: ``service.engine.fragmentation``) may preempt gangs inside
one island so that it fits there (issue 24; KAI's consolidation relocates
jobs to the same end, kueue#5243 and #12478 are open). Rules:

* **victims**: whole gangs admitted before this cycle with pods in the island,
  of lower priority than the gang — or of equal priority in another
  ClusterQueue of the same cohort tree that borrows on a flavor it holds
  (over its share), when the gang stays within its nominal quota and fair
  sharing or its ``reclaimWithinCohort: Any`` would reclaim that gang too —
  and that protection (``service.engine.protection``, reason
  ``Consolidation``) lets go. Never a gang of higher priority. The
  ClusterQueue's ``withinClusterQueue`` is not asked: a moved gang restarts
  at once elsewhere, it does not give up its place;
* **which island**: of the islands large enough to hold the gang whole, the
  one whose minimal victim set destroys the fewest accelerator-seconds since
  the victims' last checkpoints (ties: fewer victims, fleet order); inside an
  island, victims are taken lowest priority first, then least work destroyed
  per accelerator, then newest first, and those not needed are put back
  (the preemption search's heuristic);
* **only when the victims go again at once** (``victim_placement:
  Immediate``, the default): after the move, every victim must fit its
  ClusterQueue's quota and the fleet's room elsewhere, one after the other,
  so that each restarts once and waits no longer than the next cycle.
  ``Any`` skips that check.

Each victim is recorded as a :class:`Preemption` with reason
``Consolidation``, the preemptor, and the work destroyed. Off unless
:attr:`EngineConfig.consolidation` enables it: decisions are then unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.engine.decisions import Decisions
from service.engine.failures import Failure
from service.engine.flavorassigner import FIT, assign_flavors
from service.engine.ordering import ClusterQueueQueue
from service.engine.packing import GangPlacement, PodSetRequest, place_gang, pristine_capacity_of
from service.engine.placement import Island, NodeState, PodSetPlacement, Shape, fill_island
from service.engine.protection import CONSOLIDATION, preemptor_borrows
from service.engine.quota import FlavorResource
from service.engine.reservation import Reservation
from service.engine.state import CycleState
from service.engine.workload_info import AdmittedInfo, WorkloadInfo

__all__ = ["consolidate"]


def consolidate(
    state: CycleState,
    queues: dict[str, ClusterQueueQueue],
    decisions: Decisions,
    reservation: Reservation | None = None,
) -> None:
    """Admit fragmented gangs, highest priority and oldest first, by moving others.

    An island still held by a reservation (``service.engine.reservation``) is
    left alone: no move empties it for another gang."""
    if not state.config.consolidation.enable:
        return
    skip = reservation.island.seq if reservation is not None and reservation.holding else None
    fragmented = [
        wi
        for name in sorted(queues)
        for wi in queues[name].all_workloads()
        if type(wi.why) is Failure and wi.why.fragmentation_of(wi) is not None
    ]
    if not fragmented:
        return
    fragmented.sort(key=lambda wi: (-wi.priority, wi.time, wi.seq))
    holders = _holders_by_node(state)
    #: Shapes that found no move at an epoch: a same-shaped gang no higher finds none.
    hopeless: dict[tuple[object, ...], tuple[int, int]] = {}
    for wi in fragmented:
        assert wi.cq is not None
        signature = (wi.cq.name, wi.signature())
        seen = hopeless.get(signature)
        if seen is not None and seen[0] == state.epoch and wi.priority <= seen[1]:
            continue
        if not _move(state, wi, decisions, holders, skip):
            hopeless[signature] = (state.epoch, wi.priority)


def _holders_by_node(state: CycleState) -> dict[str, list[AdmittedInfo]]:
    """Node name -> the gangs admitted before this cycle with pods on it."""
    holders: dict[str, list[AdmittedInfo]] = {}
    for info in state.admitted.values():
        if info.fresh:
            continue
        for node, _, _ in info.placements:
            holders.setdefault(node.name, []).append(info)
    return holders


class _Move:
    """One gang's consolidation: its requests, and the best island found."""

    def __init__(
        self,
        state: CycleState,
        wi: WorkloadInfo,
        flavors: list[dict[str, str]],
        skip: int | None = None,
    ) -> None:
        self.state = state
        self.wi = wi
        #: An island (seq) not to move gangs in: the one a reservation holds.
        self.skip = skip
        self.requests = [state.pod_set_request(wi, i, f) for i, f in enumerate(flavors)]

    def islands(self) -> list[Island]:
        """Islands every pod set may use that could hold the whole gang once emptied."""
        cache = self.state.pristine_cache
        common: dict[int, Island] | None = None
        for request in self.requests:
            here = {
                seq: island
                for seq, island in request.eligible.items()
                if seq != self.skip
                and pristine_capacity_of(island, request.shape, cache) >= request.count
            }
            common = here if common is None else {s: i for s, i in common.items() if s in here}
        return sorted((common or {}).values(), key=lambda i: i.seq)

    def place_in(self, island: Island) -> GangPlacement | None:
        """Room for every pod set in ``island`` now, or ``None``. Does not allocate."""
        inventory = self.state.inventory
        placed: list[tuple[PodSetRequest, PodSetPlacement]] = []
        try:
            for request in self.requests:
                chosen = fill_island(island, request.shape, request.count)
                if chosen is None:
                    return None
                inventory.allocate(chosen, request.shape)
                placed.append((request, PodSetPlacement(tuple(chosen), (island.name,))))
        finally:
            for request, placement in placed:
                inventory.release(placement.nodes, request.shape)
        return GangPlacement(island.cluster, tuple(p for _, p in placed))


def _move(
    state: CycleState,
    wi: WorkloadInfo,
    decisions: Decisions,
    holders: dict[str, list[AdmittedInfo]],
    skip: int | None = None,
) -> bool:
    assert wi.cq is not None
    assignment = assign_flavors(state, wi, physical=False)
    if assignment.mode != FIT:
        return False
    move = _Move(state, wi, assignment.pod_set_flavors, skip)
    borrows = preemptor_borrows(wi.cq, assignment.usage)
    best: tuple[float, int, int, list[AdmittedInfo]] | None = None
    for island in move.islands():
        victims = _victims_in(state, move, island, borrows, holders)
        if victims is None:
            continue
        cost = sum(_destroyed(state, v) for v in victims)
        key = (cost, len(victims), island.seq)
        if best is not None and key >= best[:3]:
            continue
        if not _victims_go_again(state, move, island, victims, assignment.usage):
            continue
        best = (cost, len(victims), island.seq, victims)
    if best is None:
        return False
    victims = best[3]
    island = next(i for i in move.islands() if i.seq == best[2])
    for victim in victims:
        state.simulate_remove(victim)
    placement = move.place_in(island)
    for victim in victims:
        state.simulate_restore(victim)
    assert placement is not None
    decisions.admit(
        wi,
        assignment.usage,
        assignment.pod_set_flavors,
        placement,
        [(v, CONSOLIDATION) for v in victims],
    )
    wi.why = None
    return True


def _destroyed(state: CycleState, victim: AdmittedInfo) -> float:
    return victim.seconds_at_risk(state.now) * victim.accelerators(
        state.config.accelerator_resources
    )


def _candidates(
    state: CycleState,
    wi: WorkloadInfo,
    island: Island,
    borrows: bool,
    holders: dict[str, list[AdmittedInfo]],
) -> list[AdmittedInfo]:
    """Gangs with pods in ``island`` that consolidation may preempt for ``wi``, in order."""
    assert wi.cq is not None
    # Equal priority: only a borrower's gang, reclaimed by a gang that stays
    # within its nominal quota, where fair sharing or ``reclaimWithinCohort: Any``
    # would reclaim it too.
    reclaims = not borrows and (
        state.config.fair_sharing.enable or wi.cq.spec.preemption.reclaim_within_cohort == "Any"
    )
    protection = state.protection
    seen: dict[str, AdmittedInfo] = {}
    for node in island.nodes:
        for victim in holders.get(node.name, ()):
            if victim.key in seen or victim.cq is None or victim.key not in state.admitted:
                continue
            if victim.priority > wi.priority:
                continue
            if victim.priority == wi.priority and not (reclaims and _over_share(wi, victim)):
                continue
            if not protection.allows(victim, CONSOLIDATION, borrows):
                continue
            seen[victim.key] = victim
    now = state.now
    return sorted(
        seen.values(),
        key=lambda v: (v.priority, v.seconds_at_risk(now), -v.admitted_at, v.key),
    )


def _over_share(wi: WorkloadInfo, victim: AdmittedInfo) -> bool:
    """The victim's ClusterQueue, another one of the same cohort tree, borrows on
    a flavor-resource it holds: it is over its share."""
    assert wi.cq is not None and victim.cq is not None
    if victim.cq is wi.cq or victim.cq.root != wi.cq.root:
        return False
    node = victim.cq.node
    return any(node.borrowing(fr) for fr in victim.usage)


def _victims_in(
    state: CycleState,
    move: _Move,
    island: Island,
    borrows: bool,
    holders: dict[str, list[AdmittedInfo]],
) -> list[AdmittedInfo] | None:
    """A minimal set of victims in ``island`` after which the gang fits there."""
    if move.place_in(island) is not None:
        return []
    removed: list[AdmittedInfo] = []
    fits = False
    for victim in _candidates(state, move.wi, island, borrows, holders):
        state.simulate_remove(victim)
        removed.append(victim)
        if move.place_in(island) is not None:
            fits = True
            break
    if not fits:
        for victim in reversed(removed):
            state.simulate_restore(victim)
        return None
    for i in range(len(removed) - 2, -1, -1):
        state.simulate_restore(removed[i])
        if move.place_in(island) is not None:
            del removed[i]
        else:
            state.simulate_remove(removed[i])
    for victim in removed:
        state.simulate_restore(victim)
    if not state.protection.affordable([(v, CONSOLIDATION) for v in removed], borrows):
        return None
    return removed


def _victims_go_again(
    state: CycleState,
    move: _Move,
    island: Island,
    victims: Sequence[AdmittedInfo],
    usage: dict[FlavorResource, int],
) -> bool:
    """Whether, once the gang is in ``island``, each victim fits quota and room elsewhere."""
    if state.config.consolidation.victim_placement == "Any":
        return True
    assert move.wi.cq is not None
    inventory = state.inventory
    for victim in victims:
        state.simulate_remove(victim)
    placement = move.place_in(island)
    assert placement is not None
    held: list[tuple[Sequence[tuple[NodeState, int]], Shape]] = []
    node = move.wi.cq.node
    node.add(usage)
    quota_held: list[tuple[AdmittedInfo, dict[FlavorResource, int]]] = []
    try:
        for request, placed in zip(move.requests, placement.pod_sets, strict=True):
            inventory.allocate(placed.nodes, request.shape)
            held.append((placed.nodes, request.shape))
        for victim in victims:
            again = _place_again(state, victim)
            if again is None:
                return False
            for nodes, shape in again:
                inventory.allocate(nodes, shape)
                held.append((nodes, shape))
            assert victim.cq is not None
            victim.cq.node.add(victim.usage)
            quota_held.append((victim, victim.usage))
        return True
    finally:
        for victim, victim_usage in reversed(quota_held):
            assert victim.cq is not None
            victim.cq.node.remove(victim_usage)
        node.remove(usage)
        for nodes, shape in reversed(held):
            inventory.release(nodes, shape)
        for victim in victims:
            state.simulate_restore(victim)


def _place_again(
    state: CycleState, victim: AdmittedInfo
) -> list[tuple[Sequence[tuple[NodeState, int]], Shape]] | None:
    """Where ``victim`` would go now with the flavors it holds, if its quota lets it."""
    assert victim.cq is not None
    cq_node = victim.cq.node
    if any(value > cq_node.available(fr) for fr, value in victim.usage.items()):
        return None
    wi = WorkloadInfo(victim.wl, victim.priority, -1, shape=state.gang_shape(victim.wl))
    requests = []
    for index, ps in enumerate(wi.pod_sets):
        flavors = {r: f for (f, r) in victim.usage if r in ps.requests}
        if not flavors:
            return None
        requests.append(state.pod_set_request(wi, index, flavors))
    placement = place_gang(state.inventory, requests)
    if placement is None:
        return None
    return [
        (placed.nodes, request.shape)
        for request, placed in zip(requests, placement.pod_sets, strict=True)
    ]
