"""The best-fit baseline: a quota-free reference policy written inside the replay.

What the engine is measured against when it runs as one queue without quotas
(issue 24). It shares nothing with :mod:`service.engine` but the snapshot it
reads and the decisions it returns, so the replay's bookkeeping and checks are
the same for both:

* **one queue, FIFO with backfill**: pending jobs in the order they were
  queued (submission, or re-queue after an eviction; ties by key); each that
  fits now starts now, even past a head that does not — nothing is reserved
  for the head, as a Kueue ``BestEffortFIFO`` ClusterQueue behaves;
* **no quotas, no preemption, no fair sharing**: only room decides;
* **island-first best fit**: a job goes to the fabric island that holds all
  its pods with the least free GPUs (ties: cluster, then island name), and
  inside it each pod to the node with the least free GPUs that holds it —
  single pods included, so whole islands stay free for gangs;
* **gangs whole in one island**: a job of several pods never spans islands.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from service.domain.inventory import Node
from service.domain.workload import Admission, PodSetAssignment, Workload
from service.engine import AdmissionDecision, CycleResult, Snapshot

__all__ = ["BEST_FIT_QUEUE", "best_fit_cycle"]

BEST_FIT_QUEUE = "best-fit"
GPU = "nvidia.com/gpu"


@dataclass(slots=True)
class _Room:
    """A node's free GPUs, updated as the cycle places pods."""

    free: int
    node: Node


@dataclass(slots=True)
class _Island:
    key: tuple[str, str, str]
    rooms: list[_Room]

    @property
    def free(self) -> int:
        return sum(r.free for r in self.rooms)

    def pods_fitting(self, per_pod: int) -> int:
        return sum(r.free // per_pod for r in self.rooms)


def _free_by_node(snapshot: Snapshot) -> dict[str, int]:
    """Each node's GPUs left after what is reserved and what admitted jobs hold."""
    free = {n.name: n.allocatable.get(GPU, 0) - n.reserved.get(GPU, 0) for n in snapshot.nodes}
    for admitted in snapshot.admitted:
        requests = {ps.name: ps.requests for ps in admitted.workload.pod_sets}
        for assignment in admitted.admission.pod_set_assignments:
            per_pod = requests[assignment.name].get(GPU, 0)
            for node, pods in assignment.placement:
                free[node] = free.get(node, 0) - per_pod * pods
    return free


def _islands(nodes: Sequence[Node], free: dict[str, int]) -> list[_Island]:
    islands: dict[tuple[str, str, str], _Island] = {}
    for node in nodes:
        if node.schedulable:
            key = (node.cluster, node.flavor, node.island)
            island = islands.setdefault(key, _Island(key, []))
            island.rooms.append(_Room(max(0, free[node.name]), node))
    return [islands[k] for k in sorted(islands)]


def _fill(island: _Island, pods: int, per_pod: int) -> list[tuple[_Room, int]] | None:
    """Pods on the island's nodes, the least free node that holds one first."""
    chosen: list[tuple[_Room, int]] = []
    need = pods
    for room in sorted(island.rooms, key=lambda r: (r.free, r.node.name)):
        take = min(room.free // per_pod, need)
        if take > 0:
            chosen.append((room, take))
            need -= take
        if need == 0:
            return chosen
    return None


def _best_island(islands: Iterable[_Island], pods: int, per_pod: int) -> _Island | None:
    """The island holding all ``pods`` with the least free GPUs (ties: first in order)."""
    best: _Island | None = None
    best_free = 0
    for island in islands:
        if island.pods_fitting(per_pod) < pods:
            continue
        free = island.free
        if best is None or free < best_free:
            best, best_free = island, free
    return best


def _admission(workload: Workload, island: _Island, chosen: list[tuple[_Room, int]]) -> Admission:
    pod_set = workload.pod_sets[0]
    cluster, flavor, name = island.key
    assignment = PodSetAssignment(
        name=pod_set.name,
        count=pod_set.count,
        flavors={resource: flavor for resource in pod_set.requests},
        resource_usage=pod_set.total(),
        placement=tuple((room.node.name, pods) for room, pods in chosen),
        islands=(name,),
    )
    return Admission(BEST_FIT_QUEUE, cluster, (assignment,))


def _queue_order(pending: Sequence[Workload]) -> list[Workload]:
    def queued(wl: Workload) -> tuple[float, str]:
        return (wl.creation_time if wl.queued_at is None else wl.queued_at, wl.key)

    return sorted(pending, key=queued)


def best_fit_cycle(snapshot: Snapshot, now: float) -> CycleResult:
    """One cycle of the baseline (module docstring): admit, in queue order, what fits.

    Jobs are the replay's: one pod set, GPUs only (it drops jobs of none). A
    shape (pods, GPUs a pod) that found no island cannot find one later in the
    cycle, so it is not tried again.
    """
    islands = _islands(snapshot.nodes, _free_by_node(snapshot))
    hopeless: set[tuple[int, int]] = set()
    admissions: list[AdmissionDecision] = []
    for workload in _queue_order(snapshot.pending):
        pod_set = workload.pod_sets[0]
        shape = (pod_set.count, pod_set.requests.get(GPU, 0))
        if shape in hopeless:
            continue
        island = _best_island(islands, *shape)
        chosen = None if island is None else _fill(island, *shape)
        if island is None or chosen is None:
            hopeless.add(shape)
            continue
        for room, pods in chosen:
            room.free -= pods * shape[1]
        admission = _admission(workload, island, chosen)
        admissions.append(AdmissionDecision(workload.key, BEST_FIT_QUEUE, admission))
    return CycleResult(admissions=tuple(admissions))
