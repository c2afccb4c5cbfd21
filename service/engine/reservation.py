"""Head-of-line reservation: one island held for the gang that has waited longest.

With backfill (``BestEffortFIFO``, or many ClusterQueues) a gang that needs a
whole island starves: every time a node of an island frees, a smaller job that
fits takes it, and no island is ever empty enough (issue 24: on the ITP
replays the 32- and 64-GPU gangs wait longer than under a quota-free best fit
in every engine variant). Slurm's backfill reserves the start of its
highest-priority job, Volcano's design for big jobs (``volcano-sh/volcano``
``docs/design/resource-reservation-design.md``) elects a target job by its
waiting time and locks nodes for it; Kueue has no equivalent
(``BestEffortFIFO`` backfills, ``StrictFIFO`` blocks the whole queue).

Ours, behind :attr:`EngineConfig.reservation` (off by default):

* **the gang**: of the pending gangs whose every pod set must land in one
  island, asking for at least ``min_accelerators`` and submitted at least
  ``min_wait_seconds`` ago, the highest priority, then the one waiting
  longest (since its submission, not its last re-queue: a big gang that was
  preempted keeps its seniority; then queue order); in a StrictFIFO
  ClusterQueue only its head, since a gang behind a blocked head would hold
  an island it cannot use;
* **the island**: of the islands that hold it whole when empty, the one
  closest to fitting it now — most of its pods placeable, then most free
  accelerators, then fleet order — such that the gang's quota fits now, or
  fits within its nominal quota once the gangs running in that island have
  ended (when the fleet is full, quotas that add up to it are full too); a
  gang that would still wait for quota gets none, since holding room for it
  would only keep it idle;
* **the hold**: before the admission loop, the island's free capacity is
  taken by a placeholder, so that no other workload of the gang's priority
  or lower is placed there this cycle (one of higher priority sees it free:
  a reservation never reorders priorities); the gang itself sees it free
  when it is tried, and once it is admitted (there or elsewhere) the rest is
  given back. Room that a
  preemption frees inside the island goes to its preemptor: priority and
  reclaim of nominal quota stay above a reservation. Consolidation does not
  move gangs into or out of the island.

The engine keeps no state between cycles: the reservation is chosen anew
from each snapshot, and stays on one island because that island, taking
nothing new, only drains. Nothing is decided for the placeholder: capacity
and quota invariants hold as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.engine.flavorassigner import FIT, assign_flavors
from service.engine.ordering import ClusterQueueQueue
from service.engine.packing import PodSetRequest, pristine_capacity_of
from service.engine.placement import Island, NodeState, Shape, pods_fitting
from service.engine.state import CycleState
from service.engine.workload_info import WorkloadInfo

__all__ = ["Reservation", "reserve"]

#: Candidates whose quota and islands are checked per cycle, oldest first.
_TRIES = 8


class Reservation:
    """The island held for ``gang`` this cycle, and the placeholder holding it."""

    __slots__ = ("_held", "gang", "island", "state")

    def __init__(self, state: CycleState, gang: WorkloadInfo, island: Island) -> None:
        self.state = state
        self.gang = gang
        self.island = island
        self._held: list[tuple[NodeState, Shape]] = []

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def hold(self) -> None:
        """Take every free resource of the island's nodes (the placeholder)."""
        inventory = self.state.inventory
        for node in self.island.nodes:
            shape = tuple(sorted((r, a) for r, a in node.free.items() if a > 0))
            if shape:
                inventory.allocate(((node, 1),), shape)
                self._held.append((node, shape))

    def release(self) -> None:
        """Give back what :meth:`hold` took."""
        inventory = self.state.inventory
        for node, shape in self._held:
            inventory.release(((node, 1),), shape)
        self._held = []


def reserve(state: CycleState, queues: dict[str, ClusterQueueQueue]) -> Reservation | None:
    """Choose this cycle's reservation (module docstring) and hold its island."""
    config = state.config.reservation
    if not config.enable:
        return None
    accelerators = state.config.accelerator_resources
    since = state.now - config.min_wait_seconds
    candidates = [
        wi
        for name in sorted(queues)
        for wi in _waiting(queues[name])
        if wi.cq is not None
        and wi.wl.creation_time <= since
        and all(ps.mode == "required" for ps in wi.pod_sets)
        and _accelerators(wi, accelerators) >= max(1, config.min_accelerators)
    ]
    candidates.sort(key=lambda wi: (-wi.priority, wi.wl.creation_time, wi.seq))
    for wi in candidates[:_TRIES]:
        island = _island_for(state, wi)
        if island is not None:
            reservation = Reservation(state, wi, island)
            reservation.hold()
            return reservation
    return None


def _waiting(queue: ClusterQueueQueue) -> list[WorkloadInfo]:
    """A queue's workloads that may be admitted before the others: in a
    StrictFIFO ClusterQueue its head alone (a gang behind a blocked head
    would hold an island it cannot use), otherwise all of them."""
    workloads = queue.all_workloads()
    if workloads and workloads[0].cq is not None and workloads[0].cq.strict:
        head = queue.head()
        return [] if head is None else [head]
    return workloads


def _accelerators(wi: WorkloadInfo, accelerators: Sequence[str]) -> int:
    return sum(ps.totals.get(a, 0) for ps in wi.pod_sets for a in accelerators)


def _island_for(state: CycleState, wi: WorkloadInfo) -> Island | None:
    """The island closest to holding ``wi`` whole whose draining would let its
    quota fit (``None``: no such island)."""
    assignment = assign_flavors(state, wi, physical=False)
    flavors = assignment.pod_set_flavors
    if len(flavors) != len(wi.pod_sets):
        return None
    requests = [state.pod_set_request(wi, i, f) for i, f in enumerate(flavors)]
    if any(r.mode != "required" or r.level is not None for r in requests):
        return None
    cache = state.pristine_cache
    common: dict[int, Island] | None = None
    for request in requests:
        here = {
            seq: island
            for seq, island in request.eligible.items()
            if pristine_capacity_of(island, request.shape, cache) >= request.count
        }
        common = here if common is None else {s: i for s, i in common.items() if s in here}
    closest = sorted(
        (common or {}).values(),
        key=lambda i: (-_pods_now(i, requests), -i.primary_free(), i.seq),
    )
    for island in closest[:_TRIES]:
        if assignment.mode == FIT or _fits_quota_once_drained(state, wi, island):
            return island
    return None


def _fits_quota_once_drained(state: CycleState, wi: WorkloadInfo, island: Island) -> bool:
    """Whether ``wi`` fits its nominal quota, without borrowing, once the gangs
    now running in ``island`` end.

    When the fleet is full its quota is often full too (quotas that add up to
    the fleet); what the island's gangs hold comes back as they end, since the
    island takes nothing new. Not what it would borrow: others may take the
    cohort's unused quota elsewhere meanwhile, and the island would idle."""
    nodes = set(island.nodes)
    holders = [
        info
        for info in sorted(state.admitted.values(), key=lambda a: a.key)
        if any(node in nodes for node, _, _ in info.placements)
    ]
    for info in holders:
        state.simulate_remove(info)
    try:
        drained = assign_flavors(state, wi, physical=False)
        return drained.mode == FIT and not drained.borrow
    finally:
        for info in reversed(holders):
            state.simulate_restore(info)


def _pods_now(island: Island, requests: Sequence[PodSetRequest]) -> int:
    """How many of the gang's pods the island could take now, each pod set alone."""
    total = 0
    for request in requests:
        fitting = sum(pods_fitting(node.free, request.shape) for node in island.nodes)
        total += min(request.count, fitting)
    return total
