"""Replicas of a serving workload as preemption victims: the floor and the order.

Each replica of a serving workload is a unit (``Workload.replica``), admitted
and preempted as its own gang. Two rules hold whatever the preemption
(classical, reclaim, fair sharing; docs/serving.md):

* the floor: no unit is taken when its workload would be left with fewer
  admitted units than ``min_replicas``;
* the order: units are taken one at a time, newest first (latest admitted,
  then highest index). Wherever the search meets a unit of a workload it
  takes that workload's newest unit not yet taken, and the put-back pass
  never restores a unit while an older one of its workload stays a victim.

Kueue has no floor: its LeaderWorkerSet groups are independent Workloads and
a reclaim may take them all (kueue#1603 asks for isolation of serving).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from service.engine.workload_info import AdmittedInfo

__all__ = ["ReplicaGuard"]


def _age(info: AdmittedInfo) -> tuple[float, int]:
    """Larger is newer."""
    return info.admitted_at, info.wl.replica or 0


class ReplicaGuard:
    """Units per serving workload as one preemption search sees them."""

    def __init__(self, units: Mapping[str, Mapping[str, AdmittedInfo]]) -> None:
        #: Workload key -> its admitted units (fresh ones included: they count
        #: towards the floor, though only older ones may be taken).
        self._units = units
        self._sorted: dict[str, list[AdmittedInfo]] = {}
        #: ClusterQueues of the units the floor kept from the search: what a
        #: preemptor that found no plan is told (without naming workloads).
        self.floored: set[str] = set()

    def units(self, parent: str) -> list[AdmittedInfo]:
        """The workload's admitted units, newest first."""
        found = self._sorted.get(parent)
        if found is None:
            found = sorted(self._units.get(parent, {}).values(), key=_age, reverse=True)
            self._sorted[parent] = found
        return found

    def order(
        self, candidates: Iterator[tuple[AdmittedInfo, str]]
    ) -> Iterator[tuple[AdmittedInfo, str]]:
        """``candidates`` with each unit replaced by its workload's newest
        unit not yet taken, and none taken below the floor."""
        if not self._units:
            yield from candidates
            return
        taken: dict[str, int] = {}
        for candidate, reason in candidates:
            parent = candidate.wl.replica_of
            if parent is None:
                yield candidate, reason
                continue
            unit = self._next(parent, taken.get(parent, 0), candidate)
            if unit is not None:
                taken[parent] = taken.get(parent, 0) + 1
                yield unit, reason

    def _next(self, parent: str, taken: int, candidate: AdmittedInfo) -> AdmittedInfo | None:
        units = self.units(parent)
        if len(units) - taken <= candidate.wl.min_replicas:
            if candidate.cq is not None:
                self.floored.add(candidate.cq.name)
            return None
        # The newest not yet taken that may be taken at all (admitted before this cycle).
        takeable = [u for u in units if not u.fresh]
        return takeable[taken] if taken < len(takeable) else None

    def may_restore(self, victim: AdmittedInfo, victims: Sequence[AdmittedInfo]) -> bool:
        """Whether the put-back pass may restore ``victim`` while ``victims``
        stay: not while an older unit of its workload is one of them."""
        parent = victim.wl.replica_of
        if parent is None:
            return True
        age = _age(victim)
        return not any(
            v is not victim and v.wl.replica_of == parent and _age(v) < age for v in victims
        )
