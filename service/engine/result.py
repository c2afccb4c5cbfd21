"""The cycle's result: its decisions, and why each workload left waiting waits.

Every workload not admitted gets a :class:`PendingReason`: why it cannot
queue, why its queue holds it back, the failure that explains it, or, for a
gang that can never fit, its feasibility verdict (the true cause); queued ones
also get their positions in queue order after the cycle.
"""

from __future__ import annotations

from service.engine.decisions import Decisions
from service.engine.failures import Failure
from service.engine.feasibility import Verdict, never_fits
from service.engine.fragmentation import FRAGMENTED_ACROSS_ISLANDS
from service.engine.queueing import Queueing
from service.engine.state import CycleState
from service.engine.types import CycleResult, Fragmentation, PendingReason
from service.engine.workload_info import WorkloadInfo, selector_key

__all__ = ["build_result"]

#: Why a queue holds a workload back before trying it: told before any verdict.
_HELD_REASONS = frozenset(
    {"ClusterQueueStopped", "LocalQueueStopped", "RequeueBackoff", "NoMatchingCluster"}
)


def build_result(state: CycleState, queueing: Queueing, decisions: Decisions) -> CycleResult:
    """The cycle's :class:`CycleResult`, once the admission loop is done."""
    return _WhyNot(state, queueing).result(decisions)


class _WhyNot:
    """Why each workload left waiting waits, with its positions."""

    def __init__(self, state: CycleState, queueing: Queueing) -> None:
        self.state = state
        self.queues = queueing.queues
        self.held = queueing.held
        self.pending = queueing.pending
        #: ``(ClusterQueue, gang shape, cluster selector)`` -> its feasibility verdict.
        self._verdicts: dict[tuple[str, object, object], Verdict | None] = {}

    def result(self, decisions: Decisions) -> CycleResult:
        """The decisions, and a pending reason for every workload left waiting."""
        state = self.state
        admitted = {d.workload for d in decisions.admissions}
        self._pend_unconsidered(admitted)
        reasons = self._queued_reasons()
        for key, entry in self.pending.items():
            # Failures are all of queued workloads: this is a reason tuple.
            assert not isinstance(entry, Failure)
            reason, message, cq, lq = entry
            reasons[key] = PendingReason(key, reason, _text(message), cq, lq)
        return CycleResult(
            admissions=tuple(decisions.admissions),
            preemptions=tuple(decisions.preemptions),
            evictions=tuple(decisions.evictions),
            pending={key: reasons[key] for key in sorted(reasons)},
            local_queue_usage=dict(sorted(state.sampled_usage.items())),
            preemption_budgets=state.protection.states(),
        )

    def _pend_unconsidered(self, admitted: set[str]) -> None:
        """Workloads the loop never reached: behind a StrictFIFO blocker, or past the head limit."""
        for name, queue in self.queues.items():
            for wi in queue.remaining():
                if wi.why is not None or wi.key in admitted:
                    continue
                if queue.blocked_by is not None:
                    wi.why = (
                        "StrictFIFO",
                        f"Waiting behind {queue.blocked_by.key} "
                        f"in the StrictFIFO ClusterQueue {name}",
                        name,
                        wi.lq,
                    )
                else:
                    wi.why = (
                        "Pending",
                        "Not considered in this cycle (one head per ClusterQueue)",
                        name,
                        wi.lq,
                    )

    def _queued_reasons(self) -> dict[str, PendingReason]:
        """Why each queued workload waits, with its positions in queue order after this cycle.

        Every queued workload that was not admitted knows why it waits
        (``_pend_unconsidered`` ran): one that does not is admitted, and skipped.
        """
        state = self.state
        usage: dict[str, float] | None = None
        reasons: dict[str, PendingReason] = {}
        held_only = [name for name in self.held if name not in self.queues]
        for name in [*self.queues, *held_only]:
            queue = self.queues.get(name)
            held = self.held.get(name)
            items = queue.all_workloads() if queue is not None else []
            behind = queue.blocked_by.key if queue is not None and queue.blocked_by else None
            if held is None and queue is not None and queue.in_queue_order():
                # One LocalQueue: the position in it is the position in the ClusterQueue.
                position = 0
                for wi in items:
                    entry = wi.why
                    if entry is None:
                        continue
                    if type(entry) is Failure:  # ``_reason_of``, inlined for the common case
                        reason, text = entry.reason, entry.message or entry.text()
                    else:
                        reason, text = _reason_of(entry)
                    key = wi.key
                    reasons[key] = self._reason(
                        wi, reason, text, name, position, position, behind, _fragmentation(wi)
                    )
                    position += 1
                continue
            waiting = [w for w in items if w.why is not None]
            if held is not None:
                waiting.extend(held)
            if usage is None:
                usage = {lq: state.lq_usage(lq) for lq in state.lq_consumed}
            lq_usage = usage
            waiting.sort(key=lambda w: (lq_usage.get(w.lq, 0.0), -w.priority, w.time, w.seq))
            per_lq: dict[str, int] = {}
            for position, wi in enumerate(waiting):
                lq_position = per_lq.get(wi.lq, 0)
                per_lq[wi.lq] = lq_position + 1
                reason, text = _reason_of(wi.why)
                reasons[wi.key] = self._reason(
                    wi, reason, text, name, position, lq_position, behind, _fragmentation(wi)
                )
        return reasons

    def _reason(
        self,
        wi: WorkloadInfo,
        reason: str,
        text: str,
        cq: str,
        position: int,
        lq_position: int,
        behind: str | None,
        fragmentation: Fragmentation | None = None,
    ) -> PendingReason:
        """A queued workload's pending reason; a gang that can never fit gets its
        verdict instead (the true cause, never "N more needed"), unless the queue
        holds it back for a reason of its own (stopped, backing off, no cluster);
        one held back by fragmentation alone gets that cause and its numbers."""
        verdict = None if reason in _HELD_REASONS else self._verdict(wi)
        if verdict is not None:
            return PendingReason(
                wi.key,
                verdict.reason,
                verdict.message,
                cq,
                wi.lq,
                position,
                lq_position,
                inadmissible=True,
                cause=verdict.cause,
            )
        behind = behind if reason == "StrictFIFO" else None
        return PendingReason(
            wi.key,
            reason,
            text,
            cq,
            wi.lq,
            position,
            lq_position,
            waiting_behind=behind,
            cause=FRAGMENTED_ACROSS_ISLANDS if fragmentation is not None else None,
            fragmentation=fragmentation,
        )

    def _verdict(self, wi: WorkloadInfo) -> Verdict | None:
        """``never_fits``, once per ClusterQueue, gang shape and cluster selector."""
        assert wi.cq is not None
        selector = wi.wl.cluster_selector
        key = (wi.cq.name, wi.shape, None if selector is None else selector_key(selector))
        try:
            return self._verdicts[key]
        except KeyError:
            verdict = self._verdicts[key] = never_fits(self.state, wi)
            return verdict


def _fragmentation(wi: WorkloadInfo) -> Fragmentation | None:
    """The fragmentation that alone holds ``wi`` back, if its failure found one."""
    entry = wi.why
    return entry.fragmentation_of(wi) if type(entry) is Failure else None


def _reason_of(entry: object) -> tuple[str, str]:
    """``(reason, message)`` of a pending entry (``Entry``)."""
    if type(entry) is Failure:
        return entry.reason, entry.message or entry.text()
    assert isinstance(entry, tuple)
    reason, message = entry[0], entry[1]
    assert isinstance(reason, str) and isinstance(message, str | Failure)
    return reason, _text(message)


def _text(message: str | Failure) -> str:
    return message if isinstance(message, str) else message.text()
