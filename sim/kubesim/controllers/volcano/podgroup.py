"""What a Volcano PodGroup and Queue are to the stand-in: names, phases, conditions.

Volcano's PodGroup CRD has no status subresource (``subresources: {}``), so its
status is written through the object itself, as Volcano's scheduler does. The
condition types, reasons and event reasons are Volcano's
(``volcano.sh/apis`` ``scheduling/v1beta1``; the website's "PodGroup Condition
Reason" page): ``Scheduled`` with reason ``tasks in gang are ready to be
scheduled``, ``Unschedulable`` with ``NotEnoughResources`` / ``NotEnoughPods``,
and ``NotInqueueable`` when the queue's capability keeps a group from entering.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sim.kubesim.api import now_rfc3339
from sim.kubesim.controllers.base import pod_requests

__all__ = [
    "GROUP_ANNOTATION",
    "PODGROUPS",
    "QUEUES",
    "SCHEDULER_NAME",
    "add",
    "fits_within",
    "group_of",
    "min_resources",
    "set_pg_condition",
]

Obj = dict[str, Any]
PODGROUPS = "podgroups.scheduling.volcano.sh"
QUEUES = "queues.scheduling.volcano.sh"
HYPERNODES = "hypernodes.topology.volcano.sh"
VCJOBS = "jobs.batch.volcano.sh"
SCHEDULER_NAME = "volcano"
#: The annotation naming a pod's PodGroup (``scheduling.k8s.io/group-name``).
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
READY_REASON = "tasks in gang are ready to be scheduled"
#: Phases in which a group holds its queue's resources (Volcano's proportion plugin
#: counts ``Inqueue`` groups' ``minResources`` and running groups' allocation;
#: ``Unknown`` is a gang part of which runs while the rest cannot be placed).
HOLDING = ("Inqueue", "Running", "Unknown")


def group_of(pod: Obj) -> str | None:
    """The PodGroup a pod belongs to, when Volcano schedules it."""
    if (pod.get("spec") or {}).get("schedulerName") != SCHEDULER_NAME:
        return None
    return (pod["metadata"].get("annotations") or {}).get(GROUP_ANNOTATION)


def min_resources(group: Obj) -> dict[str, int]:
    """``spec.minResources`` in canonical units (milli-cpu, bytes, units)."""
    resources = (group.get("spec") or {}).get("minResources") or {}
    return pod_requests({"containers": [{"resources": {"requests": resources}}]})


def add(total: dict[str, int], amounts: Mapping[str, int]) -> None:
    for name, amount in amounts.items():
        total[name] = total.get(name, 0) + amount


def fits_within(used: Mapping[str, int], limit: Mapping[str, int]) -> list[str]:
    """The resources of ``limit`` that ``used`` exceeds (Volcano's ``LessEqual`` on
    the dimensions the capability names; a dimension it leaves out is unlimited)."""
    return sorted(name for name, cap in limit.items() if used.get(name, 0) > cap)


def set_pg_condition(
    status: Obj, type_: str, value: str, reason: str, message: str, transition: str
) -> bool:
    """Set one PodGroup condition (Volcano's fields: no ``lastProbeTime``); True if it changed."""
    conditions: list[Obj] = status.setdefault("conditions", [])
    for entry in conditions:
        if entry.get("type") == type_:
            if (entry.get("status"), entry.get("reason"), entry.get("message")) == (
                value,
                reason,
                message,
            ):
                return False
            entry.update(status=value, reason=reason, message=message, transitionID=transition)
            entry["lastTransitionTime"] = now_rfc3339()
            return True
    conditions.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "transitionID": transition,
            "lastTransitionTime": now_rfc3339(),
        }
    )
    return True


def drop_condition(status: Obj, types: Iterable[str]) -> None:
    unwanted = set(types)
    status["conditions"] = [
        c for c in status.get("conditions") or () if c.get("type") not in unwanted
    ]
