"""When a workload is done, and how it ended: what ``submit --wait`` and
``Client.wait`` decide by.

The workers set ``status.state`` (Pending, Admitted, Running, Finished,
Cancelling, Cancelled) and, on Finished, a ``Finished`` condition whose reason
says Succeeded or Failed. A preempted gang goes back to Pending and waits
again; it is preempted *for good* only when it was also deactivated
(``spec.active: false``), as Kueue deactivates a workload that exceeded its
requeueing limit.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from quartermaster_client.models import Workload


class Outcome(StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PREEMPTED = "Preempted"
    CANCELLED = "Cancelled"


_GONE_FOR_GOOD = ("Preempted", "Evicted", "Deactivated")


def outcome(workload: Workload) -> Outcome | None:
    """How the workload ended, or None while it may still run."""
    status = workload.status
    state = status.state
    if state in ("Succeeded", "Failed"):
        return Outcome(state)
    if state == "Finished":
        finished = status.condition("Finished")
        reason = (finished.reason or "") if finished else ""
        if reason == "Succeeded":
            return Outcome.SUCCEEDED
        if any(word in reason for word in _GONE_FOR_GOOD):
            return Outcome.PREEMPTED
        return Outcome.FAILED
    if state == "Cancelled":
        return Outcome.CANCELLED
    if state in _GONE_FOR_GOOD:
        if state == "Deactivated" or workload.spec.active is False:
            return Outcome.PREEMPTED
        return None
    if workload.spec.active is False and state not in ("Admitted", "Running", "Cancelling"):
        evicted = status.condition("Evicted") or status.condition("Preempted")
        if evicted is not None and evicted.status == "True":
            return Outcome.PREEMPTED
    return None


def waiting_for(spec: str) -> Callable[[Workload], bool]:
    """The predicate of ``qmctl wait --for``: ``state=Running`` (or several,
    ``state=Admitted,Running``), or ``condition=PodsReady`` (its status True),
    or ``condition=QuotaReserved=false`` (that status), as ``kubectl wait
    --for`` reads them, or ``replicas=N`` (a serving
    workload with exactly N replicas admitted). ValueError for anything else."""
    what, _, value = spec.partition("=")
    wanted = {v.strip() for v in value.split(",") if v.strip()}
    if what == "state" and wanted:
        return lambda workload: workload.status.state in wanted
    if what == "replicas" and value.strip().isdigit():
        count = int(value)
        return lambda workload: len(workload.status.replica_admissions) == count
    if what == "condition" and len(wanted) == 1:
        # kubectl's form: condition=Ready, or condition=Ready=false.
        kind, _, asked = value.strip().partition("=")
        status = (asked or "True").capitalize()
        if status not in ("True", "False"):
            raise ValueError(f"{spec!r}: a condition's status is true or false")

        def met(workload: Workload) -> bool:
            condition = workload.status.condition(kind)
            return condition is not None and condition.status == status

        return met
    raise ValueError(f"{spec!r} is not state=STATE[,STATE...], condition=TYPE or replicas=N")


__all__ = ["Outcome", "outcome", "waiting_for"]
