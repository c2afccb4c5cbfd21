"""Protection of running gangs from preemption: a minimum runtime and a budget.

Per ClusterQueue (``spec.preemption.protection`` and ``spec.preemption.budget``,
issue 24), for the gangs *of* that ClusterQueue, as victims:

* ``minRuntimeSeconds``: a gang admitted less than this long ago is not a
  candidate for a *protected* preemption — borrowing reclaim beyond nominal
  (the preemptor would borrow once admitted), fair sharing, consolidation.
  Priority within the ClusterQueue and a lender's reclaim of its nominal quota
  stay immediate, unless ``reclaimNominal: Protected``. KAI's
  ``minRuntime`` and Armada's protected fraction of fair share do the same
  job; Kueue's KEP-9876 is still open.
* ``budget``: a token bucket of ``preemptions`` tokens, refilled at
  ``preemptions`` per ``periodSeconds``; each protected preemption of one of
  its gangs takes a whole token, and a plan whose victims it cannot pay for is
  not issued (Armada's ``FairsharePreemptionRateLimit`` is a global bucket of
  the same shape).

The engine is pure: the buckets come in as :attr:`Snapshot.preemption_budgets`
(absent: full) and go out, refilled to ``now`` and charged, as
:attr:`CycleResult.preemption_budgets`. :func:`budgets_from_history` folds the
protected preemptions of the ledger into the same states, so a scheduler that
restarts derives them from what it recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

from service.domain.quota import ClusterQueue, PreemptionBudget, PreemptionPolicy
from service.engine.types import PreemptionBudgetState

__all__ = [
    "CONSOLIDATION",
    "Protection",
    "budgets_from_history",
    "is_protected",
    "preemptor_borrows",
    "refilled",
]

#: The preemption reason of a consolidation move (``service.engine.consolidation``).
CONSOLIDATION = "Consolidation"

_ALWAYS_PROTECTED = frozenset(
    {"InCohortReclaimWhileBorrowing", "InCohortFairSharing", CONSOLIDATION}
)


class Victim(Protocol):
    """What protection reads of a candidate (an ``AdmittedInfo``)."""

    @property
    def cq_name(self) -> str: ...
    @property
    def admitted_at(self) -> float: ...


_V = TypeVar("_V", bound=Victim)


class _QuotaNode(Protocol):
    def borrowing_with(self, fr: tuple[str, str], value: int) -> bool: ...


class _Preemptor(Protocol):
    @property
    def node(self) -> _QuotaNode: ...


def preemptor_borrows(cq: _Preemptor, usage: Mapping[tuple[str, str], int]) -> bool:
    """Whether the preemptor's ClusterQueue borrows once ``usage`` is added: its
    reclaim then takes more than its nominal quota back, and is protected."""
    node = cq.node
    return any(node.borrowing_with(fr, value) for fr, value in usage.items())


def is_protected(policy: PreemptionPolicy, reason: str, preemptor_borrows: bool) -> bool:
    """Whether a preemption for ``reason`` of a gang with ``policy`` is protected."""
    if reason in _ALWAYS_PROTECTED:
        return True
    if reason == "InCohortReclamation":
        return preemptor_borrows or policy.protection.reclaim_nominal == "Protected"
    return False


def refilled(
    budget: PreemptionBudget, state: PreemptionBudgetState | None, now: float
) -> PreemptionBudgetState:
    """The bucket at ``now``: full when never charged, else refilled since its update."""
    size = float(budget.preemptions)
    if state is None:
        return PreemptionBudgetState(tokens=size, last_update=now)
    elapsed = max(0.0, now - state.last_update)
    tokens = min(size, state.tokens + elapsed * size / budget.period_seconds)
    return PreemptionBudgetState(tokens=tokens, last_update=max(now, state.last_update))


def budgets_from_history(
    cluster_queues: Sequence[ClusterQueue], charges: Iterable[tuple[str, float]]
) -> dict[str, PreemptionBudgetState]:
    """The buckets after ``charges`` — ``(ClusterQueue, time)`` of every protected
    preemption, in time order (the ledger's ``workload.preempted`` entries with
    ``budgeted`` set) — for the ClusterQueues that have a budget now."""
    budgets = {cq.name: cq.preemption.budget for cq in cluster_queues}
    states: dict[str, PreemptionBudgetState] = {}
    for name, at in charges:
        budget = budgets.get(name)
        if budget is None:
            continue
        state = refilled(budget, states.get(name), at)
        states[name] = PreemptionBudgetState(state.tokens - 1.0, state.last_update)
    return states


class Protection:
    """The cycle's view of every ClusterQueue's protection, and its buckets."""

    def __init__(
        self,
        cluster_queues: Sequence[ClusterQueue],
        budgets: Mapping[str, PreemptionBudgetState],
        now: float,
    ) -> None:
        self.now = now
        self._policies = {cq.name: cq.preemption for cq in cluster_queues}
        self._buckets = {
            cq.name: refilled(cq.preemption.budget, budgets.get(cq.name), now)
            for cq in cluster_queues
            if cq.preemption.budget is not None
        }
        #: Off for every ClusterQueue: nothing to filter (the engine as before).
        self.active = bool(self._buckets) or any(
            p.protection.min_runtime_seconds > 0 or p.protection.reclaim_nominal == "Protected"
            for p in self._policies.values()
        )

    def protected(self, victim: Victim, reason: str, preemptor_borrows: bool) -> bool:
        policy = self._policies.get(victim.cq_name)
        return policy is not None and is_protected(policy, reason, preemptor_borrows)

    def allows(self, victim: Victim, reason: str, preemptor_borrows: bool) -> bool:
        """Whether ``victim`` may be preempted for ``reason`` now (one token left)."""
        if not self.active or not self.protected(victim, reason, preemptor_borrows):
            return True
        policy = self._policies[victim.cq_name]
        if self.now - victim.admitted_at < policy.protection.min_runtime_seconds:
            return False
        bucket = self._buckets.get(victim.cq_name)
        return bucket is None or bucket.tokens >= 1.0

    def admissible(
        self, candidates: Iterator[tuple[_V, str]], preemptor_borrows: bool
    ) -> Iterator[tuple[_V, str]]:
        """The candidates that :meth:`allows`, in their order."""
        for victim, reason in candidates:
            if self.allows(victim, reason, preemptor_borrows):
                yield victim, reason

    def affordable(self, victims: Iterable[tuple[Victim, str]], preemptor_borrows: bool) -> bool:
        """Whether every bucket holds a whole token for each of its protected victims."""
        if not self._buckets:
            return True
        needed: dict[str, int] = {}
        for victim, reason in victims:
            if victim.cq_name in self._buckets and self.protected(
                victim, reason, preemptor_borrows
            ):
                needed[victim.cq_name] = needed.get(victim.cq_name, 0) + 1
        return all(self._buckets[name].tokens >= n for name, n in needed.items())

    def charge(self, victim: Victim, reason: str, preemptor_borrows: bool) -> bool:
        """Take a token for a protected preemption of ``victim``; whether it was budgeted."""
        if not self.protected(victim, reason, preemptor_borrows):
            return False
        bucket = self._buckets.get(victim.cq_name)
        if bucket is None:
            return False
        self._buckets[victim.cq_name] = PreemptionBudgetState(bucket.tokens - 1.0, self.now)
        return True

    def states(self) -> dict[str, PreemptionBudgetState]:
        """Every bucket at the end of the cycle, to persist and feed back."""
        return dict(sorted(self._buckets.items()))
