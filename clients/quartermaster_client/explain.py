"""Why a workload waits, or where it runs, in words."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quartermaster_client.models import (
    GPU,
    ClusterQueue,
    Explanation,
    PodSetAssignment,
    Quantity,
    Replicas,
    Workload,
)

ADMITTED_STATES = ("Admitted", "Running", "Cancelling")
_BINARY = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def amount(resource: str, value: int) -> str:
    """A canonical amount (cpu in milli-cores, memory in bytes) as people write it."""
    if resource == "cpu":
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if "memory" in resource or "storage" in resource:
        for suffix, size in _BINARY:
            if value >= size and value % size == 0:
                return f"{value // size}{suffix}"
    return str(value)


def quantity_value(value: Quantity) -> float:
    """A plain number for a quota quantity (GPUs are whole numbers)."""
    if isinstance(value, int):
        return float(value)
    try:
        return float(value)
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class QueueUsage:
    """A ClusterQueue's GPUs: nominal quota, in use by admitted gangs, and
    borrowed from its cohort — in use now beyond each flavor's nominal quota,
    summed over flavors (what Kueue's ``flavorsUsage[].borrowed`` says)."""

    pending: int
    admitted: int
    used: int
    nominal: int
    borrowed: int = 0


def workload_gpus(workload: Workload) -> int:
    """The GPUs it holds, as admitted (every replica of a serving workload);
    what it asks for while nothing is admitted."""
    admissions = workload.status.admissions
    if admissions:
        used = [
            a.resource_usage.get(GPU)
            for admission in admissions
            for a in admission.pod_set_assignments
            if a.resource_usage
        ]
        if used and all(u is not None for u in used):
            return int(sum(quantity_value(u) for u in used if u is not None))
    return workload.requests(GPU) * (workload.spec.replicas or 1)


def queue_usage(cq: ClusterQueue, workloads: Iterable[Workload]) -> QueueUsage:
    """Pending and admitted counts from the ClusterQueue's status when the
    workers fill it in, else counted from its workloads; GPUs in use and
    borrowed from the admitted workloads' flavors now, not as they were when
    each was admitted (a gang admitted while its queue borrowed stops
    borrowing when others leave)."""
    pending = admitted = 0
    used: dict[str, int] = {}
    for workload in workloads:
        if workload.status.cluster_queue != cq.name:
            continue
        if workload.status.state == "Pending":
            pending += 1
        elif workload.status.state in ADMITTED_STATES:
            admitted += 1
        # A serving workload holds what its admitted replicas do, whatever its state.
        if workload.status.state in ADMITTED_STATES or workload.status.replica_admissions:
            for flavor, gpus in _gpus_by_flavor(workload).items():
                used[flavor] = used.get(flavor, 0) + gpus
    status = cq.status
    nominal = {f: int(quantity_value(v)) for f, v in cq.spec.nominal(GPU).items()}
    return QueueUsage(
        status.pending_workloads if status.pending_workloads is not None else pending,
        status.admitted_workloads if status.admitted_workloads is not None else admitted,
        sum(used.values()),
        sum(nominal.values()),
        sum(max(0, gpus - nominal.get(flavor, 0)) for flavor, gpus in used.items()),
    )


def _gpus_by_flavor(workload: Workload) -> dict[str, int]:
    """GPUs of an admitted workload per flavor ("" where no flavor is recorded)."""
    found: dict[str, int] = {}
    for admission in workload.status.admissions:
        for assignment in admission.pod_set_assignments:
            gpus = assignment.resource_usage.get(GPU)
            if gpus is not None:
                flavor = assignment.flavors.get(GPU, "")
                found[flavor] = found.get(flavor, 0) + int(quantity_value(gpus))
    if not found:
        found[""] = workload.requests(GPU)
    return found


def _requests(requests: Mapping[str, int]) -> str:
    order = sorted(requests, key=lambda r: (r != GPU, r))
    return ", ".join(f"{amount(r, requests[r])} {r}" for r in order)


def _waiting_for(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return str(value.get("message") or value.get("reason") or "") or None
    return None


def _pod_set_line(assignment: PodSetAssignment) -> str:
    count = f"{assignment.count} pods" if assignment.count is not None else "pods"
    flavors = sorted(set(assignment.flavors.values()))
    if len(flavors) == 1:
        where = f"flavor {flavors[0]}"
    else:
        where = ", ".join(f"{r}={f}" for r, f in sorted(assignment.flavors.items())) or "-"
    nodes = ", ".join(f"{p.get('node')} ({p.get('count')})" for p in assignment.placement)
    return f"pod set {assignment.name}: {count}, {where}" + (f", on {nodes}" if nodes else "")


_SHORT_NEEDS = re.compile(
    r"insufficient unused quota for (?P<resource>\S+) in flavor (?P<flavor>[^,;]+), "
    r"(?P<amount>\S+) more needed"
)
_SHORT_PHRASES = (
    ("even if it were empty", "can never fit: no cluster is large enough"),
    ("no single cluster has room now", "waits for room for the whole gang in one cluster"),
    ("maximum capacity", "asks for more than its ClusterQueue can ever have"),
    (
        "fragmented across islands",
        "fragmentation: enough is free in the fleet, but no single island has room",
    ),
)


def summary(explanation: Explanation, usage: QueueUsage | None = None) -> str | None:
    """One line for a pending workload, the way a person says it: "needs 16
    more GPUs of flavor h100; position 3 of 12 in team-a; team-a is borrowing
    24 GPUs". None when nothing is known yet."""
    e = explanation
    parts: list[str] = []
    waiting = _waiting_for(e.waiting_for) or ""
    needs = [
        f"{m['amount']} more {'GPUs' if m['resource'] == GPU else m['resource']} "
        f"of flavor {m['flavor']}"
        for m in _SHORT_NEEDS.finditer(waiting)
    ]
    if needs:
        parts.append("needs " + " or ".join(needs))
    else:
        parts.extend(phrase for words, phrase in _SHORT_PHRASES if words in waiting)
    if e.position_in_queue is not None and e.cluster_queue:
        parts.append(
            f"position {e.position_in_queue} of {e.pending_in_cluster_queue} in {e.cluster_queue}"
        )
    if usage is not None and usage.borrowed and e.cluster_queue:
        parts.append(f"{e.cluster_queue} is borrowing {usage.borrowed} GPUs")
    return "; ".join(parts) if parts and (needs or len(parts) > 1) else None


def _replicas_line(replicas: Replicas) -> str:
    text = f"Replicas: {replicas.admitted} of {replicas.asked} admitted"
    waiting = _waiting_for(replicas.waiting_for)
    if replicas.waiting and waiting:
        return f"{text}; {replicas.waiting} waiting: {waiting}".rstrip(".") + "."
    return text + "."


def in_words(explanation: Explanation, usage: QueueUsage | None = None) -> list[str]:
    """Sentences, one per line."""
    e = explanation
    where = f"LocalQueue {e.local_queue}"
    if e.cluster_queue:
        where += f" (ClusterQueue {e.cluster_queue})"
    lines = [f"Workload {e.workload} is {e.state} in {where}, priority {e.priority}."]
    short = summary(e, usage) if e.state == "Pending" else None
    if short:
        lines.append(f"In short: {short}.")
    if e.requests:
        lines.append(f"It asks for {_requests(e.requests)} in all.")
    if e.state == "Pending":
        if e.position_in_queue is not None:
            lines.append(
                f"Position {e.position_in_queue} of {e.pending_in_cluster_queue} "
                f"pending in {e.cluster_queue}."
            )
        waiting = _waiting_for(e.waiting_for)
        if waiting and waiting.startswith("the next admission cycle"):
            lines.append("Waiting for the next admission cycle: no decision has been made yet.")
        elif waiting:
            lines.append(f"Why it waits: {waiting}".rstrip(".") + ".")
    if e.admission is not None and e.admission.cluster:
        islands = e.admission.islands
        flavors = e.admission.flavors
        text = f"Admitted to cluster {e.admission.cluster}"
        if islands:
            text += f", island{'s' if len(islands) > 1 else ''} {', '.join(islands)}"
        if flavors:
            text += f", flavor{'s' if len(flavors) > 1 else ''} {', '.join(flavors)}"
        lines.append(text + ".")
        for assignment in e.admission.pod_set_assignments:
            lines.append("  " + _pod_set_line(assignment))
    if e.replicas is not None:
        lines.append(_replicas_line(e.replicas))
    waiting = _waiting_for(e.waiting_for) if e.state == "Pending" else None
    if (e.reason or e.message) and not (waiting and e.message and waiting in e.message):
        lines.append(f"Latest condition: {e.reason or ''}{': ' if e.message else ''}{e.message}")
    if usage is not None and e.cluster_queue:
        text = f"{e.cluster_queue} uses {usage.used} of {usage.nominal} nominal GPUs"
        if usage.borrowed:
            text += f" and is borrowing {usage.borrowed} GPUs from its cohort"
        lines.append(text + f"; {usage.pending} pending, {usage.admitted} admitted.")
    return lines


__all__ = ["QueueUsage", "amount", "in_words", "queue_usage", "summary", "workload_gpus"]
