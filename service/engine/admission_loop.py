"""The admission loop: heads of ClusterQueues tried in order until none is left.

Each ClusterQueue's head is tried in the cross-ClusterQueue order
(``ordering``); an admitted head lets its ClusterQueue nominate the next one.
A head that a remembered failure covers is rejected without a flavor search
(see ``service.engine.cycle``); a StrictFIFO ClusterQueue whose head does not
fit is blocked for the rest of the cycle.

Reference: kueue ``pkg/scheduler/scheduler.go`` (``schedule``).
"""

from __future__ import annotations

from service.engine.attempt import try_admit
from service.engine.decisions import Decisions
from service.engine.failures import FAILURE_MEMORY, Failure
from service.engine.flavorassigner import NO_FIT, Assignment, assign_flavors, quota_mode_only
from service.engine.ordering import ClusterQueueQueue, FairSelector, PlainSelector
from service.engine.quota import FlavorResource
from service.engine.reservation import Reservation
from service.engine.state import CycleState
from service.engine.workload_info import WorkloadInfo

__all__ = ["AdmissionLoop"]


class AdmissionLoop:
    """Tries the heads of the cycle's ClusterQueue queues, recording decisions."""

    def __init__(
        self,
        state: CycleState,
        queues: dict[str, ClusterQueueQueue],
        decisions: Decisions,
        reservation: Reservation | None = None,
    ) -> None:
        self.state = state
        #: The island held for one gang (``service.engine.reservation``), if any.
        self.reservation = reservation
        self.queues = queues
        self.decisions = decisions
        self.failures: dict[str, list[Failure]] = {}
        self.quota_usage: dict[tuple[str, int], dict[FlavorResource, int]] = {}
        self._limit = state.config.max_heads_per_cluster_queue
        self._last_epoch = 0
        #: ClusterQueue -> the root of its quota tree.
        self._root_of = {name: cq.root for name, cq in state.cqs.items()}

    def _head(self, name: str) -> WorkloadInfo | None:
        """The next workload of a ClusterQueue worth trying, rejecting known misfits."""
        queue = self.queues.get(name)
        if queue is None or queue.blocked_by is not None:
            return None
        limit = self._limit
        if limit is not None and queue.attempted >= limit:
            return None
        if queue.verified is not None:
            return queue.verified
        failures = self.failures.get(name)
        while True:
            if limit is not None and queue.attempted >= limit:
                return None
            wi = queue.head()
            if wi is None:
                return None
            reserved = self.reservation is not None and self.reservation.gang is wi
            # Others' failures were judged without the reserved island's room.
            failure = self._known_failure(wi, failures) if failures and not reserved else None
            if failure is None:
                # Only this queue's own failed attempt adds to its failure memory,
                # and that attempt moves the head on: the verdict stays valid.
                queue.verified = wi
                return wi
            queue.attempted += 1
            wi.why = failure
            queue.advance()
            if wi.cq is not None and wi.cq.strict:
                queue.blocked_by = wi
                return None

    def _known_failure(self, wi: WorkloadInfo, failures: list[Failure]) -> Failure | None:
        """The first remembered failure of the queue that covers ``wi``, if any."""
        signature = wi.signature()
        epoch = self.state.epoch
        for failure in failures:
            # Most failures are of other shapes: compare signatures before calling ``covers``.
            if (
                failure.signature is signature or failure.signature == signature
            ) and failure.covers(wi, epoch):
                return failure
        return None

    def _strict(self, wi: WorkloadInfo) -> bool:
        assert wi.cq is not None
        return wi.cq.strict

    def _quota_usage(self, wi: WorkloadInfo) -> tuple[Assignment, dict[FlavorResource, int]]:
        assignment = assign_flavors(self.state, wi, physical=False)
        return assignment, assignment.usage

    def _plain_key(self, name: str, wi: WorkloadInfo) -> tuple[object, ...]:
        mode = quota_mode_only(self.state, wi)
        if mode is None:
            assignment = self._quota_usage(wi)[0]
            mode = (assignment.mode, assignment.borrow)
        borrow = mode[1] if mode[0] != NO_FIT else 1 << 20
        # ``seq`` follows ordering time: ``(time, seq)`` and ``seq`` order alike.
        return (borrow, -wi.priority, wi.seq)

    def _usage_stamp(self, name: str) -> int:
        return self.state.usage_version.get(self._root_of[name], 0)

    def _nominee(self, name: str) -> tuple[WorkloadInfo, dict[FlavorResource, int]] | None:
        wi = self._head(name)
        if wi is None:
            return None
        cache_key = (name, wi.seq)
        usage = self.quota_usage.get(cache_key)
        if usage is None:
            usage = self._quota_usage(wi)[1]
            self.quota_usage[cache_key] = usage
        return wi, usage

    def run(self) -> None:
        """Try heads in order until no ClusterQueue has one left to try."""
        state = self.state
        selector: PlainSelector | FairSelector
        if state.config.fair_sharing.enable:
            selector = FairSelector(state, self._nominee)
        else:
            selector = PlainSelector(self._head, self._plain_key, self._usage_stamp)
        for name in sorted(self.queues):
            selector.update(name)
        while True:
            popped = selector.pop()
            if popped is None:
                break
            name = popped
            queue = self.queues[name]
            wi = self._head(name)
            if wi is None:
                selector.update(name)
                continue
            queue.attempted += 1
            admitted = self._try_admit(wi)
            queue.advance()
            if admitted:
                queue.usage_changed(wi.lq)
            elif self._strict(wi):
                queue.blocked_by = wi
            selector.update(name)
            if admitted and state.epoch != self._last_epoch:
                # Evictions freed capacity: other ClusterQueues' heads may now fit.
                self._last_epoch = state.epoch
                for other in sorted(self.queues):
                    if other != name:
                        selector.update(other)

    def _try_admit(self, wi: WorkloadInfo) -> bool:
        """Try ``wi``; if it does not fit, remember why, for it and for fast rejection."""
        reservation = self.reservation
        if reservation is not None and reservation.holding:
            if reservation.gang is wi:
                return self._try_reserved(wi, reservation)
            if wi.priority > reservation.gang.priority:
                return self._try_above(wi, reservation)
        assignment = try_admit(self.state, wi, self.decisions)
        if assignment is None:
            return True
        self._remember(wi, assignment)
        return False

    def _try_above(self, wi: WorkloadInfo, reservation: Reservation) -> bool:
        """Try a workload of higher priority than the reservation's gang: the
        island is not held from it, and what it leaves is held again."""
        reservation.release()
        assignment = try_admit(self.state, wi, self.decisions)
        reservation.hold()
        if assignment is None:
            return True
        self._remember(wi, assignment)
        return False

    def _try_reserved(self, wi: WorkloadInfo, reservation: Reservation) -> bool:
        """Try the reservation's gang with its island free; hold it again if it waits."""
        reservation.release()
        assignment = try_admit(self.state, wi, self.decisions)
        if assignment is None:
            # What it left of the island is free again: like an eviction, a new
            # epoch, so that no remembered failure rejects what may now fit.
            self.state.epoch += 1
            return True
        reservation.hold()
        self._remember(wi, assignment)
        return False

    def _remember(self, wi: WorkloadInfo, assignment: Assignment) -> None:
        state = self.state
        assert wi.cq is not None
        reason = assignment.reason or "WaitingForQuota"
        memory = self.failures.setdefault(wi.cq.name, [])
        # Victims are only workloads admitted before the cycle, and they only
        # leave with an eviction (a new epoch): none now means none this epoch.
        no_victims = not state.preemptible_in_tree.get(wi.cq.root)
        failure = Failure(wi, reason, assignment, state.epoch, no_victims)
        wi.why = failure
        memory.append(failure)
        if len(memory) > FAILURE_MEMORY:
            del memory[0]
