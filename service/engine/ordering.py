"""Queue order: within a ClusterQueue, and across ClusterQueues.

Within a ClusterQueue, workloads come by their LocalQueue's admission
fair-sharing usage (lowest first; 0 for all when it is off), then priority
(highest first), then queue-ordering time (oldest first). Each LocalQueue is a
sorted list; a small heap merges their heads, and an admission that raises a
LocalQueue's usage re-keys only that queue.

Across ClusterQueues, without fair sharing, heads are taken in Kueue's entry
order: not borrowing before borrowing (by borrowing level), then priority, then
time. With fair sharing, a tournament up the cohort tree picks, at every
cohort, the child whose dominant resource share after admitting its nominee is
lowest (then priority, then time), as Kueue's ``fair_sharing_iterator.go``.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable

from service.engine.fair_sharing import Share, dominant_resource_share
from service.engine.quota import FlavorResource, QuotaNode
from service.engine.state import CycleState
from service.engine.workload_info import WorkloadInfo

__all__ = ["ClusterQueueQueue", "FairSelector", "PlainSelector", "queue_key"]


def queue_key(wi: WorkloadInfo) -> tuple[int, float, int]:
    return (-wi.priority, wi.time, wi.seq)


_PRIORITY = operator.attrgetter("priority")


class ClusterQueueQueue:
    """The pending workloads of one ClusterQueue, in admission order.

    ``local_queues`` maps each LocalQueue to its workloads in ``seq`` order
    (see ``Queueing.classify``); the queue keeps and sorts those lists.
    """

    __slots__ = (
        "_at",
        "_heap",
        "_lqs",
        "_only",
        "_pos",
        "_usage",
        "_usage_of",
        "_version",
        "attempted",
        "blocked_by",
        "name",
        "verified",
    )

    def __init__(
        self,
        name: str,
        local_queues: dict[str, list[WorkloadInfo]],
        usage: Callable[[str], float],
    ):
        self.name = name
        self._usage = usage
        self._lqs = local_queues
        for items in self._lqs.values():
            # ``workloads`` come in ``seq`` order, which sorts by ordering time first:
            # a stable sort by priority alone gives ``queue_key`` order.
            items.sort(key=_PRIORITY, reverse=True)
        self._pos = dict.fromkeys(self._lqs, 0)
        #: Each LocalQueue's admission fair-sharing value, until its usage changes.
        self._usage_of = {lq: usage(lq) for lq in self._lqs}
        self._version = dict.fromkeys(self._lqs, 0)
        self._heap: list[tuple[float, int, float, int, int, str]] = []
        #: With a single LocalQueue its list is the order: no heap to keep.
        self._only = next(iter(self._lqs.values())) if len(self._lqs) == 1 else None
        self._at = 0
        if self._only is None:
            for lq in sorted(self._lqs):
                self._push(lq)
        self.attempted = 0
        self.blocked_by: WorkloadInfo | None = None
        #: The head once the cycle found it worth trying; ``None`` again when the head moves.
        self.verified: WorkloadInfo | None = None

    def _push(self, lq: str) -> None:
        items = self._lqs[lq]
        position = self._pos[lq]
        if position >= len(items):
            return
        wi = items[position]
        heapq.heappush(
            self._heap,
            (self._usage_of[lq], -wi.priority, wi.time, wi.seq, self._version[lq], lq),
        )

    def head(self) -> WorkloadInfo | None:
        only = self._only
        if only is not None:
            return only[self._at] if self._at < len(only) else None
        heap = self._heap
        while heap:
            _, _, _, seq, version, lq = heap[0]
            items = self._lqs[lq]
            position = self._pos[lq]
            if (
                version == self._version[lq]
                and position < len(items)
                and items[position].seq == seq
            ):
                return items[position]
            heapq.heappop(heap)
        return None

    def advance(self) -> None:
        """Drop the current head (admitted, or given up on for this cycle)."""
        self.verified = None
        if self._only is not None:
            self._at += 1
            return
        wi = self.head()
        if wi is None:
            return
        heapq.heappop(self._heap)
        self._pos[wi.lq] += 1
        self._version[wi.lq] += 1
        self._push(wi.lq)

    def usage_changed(self, lq: str) -> None:
        if lq in self._lqs and self._only is None:
            self.verified = None  # another LocalQueue's head may come first now
            self._usage_of[lq] = self._usage(lq)
            self._version[lq] += 1
            self._push(lq)

    def in_queue_order(self) -> bool:
        """Whether :meth:`all_workloads` lists them in queue order (one LocalQueue)."""
        return self._only is not None

    def all_workloads(self) -> list[WorkloadInfo]:
        """Every workload of the queue (with one LocalQueue, its own list: do not change it)."""
        if self._only is not None:
            return self._only
        return [wi for items in self._lqs.values() for wi in items]

    def remaining(self) -> list[WorkloadInfo]:
        if self._only is not None:
            return self._only[self._at :]
        result: list[WorkloadInfo] = []
        for lq, items in self._lqs.items():
            result.extend(items[self._pos[lq] :])
        return result


class PlainSelector:
    """Kueue's classical entry order across ClusterQueues, keyed lazily.

    The key of a head is ``(borrowing level, -priority, seq)`` (``seq`` follows
    the ordering time, so this is Kueue's ``(borrowing, priority, time)``); the
    borrowing level needs a quota check against current usage. A new head
    enters the heap with level 0, a lower bound, and its true key is computed
    when it reaches the top (the admission attempt that follows reuses that
    check); if it then sorts later, it goes back in. Within a cycle usage only
    grows (until an eviction, after which every head is re-keyed), so keys only
    grow: a key is recomputed only when usage in the ClusterQueue's quota tree
    changed since it was computed (``stamp``).
    """

    def __init__(
        self,
        head: Callable[[str], WorkloadInfo | None],
        key: Callable[[str, WorkloadInfo], tuple[object, ...]],
        stamp: Callable[[str], int],
    ) -> None:
        self._head = head
        self._key = key
        self._stamp = stamp
        #: ``(*key, version, cq)``: flat tuples compare faster than nested ones.
        self._heap: list[tuple[object, ...]] = []
        self._version: dict[str, int] = {}
        #: cq -> usage stamp its heap key was computed at.
        self._stamps: dict[str, int] = {}

    def update(self, cq: str) -> None:
        version = self._version.get(cq, 0) + 1
        self._version[cq] = version
        self._stamps.pop(cq, None)
        wi = self._head(cq)
        if wi is not None:
            heapq.heappush(self._heap, (0, -wi.priority, wi.seq, version, cq))

    def pop(self) -> str | None:
        heap = self._heap
        versions = self._version
        while heap:
            entry = heapq.heappop(heap)
            cq = entry[4]
            assert isinstance(cq, str)
            if entry[3] != versions.get(cq):
                continue
            stamp = self._stamp(cq)
            if self._stamps.get(cq) == stamp:
                return cq
            wi = self._head(cq)
            if wi is None:
                continue
            self._stamps[cq] = stamp
            fresh = self._key(cq, wi)
            # ``fresh > heap[0]`` compares the top's key first: as ``fresh > heap[0][:3]``.
            if heap and fresh > heap[0] and fresh != entry[:3]:
                heapq.heappush(heap, (*fresh, entry[3], cq))
                continue
            return cq
        return None


class FairSelector:
    """The fair-sharing tournament, kept incrementally along the changed path."""

    def __init__(
        self,
        state: CycleState,
        nominee: Callable[[str], tuple[WorkloadInfo, dict[FlavorResource, int]] | None],
    ) -> None:
        self._state = state
        self._nominee = nominee
        # For every cohort: child name -> (key, winning CQ name).
        self._entries: dict[str, dict[str, tuple[tuple[object, ...], str]]] = {}
        self._winner: dict[str, tuple[tuple[object, ...], str] | None] = {}
        self._heap: list[tuple[tuple[object, ...], int, str]] = []
        self._version: dict[str, int] = {}
        self._root_winner: dict[str, str] = {}

    def _share_with(
        self, node: QuotaNode, cq_node: QuotaNode, usage: dict[FlavorResource, int]
    ) -> tuple[bool, Share]:
        """Whether ``node``'s subtree would borrow on the flavors ``usage``
        asks for, and its DRS, once the nominee's ``usage`` is added."""
        if node is cq_node:
            borrowing = any(node.borrowing_with(fr, value) for fr, value in usage.items())
            return borrowing, dominant_resource_share(node, self._state.lendable_cache, usage)
        cq_node.add(usage)
        try:
            borrowing = any(node.borrowing(fr) for fr in usage)
            return borrowing, dominant_resource_share(node, self._state.lendable_cache)
        finally:
            cq_node.remove(usage)

    def update(self, cq: str) -> None:
        state = self._state
        node = state.cqs[cq].node
        nominee = self._nominee(cq)
        winner: tuple[tuple[object, ...], str] | None = None
        if nominee is not None:
            wi, _ = nominee
            winner = ((-wi.priority, wi.time, wi.seq), cq)
        child: QuotaNode = node
        while child.parent is not None:
            parent = child.parent
            entries = self._entries.setdefault(parent.name, {})
            if winner is None:
                entries.pop(child.name, None)
            else:
                cq_name = winner[1]
                winning = self._nominee(cq_name)
                assert winning is not None
                wi, usage = winning
                borrowing, share = self._share_with(child, state.cqs[cq_name].node, usage)
                if not self._state.config.fair_sharing.prioritize_non_borrowing:
                    borrowing = False
                entries[child.name] = ((borrowing, share, -wi.priority, wi.time, wi.seq), cq_name)
            winner = min(entries.values()) if entries else None
            self._winner[parent.name] = winner
            child = parent
        root = child.name
        version = self._version.get(root, 0) + 1
        self._version[root] = version
        if winner is not None:
            wi_entry = self._nominee(winner[1])
            assert wi_entry is not None
            wi = wi_entry[0]
            heapq.heappush(self._heap, ((-wi.priority, wi.time, wi.seq), version, root))
            self._root_winner[root] = winner[1]

    def pop(self) -> str | None:
        heap = self._heap
        while heap:
            _, version, root = heapq.heappop(heap)
            if version != self._version.get(root):
                continue
            return self._root_winner.get(root)
        return None
