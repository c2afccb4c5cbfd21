"""Where a workload stands and the true cause of its wait: a gang that can
never be admitted says so (and why, judged on the fleet as configured, now);
another says what it waits for and who is ahead, named only in namespaces
the reader may read (issue 18: a submitter must not learn others' names)."""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import ValidationError
from sqlalchemy import Connection, Engine

from service.app.admission.snapshot import NOT_RUNNABLE
from service.app.auth import Principal, require
from service.app.errors import Forbidden
from service.app.kinds import KINDS
from service.app.submissions.repository import (
    QueueCounts,
    QueueOrder,
    ahead_names,
    queue_counts,
    queue_order,
)
from service.app.submissions.resolver import verdict_of
from service.app.submissions.values import Obj
from service.app.workloads import WorkloadSpec, total_requests
from service.domain.jobs import runs_as_units
from service.domain.quantity import format_amount
from service.engine import Snapshot
from service.engine.feasibility import Verdict
from service.engine.fragmentation import FRAGMENTED_ACROSS_ISLANDS

WORKLOADS = KINDS["workloads"]
#: How many of the workloads ahead explain names (those the reader may read).
AHEAD_NAMED = 10
#: Recorded reasons that mean the gang may fit and waits for what others hold.
_WAITS_FOR_OTHERS = frozenset({"WaitingForQuota", "WaitingForCapacity", "StrictFIFO", "Pending"})
_BEHIND = re.compile(r"Waiting behind (?P<key>[a-z0-9][-a-z0-9]*/[^\s]+)")


def explain(
    namespace: str,
    name: str,
    obj: Obj,
    reader: Principal,
    engine: Engine,
    fleet: Callable[[Connection], Snapshot],
) -> Obj:
    """The explanation of Workload ``obj`` (as the API shows it) for ``reader``;
    ``fleet`` answers the fleet as configured, read on the given connection."""
    status, spec = obj["status"], obj["spec"]
    state = status.get("state", "Pending")
    latest = (status.get("conditions") or [{}])[-1]
    answer: Obj = {
        "workload": f"{namespace}/{name}",
        "state": state,
        "reason": latest.get("reason"),
        "message": _unnamed(latest.get("message"), reader),
        "clusterQueue": status.get("clusterQueue"),
        "localQueue": spec.get("queueName"),
        "priority": spec.get("priority", 0),
        "requests": _requests(spec),
    }
    if state == "Pending":
        cq = status.get("clusterQueue")
        # A kind held until members can run it waits for that first: it is in
        # no queue, and ahead of nobody in its ClusterQueue's.
        held = status.get("pendingReasonCode") == NOT_RUNNABLE
        with engine.connect() as conn:
            order = queue_order(conn, obj, NOT_RUNNABLE)
            counts = queue_counts(conn, order)
            position, total = counts.position, counts.total
            ahead = _ahead(conn, order, counts, reader)
            verdict = verdict_of(fleet(conn), namespace, obj, cq) if cq and not held else None
        if not held:
            answer["positionInQueue"] = position
            answer["pendingInClusterQueue"] = total
            answer["ahead"] = ahead
        answer.update(_waiting(status, verdict, position, total, ahead, reader))
    if status.get("admission"):
        answer["admission"] = status["admission"]
    if runs_as_units(spec):
        answer["replicas"] = _replicas(status, spec, reader)
    return answer


def _replicas(status: Obj, spec: Obj, reader: Principal) -> Obj:
    """A serving workload's units (docs/serving.md): asked, admitted, and
    what the waiting ones wait for (its lowest waiting unit's reason, which
    the cycle records on the workload, Admitted or not)."""
    asked = int(spec.get("replicas") or 1)
    admitted = len(status.get("replicaAdmissions") or ())
    out: Obj = {"asked": asked, "admitted": admitted, "waiting": max(0, asked - admitted)}
    if out["waiting"] and status.get("state") in ("Pending", "Admitted", "Running"):
        recorded = _unnamed(status.get("pendingReason"), reader)
        out["reason"] = status.get("pendingReasonCode") or "Pending"
        out["waitingFor"] = recorded or "the next admission cycle: no decision made yet"
    return out


def _ahead(conn: Connection, order: QueueOrder, queue: QueueCounts, reader: Principal) -> Obj:
    """Who is ahead in the queue: counts, and names only in namespaces
    ``reader`` may read."""
    counts = queue.ahead_by_namespace
    readable = sorted(ns for ns, _ in counts if _may_read(reader, ns))
    visible = sum(n for ns, n in counts if ns in readable)
    total = sum(n for _, n in counts)
    named = ahead_names(conn, order, readable, AHEAD_NAMED) if readable else []
    return {
        "total": total,
        "inNamespacesYouCanRead": visible,
        "inOtherNamespaces": total - visible,
        "workloads": named,
    }


def _waiting(
    status: Obj,
    verdict: Verdict | None,
    position: int,
    total: int,
    ahead: Obj,
    reader: Principal,
) -> Obj:
    """``inadmissible``, ``cause`` and ``waitingFor`` (words) of a pending workload."""
    if verdict is not None:
        out: Obj = {
            "inadmissible": True,
            "cause": verdict.cause,
            "reason": verdict.reason,
            "message": verdict.message,
            "waitingFor": "nothing: it can never be admitted: "
            + verdict.message.removeprefix("can never be admitted: "),
        }
        if verdict.largest is not None:
            largest = verdict.largest
            out["largest"] = {
                "flavor": largest.flavor,
                "cluster": largest.cluster,
                "domain": largest.domain,
                "pods": largest.pods,
                "resources": {r: format_amount(r, a) for r, a in largest.resources.items()},
            }
        return out
    code = status.get("pendingReasonCode")
    recorded = _unnamed(status.get("pendingReason"), reader)
    if not recorded:
        words = "the next admission cycle: no admission decision has been made yet"
        return {"inadmissible": False, "cause": None, "waitingFor": words}
    fragmented = status.get("pendingFragmentation")
    if status.get("pendingCause") == FRAGMENTED_ACROSS_ISLANDS and fragmented:
        # Tried and blocked by fragmentation alone: others ahead are not why it waits.
        return {
            "inadmissible": False,
            "cause": FRAGMENTED_ACROSS_ISLANDS,
            "waitingFor": recorded,
            "fragmentation": _fragmentation(fragmented),
        }
    if code in _WAITS_FOR_OTHERS and (position > 1 or code == "StrictFIFO"):
        others = ahead["inOtherNamespaces"]
        hidden = f", {others} of them in namespaces you cannot read" if others else ""
        words = (
            f"{recorded}; waiting behind others: {position - 1} workload(s) ahead of it "
            f"in ClusterQueue {status.get('clusterQueue')}{hidden} "
            f"(position {position} of {total})"
        )
        return {"inadmissible": False, "cause": "WaitingBehindOthers", "waitingFor": words}
    return {"inadmissible": False, "cause": code, "waitingFor": recorded}


def _fragmentation(recorded: Obj) -> Obj:
    """The recorded numbers of a fragmented wait, amounts as people write them."""
    resource = str(recorded.get("resource", ""))
    largest = recorded.get("largestFreeIsland") or {}

    def amount(key: str, where: Obj = recorded) -> str:
        return format_amount(resource, int(where.get(key, 0)))

    return {
        "flavor": recorded.get("flavor"),
        "resource": resource,
        "requested": amount("requested"),
        "freeInFleet": amount("freeInFleet"),
        "largestFreeIsland": {"name": largest.get("name"), "free": amount("free", largest)},
    }


def _may_read(reader: Principal, namespace: str) -> bool:
    try:
        require(reader, WORKLOADS.read, namespace)
    except Forbidden:
        return False
    return True


def _unnamed(message: str | None, reader: Principal) -> str | None:
    """A message as ``reader`` may see it: a workload of a namespace it may not
    read is not named (messages recorded before the cycle stopped naming them)."""
    if not message:
        return message

    def hide(match: re.Match[str]) -> str:
        key = match.group("key")
        if _may_read(reader, key.split("/", 1)[0]):
            return match.group(0)
        return "Waiting behind a workload of another namespace"

    return _BEHIND.sub(hide, message)


def _requests(spec: Obj) -> dict[str, int]:
    try:
        stored = WorkloadSpec.model_validate({k: v for k, v in spec.items() if k != "priority"})
    except ValidationError:  # stored by an older version of the service
        return {}
    return total_requests(stored)
