"""The flavor assigner's result: flavors, usage, mode, the why-not message parts.

Messages are kept as parts (quota notes are formatted only when a message is
asked for, which most never are).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from service.domain.quantity import format_amount
from service.engine.flavorassigner.modes import FIT, most_severe
from service.engine.packing import GangPlacement
from service.engine.quota import FlavorResource
from service.engine.types import Fragmentation
from service.engine.workload_info import WorkloadInfo

__all__ = ["Assignment", "Notes", "Oracle", "PreemptionPlan", "QuotaNote", "render_quota_note"]


@dataclass(slots=True)
class PreemptionPlan:
    """Victims (with reasons) whose eviction lets the workload in, and where it lands."""

    victims: list[tuple[object, str]]
    placement: GangPlacement
    #: Borrowing level once the victims are gone (Kueue's ``borrowAfterPreemptions``).
    borrow: int = 0


@dataclass(slots=True)
class Assignment:
    pod_set_flavors: list[dict[str, str]] = field(default_factory=list)
    usage: dict[FlavorResource, int] = field(default_factory=dict)
    mode: int = FIT
    borrow: int = 0
    frs_need_preemption: set[FlavorResource] = field(default_factory=set)
    reason: str = ""
    #: Parts of the why-not message, rendered only when asked for (most never are).
    messages: list[str | tuple[str, Notes]] = field(default_factory=list)
    placement: GangPlacement | None = None
    plan: PreemptionPlan | None = None
    #: Set when the chosen flavor fits quota and the free total but no island
    #: has room now (``service.engine.fragmentation``).
    fragmentation: Fragmentation | None = None

    def message(self) -> str:
        return "; ".join(
            m if isinstance(m, str) else f"{m[0]}: " + "; ".join(m[1].render())
            for m in self.messages
        )


#: ``oracle(workload, assignment so far) -> plan or None``, for the preemption search.
#: Victims are workloads admitted before the cycle: where the quota tree holds none
#: (``CycleState.preemptible_in_tree``) an oracle finds no plan, and is not asked.
Oracle = Callable[[WorkloadInfo, "Assignment"], PreemptionPlan | None]


#: A quota note, formatted only when a message is needed:
#: ``(fr, request, maximum)`` for ExceedsMaxQuota, ``(fr, missing, None)`` otherwise.
QuotaNote = tuple[FlavorResource, int, int | None]


def render_quota_note(note: QuotaNote) -> str:
    (flavor, resource), amount, maximum = note
    if maximum is not None:
        return (
            f"insufficient quota for {resource} in flavor {flavor}, request "
            f"({format_amount(resource, amount)}) > maximum capacity "
            f"({format_amount(resource, maximum)})"
        )
    return (
        f"insufficient unused quota for {resource} in flavor {flavor}, "
        f"{format_amount(resource, amount)} more needed"
    )


@dataclass(slots=True)
class Notes:
    """Why flavors were rejected or are imperfect, for the pending message."""

    attempts: list[str | QuotaNote] = field(default_factory=list)
    worst: str = ""

    def add(self, message: str | QuotaNote, reason: str) -> None:
        self.attempts.append(message)
        self.worst = most_severe(self.worst, reason)

    def render(self) -> list[str]:
        return [a if isinstance(a, str) else render_quota_note(a) for a in self.attempts]
