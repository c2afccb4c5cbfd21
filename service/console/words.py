"""Plain words for what the read models hold: a workload's events as a
timeline, pending reason codes, GPU counts. Another namespace's workload is
named only to a reader the API would let read it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.app.auth import Principal
from service.app.overview import TimelineEvent, assignment_gpus, is_gpu
from service.app.visibility import may_read_workloads

#: Kueue's pending reason codes (and ours), as a sentence fragment.
REASONS = {
    "NotYetTried": "not tried by an admission cycle yet",
    "WaitingForQuota": "waiting for quota",
    "WaitingForCapacity": "waiting for free capacity",
    "StrictFIFO": "behind an older workload (StrictFIFO)",
    "Inadmissible": "cannot be admitted as configured",
    "ClusterQueueStopped": "its ClusterQueue is stopped",
    "KindNotRunnable": "its kind cannot run on member clusters yet",
    "Pending": "waiting",
}


def reason_words(code: str) -> str:
    return REASONS.get(code, code)


def gpus(spec: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> int:
    """GPUs a workload asks for: pods times each pod's GPU requests, times
    its replicas for a serving workload; what its units hold once any is
    admitted (each replica's admission), as ``qmctl get`` counts them."""
    units = (status or {}).get("replicaAdmissions") or ()
    if units:
        return sum(
            assignment_gpus(a)
            for u in units
            for a in (u.get("admission") or {}).get("podSetAssignments") or ()
        )
    total = 0
    for pod_set in spec.get("podSets") or ():
        count = int(pod_set.get("count") or 1)
        containers = ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or ()
        for container in containers:
            requests = (container.get("resources") or {}).get("requests") or {}
            for resource, quantity in requests.items():
                if is_gpu(str(resource)):
                    try:
                        total += count * int(float(quantity))
                    except (TypeError, ValueError):
                        continue  # not a count of devices
    return total * int(spec.get("replicas") or 1)


#: How many clusters or islands a row names before it counts the rest.
LISTED = 2


def listed(values: Iterable[Any]) -> tuple[str, str]:
    """Distinct ``values`` joined, past :data:`LISTED` of them the rest
    counted (``a, b, +4``, as ``qmctl get`` shortens them), and all of them."""
    distinct = [str(v) for v in dict.fromkeys(v for v in values if v)]
    every = ", ".join(distinct)
    if len(distinct) <= LISTED:
        return every, every
    return ", ".join([*distinct[:LISTED], f"+{len(distinct) - LISTED}"]), every


def named(key: str | None, reader: Principal) -> str:
    """``namespace/name`` if ``reader`` may read that namespace's workloads."""
    if not key:
        return "another workload"
    namespace = key.split("/", 1)[0]
    if may_read_workloads(reader, namespace):
        return key
    return "a workload of another namespace"


@dataclass(frozen=True)
class Moment:
    at: datetime
    type: str
    words: str
    actor: str


def _admitted(status: Mapping[str, Any], reader: Principal) -> str:
    admission = status.get("admission") or {}
    flavors = sorted(
        {
            str(f)
            for ps in admission.get("podSetAssignments") or ()
            for f in ps.get("flavors", {}).values()
        }
    )
    where = f"cluster {admission.get('cluster')}"
    if admission.get("island"):
        where += f", island {admission['island']}"
    text = f"Admitted to {where}" + (f" (flavor {', '.join(flavors)})" if flavors else "")
    victims = [named(v, reader) for v in admission.get("preempted") or ()]
    if victims:
        text += "; preempting " + ", ".join(victims)
    if admission.get("borrowed"):
        text += "; borrowing from the cohort"
    return text


def _evicted(status: Mapping[str, Any], reader: Principal, preempted: bool) -> str:
    eviction = status.get("eviction") or {}
    if preempted:
        why = eviction.get("preemptionReason") or "Preempted"
        return f"Preempted by {named(eviction.get('preemptor'), reader)} ({why})"
    why = eviction.get("message") or eviction.get("reason")
    return f"Evicted from {eviction.get('cluster')}: {why}"


def _finished(status: Mapping[str, Any]) -> str:
    outcome = status.get("outcome") or "Finished"
    latest = (status.get("conditions") or [{}])[-1]
    message = latest.get("message")
    return f"Finished: {outcome}" + (f" ({message})" if message else "")


#: A serving workload's units' events, by type (docs/serving.md).
_UNIT_WORDS = {
    "WorkloadPreempted": "preempted, their quota released (the ledger names the preemptor)",
    "WorkloadEvicted": "evicted, their quota released",
    "WorkloadFinished": "released by a scale down",
}


def _units(event: TimelineEvent, reader: Principal) -> str:
    """An event of a serving workload's units: where they were admitted, or
    how they stopped holding."""
    which = ", ".join(str(r) for r in event.replicas)
    which = f"Replica {which}" if len(event.replicas) == 1 else f"Replicas {which}"
    if event.type == "WorkloadAdmitted":
        units = event.status.get("replicaAdmissions") or ()
        places = sorted(
            {
                _admitted({"admission": u.get("admission") or {}}, reader)
                for u in units
                if u.get("replica") in event.replicas
            }
        )
        return f"{which}: {'; '.join(places)}"
    return f"{which} {_UNIT_WORDS.get(event.type, event.type)}"


def moment(event: TimelineEvent, reader: Principal) -> Moment:
    status, kind = event.status, event.type
    words: str
    if event.replicas:
        words = _units(event, reader)
    elif kind == "WorkloadSubmitted":
        words = f"Submitted to LocalQueue {event.spec.get('queueName')}"
    elif kind == "WorkloadPending":
        code = str(status.get("pendingReasonCode") or "")
        words = f"Pending: {reason_words(code)}" if code else "Pending"
    elif kind == "WorkloadAdmitted":
        words = _admitted(status, reader)
    elif kind == "WorkloadPreempted":
        words = _evicted(status, reader, preempted=True)
    elif kind == "WorkloadEvicted":
        words = _evicted(status, reader, preempted=False)
    elif kind == "WorkloadRequeued":
        words = "Requeued: its job is gone from the member; Pending again"
    elif kind == "WorkloadDispatched":
        words = f"Its job is on cluster {(status.get('admission') or {}).get('cluster')}"
    elif kind == "WorkloadRunning":
        words = "Running: every pod is ready"
    elif kind == "WorkloadFinished":
        words = _finished(status)
    elif kind == "WorkloadCheckpointed":
        words = f"Checkpointed: its work is saved as of {status.get('lastCheckpoint')}"
    elif kind == "WorkloadCancelled":
        words = f"Cancelled ({status.get('state')})"
    elif kind == "WorkloadScaled":
        words = f"Scaled to {event.spec.get('replicas')} replicas"
    else:
        words = kind
    return Moment(event.at, kind, words, event.actor)


def timeline(events: Iterable[TimelineEvent], reader: Principal) -> list[Moment]:
    """Oldest first; a pending reason written again in the same words is one
    moment, and checkpoints in a row are their latest (a long run saves
    every few minutes: its timeline would be nothing else)."""
    out: list[Moment] = []
    for event in events:
        said = moment(event, reader)
        last = out[-1] if out else None
        if last and last.type == said.type == "WorkloadPending" and last.words == said.words:
            continue
        if last and last.type == said.type == "WorkloadCheckpointed":
            out[-1] = said
            continue
        out.append(said)
    return out
