"""Which pending workloads may queue at all, and into which ClusterQueue's queue.

A workload that cannot queue (inactive, no LocalQueue or ClusterQueue, a
namespace or class mismatch) waits with its reason; one that keeps its place
but may not be tried now (a stopped queue, requeue backoff, no matching
cluster) is held. The rest go, per LocalQueue in arrival order, to their
ClusterQueue's queue.

Reference: kueue ``pkg/queue/manager.go`` and ``pkg/queue/cluster_queue.go``.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator

from service.domain.quota import LocalQueue
from service.domain.workload import Workload
from service.engine.failures import Entry, Failure
from service.engine.ordering import ClusterQueueQueue
from service.engine.state import CQState, CycleState
from service.engine.workload_info import WorkloadInfo, selector_key

__all__ = ["Queueing"]


class Queueing:
    """The cycle's ClusterQueue queues, and the workloads that wait outside them."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self.now = state.now
        #: Workloads that cannot queue at all: key -> (reason, message, None, LocalQueue).
        #: A queued (or held) workload keeps why it waits on itself (``WorkloadInfo.why``):
        #: such a tuple with its ClusterQueue, or the failure that explains it.
        self.pending: dict[str, Entry] = {}
        self.queues: dict[str, ClusterQueueQueue] = {}
        #: Workloads that keep their place in a ClusterQueue but may not be tried now.
        self.held: dict[str, list[WorkloadInfo]] = {}
        self._queueing_cache: dict[object, tuple[str, str, bool] | None] = {}
        #: LocalQueue key -> (that key, shared by its workloads; its ClusterQueue, if both exist).
        self._routes: dict[str, tuple[str, CQState | None]] = {}

    def classify(self, pending: list[Workload]) -> None:
        """Sort the pending workloads into ClusterQueues, or give each a reason it cannot queue.

        Everything about one workload is derived in input order (reading the
        workloads in memory order); only ``seq`` waits for the arrival order.
        """
        state = self.state
        infos = [self._prepare(wl) for wl in pending]
        problems = [self._queueing_problem(wi) for wi in infos]
        keys = [wi.key for wi in infos]
        order = _arrival_order(keys, [wi.time for wi in infos])
        distinct = set(keys)
        if len(distinct) == len(keys) and distinct.isdisjoint(state.admitted):
            arrivals: Iterable[tuple[int, int]] = enumerate(order)
        else:
            arrivals = _first_arrivals(order, keys, state.admitted)
        by_lq: dict[str, list[WorkloadInfo]] = {}
        for seq, index in arrivals:
            wi = infos[index]
            wi.seq = seq
            problem = problems[index]
            if problem is None:
                queue = by_lq.get(wi.lq)
                if queue is None:
                    queue = by_lq[wi.lq] = []
                queue.append(wi)
                continue
            cq = wi.cq
            reason, message, stays_queued = problem
            if stays_queued and cq is not None:
                self._pend(wi, reason, message, cq.name)
                self.held.setdefault(cq.name, []).append(wi)
            else:
                self._pend(wi, reason, message, None)
        # A LocalQueue's workloads all go to its ClusterQueue.
        by_cq: dict[str, dict[str, list[WorkloadInfo]]] = {}
        for lq, items in by_lq.items():
            cq = items[0].cq
            assert cq is not None
            by_cq.setdefault(cq.name, {})[lq] = items
        for name in sorted(by_cq):
            self.queues[name] = ClusterQueueQueue(name, by_cq[name], state.lq_usage)

    def _prepare(self, wl: Workload) -> WorkloadInfo:
        """The workload's info, with its ClusterQueue; ``seq`` is set once arrivals are sorted."""
        state = self.state
        priority = wl.priority if wl.priority is not None else state.priority_of(wl)
        time = wl.creation_time if wl.queued_at is None else wl.queued_at  # ``ordering_time``
        wi = WorkloadInfo(wl, priority, -1, wl.key, state.gang_shape(wl), time)
        route = self._routes.get(wi.lq)
        if route is None:
            lq = state.local_queues.get(wi.lq)
            cq = state.cqs.get(lq.cluster_queue) if lq is not None else None
            route = self._routes[wi.lq] = (wi.lq, cq)
        # One string per LocalQueue: grouping and lookups by it stay in cache.
        wi.lq, wi.cq = route
        return wi

    def _queueing_problem(self, wi: WorkloadInfo) -> tuple[str, str, bool] | None:
        """``(reason, message, stays queued)`` when the workload cannot be tried now."""
        wl = wi.wl
        cq = wi.cq
        lq = self.state.local_queues.get(wi.lq)
        if not wl.active:
            return "Inactive", "The workload is deactivated", False
        if lq is None:
            return "LocalQueueNotFound", f"LocalQueue {wl.queue_name} doesn't exist", False
        if cq is None:
            return "ClusterQueueNotFound", f"ClusterQueue {lq.cluster_queue} doesn't exist", False
        requeue_at = wl.requeue_state.requeue_at if wl.requeue_state is not None else None
        if requeue_at is not None and requeue_at > self.now:
            return (
                "RequeueBackoff",
                f"Waiting for the requeue backoff to expire at {requeue_at:g}",
                True,
            )
        # The rest depends only on the queue, namespace, class and cluster selector.
        selector = wl.cluster_selector
        key = (wi.lq, wl.workload_class, None if selector is None else selector_key(selector))
        try:
            return self._queueing_cache[key]
        except KeyError:
            problem = self._queueing_cache[key] = self._queue_problem(wl, lq, cq)
            return problem

    def _queue_problem(
        self, wl: Workload, lq: LocalQueue, cq: CQState
    ) -> tuple[str, str, bool] | None:
        state = self.state
        if cq.spec.stop_policy != "None":
            return "ClusterQueueStopped", f"ClusterQueue {cq.name} is stopped", True
        if lq.stop_policy != "None":
            return "LocalQueueStopped", f"LocalQueue {lq.key} is stopped", True
        selector = cq.spec.namespace_selector
        labels = state.namespaces.get(wl.namespace, {})
        if selector is None or not selector.matches(labels):
            return (
                "NamespaceMismatch",
                "Workload namespace doesn't match ClusterQueue selector",
                False,
            )
        if wl.workload_class != cq.spec.workload_class:
            return (
                "WorkloadClassMismatch",
                f"A {wl.workload_class} workload cannot use the {cq.spec.workload_class} "
                f"ClusterQueue {cq.name}",
                False,
            )
        if wl.cluster_selector is not None and not any(
            c.cluster.schedulable and wl.cluster_selector.matches(c.cluster.labels)
            for c in state.inventory.clusters.values()
        ):
            return (
                "NoMatchingCluster",
                "No healthy, uncordoned cluster matches the cluster selector",
                True,
            )
        return None

    def _pend(self, wi: WorkloadInfo, reason: str, message: str | Failure, cq: str | None) -> None:
        if cq is None:
            self.pending[wi.key] = (reason, message, None, wi.lq)
        else:
            wi.why = (reason, message, cq, wi.lq)


def _first_arrivals(
    order: list[int], keys: list[str], admitted: Container[str]
) -> Iterator[tuple[int, int]]:
    """``(seq, index)`` in arrival order, without repeats or workloads already admitted."""
    seen: set[str] = set()
    for seq, index in enumerate(order):
        key = keys[index]
        if key in seen or key in admitted:
            continue
        seen.add(key)
        yield seq, index


def _arrival_order(keys: list[str], times: list[float]) -> list[int]:
    """Indices sorted by ``(time, key, index)``: the ``seq`` order of pending workloads.

    Sorting by time alone (stable, so equal entries keep index order) and then
    re-sorting each run of equal times by key is the same order, at a fraction
    of the cost of sorting tuples.
    """
    order = sorted(range(len(times)), key=times.__getitem__)
    if len(set(times)) == len(times):
        return order  # no equal times: nothing to re-sort
    ordered = [times[i] for i in order]
    start = 0
    for position in range(1, len(ordered) + 1):
        if position < len(ordered) and ordered[position] == ordered[start]:
            continue
        if position - start > 1:
            order[start:position] = sorted(order[start:position], key=lambda i: (keys[i], i))
        start = position
    return order
