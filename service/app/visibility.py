"""What a reader sees of other namespaces in a Workload's status.

A preemption names both sides: the preemptor's admission lists its victims
(``status.admission.preempted``), a victim's eviction names its preemptor
(``status.eviction.preemptor``, and the messages say it). A reader who may
not read the other namespace's workloads sees "a workload of another
namespace" instead, in objects and in events alike — as Kueue names a
preemptor by UID, not by name, in its messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.app.auth import Principal, require
from service.app.errors import Forbidden
from service.app.kinds import KINDS

ANOTHER = "a workload of another namespace"


def may_read_workloads(principal: Principal, namespace: str) -> bool:
    """Whether the API would let ``principal`` read workloads of ``namespace``."""
    try:
        require(principal, KINDS["workloads"].read, namespace)
    except Forbidden:
        return False
    return True


def status_for(status: Mapping[str, Any], reader: Principal) -> dict[str, Any]:
    """``status`` with every workload of a namespace ``reader`` may not read
    replaced by :data:`ANOTHER` (its key in lists, fields and messages)."""
    hidden = [k for k in _named(status) if not may_read_workloads(reader, k.split("/", 1)[0])]
    if not hidden:
        return dict(status)
    replaced: dict[str, Any] = _replace(status, hidden)
    return replaced


def object_for(obj: Mapping[str, Any], reader: Principal) -> dict[str, Any]:
    """A Workload object (or an event's data of one) as ``reader`` may see it."""
    status = obj.get("status")
    if obj.get("kind") != "Workload" or not isinstance(status, Mapping):
        return dict(obj)
    return {**obj, "status": status_for(status, reader)}


def _named(status: Mapping[str, Any]) -> list[str]:
    admission = status.get("admission")
    eviction = status.get("eviction")
    keys = list(admission.get("preempted") or ()) if isinstance(admission, Mapping) else []
    for unit in status.get("replicaAdmissions") or ():  # a serving workload's units
        unit_admission = unit.get("admission") if isinstance(unit, Mapping) else None
        if isinstance(unit_admission, Mapping):
            keys += list(unit_admission.get("preempted") or ())
    if isinstance(eviction, Mapping) and eviction.get("preemptor"):
        keys.append(eviction["preemptor"])
    return [k for k in keys if isinstance(k, str) and "/" in k]


def _replace(value: Any, hidden: list[str]) -> Any:
    if isinstance(value, str):
        for key in hidden:
            value = value.replace(key, ANOTHER)
        return value
    if isinstance(value, Mapping):
        return {k: _replace(v, hidden) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, hidden) for v in value]
    return value
