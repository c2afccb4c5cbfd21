"""Why a workload waits, and the failures each ClusterQueue remembers for fast rejection.

A failed attempt is remembered (``Failure``): a later gang of the same shape
that is at least as big, no higher in priority and no older cannot fit either,
until something is evicted (see ``service.engine.cycle``).
"""

from __future__ import annotations

from service.engine.flavorassigner import WAITING_FOR_CAPACITY, Assignment
from service.engine.types import Fragmentation
from service.engine.workload_info import WorkloadInfo

__all__ = ["FAILURE_MEMORY", "Entry", "Failure"]

#: How many failures each ClusterQueue remembers for fast rejection.
FAILURE_MEMORY = 16


class Failure:
    """A failed attempt of one ClusterQueue: what it covers, and why it failed."""

    __slots__ = (
        "_assignment",
        "epoch",
        "fragmentation",
        "message",
        "no_victims",
        "priority",
        "reason",
        "signature",
        "time",
        "totals",
    )

    def __init__(
        self, wi: WorkloadInfo, reason: str, assignment: Assignment, epoch: int, no_victims: bool
    ) -> None:
        self.signature = wi.signature()
        self.priority = wi.priority
        self.time = wi.time
        self.totals = wi.resources
        self.reason = reason
        self._assignment: Assignment | None = assignment
        #: ``None`` until :meth:`text` renders it.
        self.message: str | None = None
        self.epoch = epoch
        #: Nothing in the quota tree could be preempted: priority and age cannot help.
        self.no_victims = no_victims
        #: Fragmentation alone holds it back: capacity is its only reason.
        self.fragmentation: Fragmentation | None = (
            assignment.fragmentation if reason == WAITING_FOR_CAPACITY else None
        )

    def text(self) -> str:
        """The why-not message, rendered once, when the result is built."""
        message = self.message
        if message is None:
            assert self._assignment is not None
            message = self.message = self._assignment.message() or "insufficient quota"
            self._assignment = None
        return message

    def covers(self, wi: WorkloadInfo, epoch: int) -> bool:
        """Whether ``wi``, of this failure's signature, cannot fit either (see the module)."""
        if self.epoch != epoch:
            return False
        if not self.no_victims and (wi.priority > self.priority or wi.time < self.time):
            return False
        totals = wi.resources
        if totals is self.totals:  # the same gang shape
            return True
        return all(totals.get(r, 0) >= a for r, a in self.totals.items())

    def fragmentation_of(self, wi: WorkloadInfo) -> Fragmentation | None:
        """The failure's fragmentation for ``wi``, which it covers: ``None`` when
        ``wi`` is bigger than the fleet's free total (then not fragmentation alone)."""
        found = self.fragmentation
        if found is None:
            return None
        larger_by = wi.resources.get(found.resource, 0) - self.totals.get(found.resource, 0)
        return found if found.requested + larger_by <= found.fleet_free else None


#: Why a workload waits: ``(reason, message or the failure that explains it, ClusterQueue,
#: LocalQueue)``, or the failure itself (of the workload's own queues).
Entry = tuple[str, str | Failure, str | None, str] | Failure
