"""The engine's decisions to the cycle's writes: events carrying each
workload's new state, their read-model rows and ledger entries.

``cycle_writes`` is pure (what to write); ``stage`` puts them into a unit of
work (how), with an outbox message for each member cluster whose jobs change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from service.app import lifecycle
from service.app.admission.convert import admission_to_status, timestamp
from service.app.admission.repository import WorkloadRow
from service.app.admission.snapshot import Loaded
from service.app.lifecycle import ADMITTED, EVICTED, PENDING
from service.app.resources import stream_name
from service.app.uow import SqlUnitOfWork
from service.domain.events import RECONCILE_CLUSTER
from service.engine import (
    AdmissionDecision,
    CycleResult,
    Eviction,
    Fragmentation,
    PendingReason,
    Preemption,
)
from service.eventstore.port import EventMetadata, NewEvent, OutboxMessage
from service.ledger.chain import NewLedgerEntry
from service.projections.resources import defer_resources, resource_row

ACTOR = "system:admission"
#: A pending workload whose reason holds but whose words changed (Kueue's
#: "8 more needed" follows every admission and completion around it) is
#: rewritten at most this often (seconds).
PENDING_MESSAGE_REFRESH = 30.0

Obj = dict[str, Any]


@dataclass
class CycleWrites:
    """Everything one cycle writes: ``(stream, expected version, type, data)``
    appends with their read-model rows, and ledger entries."""

    appends: list[tuple[str, int, str, Obj]] = field(default_factory=list)
    ledger: list[NewLedgerEntry] = field(default_factory=list)
    admitted: int = 0
    preempted: int = 0
    evicted: int = 0
    pending_changed: int = 0
    #: ``(ClusterQueue, seconds queued)`` of each admission, for metrics.
    waits: list[tuple[str, float]] = field(default_factory=list)


def cycle_writes(loaded: Loaded, result: CycleResult, now: datetime) -> CycleWrites:
    """The writes that apply ``result``. Victims and evictions first, then
    admissions, then changed pending reasons (those of workloads held out of
    the snapshot too); at most one event per workload
    (the engine never both evicts and admits one in a cycle)."""
    out = CycleWrites()
    rows = loaded.workloads
    touched: set[str] = set()
    for preemption in result.preemptions:
        _preempt(out, rows[preemption.workload], preemption, now)
        touched.add(preemption.workload)
    for eviction in result.evictions:
        if eviction.workload not in touched:
            _evict(out, rows[eviction.workload], eviction, now)
            touched.add(eviction.workload)
    for decision in result.admissions:
        _admit(out, rows[decision.workload], decision, now)
        touched.add(decision.workload)
    for key, reason in (*result.pending.items(), *loaded.held.items()):
        row = rows.get(key)
        if row is not None and key not in touched and row.status.get("state", PENDING) == PENDING:
            _pend(out, row, reason, now)
    return out


def reconcile_clusters(writes: CycleWrites) -> list[str]:
    """The member clusters whose jobs this cycle's decisions change: where
    gangs were admitted, and where victims and evicted gangs were running."""
    clusters = set()
    for _, _, _, data in writes.appends:
        status = data.get("status") or {}
        for part in ("admission", "eviction"):
            cluster = (status.get(part) or {}).get("cluster")
            if cluster and status.get("state") in (ADMITTED, EVICTED):
                clusters.add(str(cluster))
    return sorted(clusters)


def stage(uow: SqlUnitOfWork, writes: CycleWrites, now: datetime) -> None:
    """Every event with its read-model row, the ledger entries and the
    reconcile messages, into ``uow`` (which the caller commits)."""
    meta = EventMetadata(actor=ACTOR, occurred_at=now)
    rows = []
    for stream, version, kind, data in writes.appends:
        uow.events.append(stream, version, [NewEvent(uuid4(), kind, data, meta)])
        rows.append(resource_row(data, version + 1, now))
    defer_resources(uow.events.defer, rows)
    if writes.ledger:
        uow.record(writes.ledger)
    if touched := reconcile_clusters(writes):
        uow.publish([OutboxMessage(uuid4(), RECONCILE_CLUSTER, {"cluster": c}) for c in touched])


def _stream(row: WorkloadRow) -> str:
    return stream_name("Workload", row.namespace, row.name)


def _write(out: CycleWrites, row: WorkloadRow, change: lifecycle.Transition) -> None:
    data = row.state(change.status.to_json(), change.spec)
    out.appends.append((_stream(row), row.version, change.event, data))
    out.ledger += change.entries


def _admit(out: CycleWrites, row: WorkloadRow, decision: AdmissionDecision, now: datetime) -> None:
    borrowed: dict[str, dict[str, int]] = {}
    for (flavor, resource), amount in decision.borrowed.items():
        borrowed.setdefault(flavor, {})[resource] = amount
    change = lifecycle.admit(
        lifecycle.Subject.of(row),
        lifecycle.Status(row.status),
        admission_to_status(decision, now),
        borrowed=borrowed,
        with_preemption=bool(decision.preempted),
        now=now,
    )
    _write(out, row, change)
    out.admitted += 1
    queued = timestamp(row.status.get("queuedAt"), row.created_at.timestamp())
    out.waits.append((decision.cluster_queue, max(0.0, now.timestamp() - queued)))


def _cohort_path(path: str) -> list[str]:
    """``/root/mid/cq`` → ``["mid", "root"]``: cohorts from the ClusterQueue up."""
    parts = [p for p in path.split("/") if p]
    return list(reversed(parts[:-1]))


def _preempt(out: CycleWrites, row: WorkloadRow, preemption: Preemption, now: datetime) -> None:
    change = lifecycle.preempt(
        lifecycle.Subject.of(row),
        lifecycle.Status(row.status),
        reason=preemption.reason,
        message=preemption.message,
        preemptor=preemption.preemptor,
        preemptor_cluster_queue=preemption.preemptor_cluster_queue,
        cohort_path=_cohort_path(preemption.victim_path),
        now=now,
        work_destroyed=preemption.work_destroyed,
        budgeted=preemption.budgeted,
    )
    _write(out, row, change)
    out.preempted += 1


def _evict(out: CycleWrites, row: WorkloadRow, eviction: Eviction, now: datetime) -> None:
    """Pods-ready timeout (requeued with backoff, or deactivated past its
    limit) or a stopped queue draining."""
    requeue_state = None
    if eviction.requeue_state is not None:
        at = eviction.requeue_state.requeue_at
        requeue_state = {
            "count": eviction.requeue_state.count,
            "requeueAt": datetime.fromtimestamp(at, UTC).isoformat() if at is not None else None,
        }
    change = lifecycle.evict(
        lifecycle.Subject.of(row),
        lifecycle.Status(row.status),
        reason=eviction.reason,
        message=eviction.message,
        now=now,
        spec=row.spec,
        requeue_state=requeue_state,
        deactivate=eviction.deactivated,
    )
    _write(out, row, change)
    out.evicted += 1


def _seconds_since(value: Any, now: datetime) -> float:
    """Seconds from an RFC 3339 time to ``now``; unreadable: forever."""
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return (now - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds()
    except (TypeError, ValueError):
        return float("inf")


def _words(row: WorkloadRow, reason: PendingReason) -> str:
    """The reason's message as the workload's readers may see it: a StrictFIFO
    blocker of another namespace is not named (its owner's names are theirs)."""
    behind = reason.waiting_behind
    if behind is None or behind.startswith(f"{row.namespace}/"):
        return reason.message
    return reason.message.replace(behind, "a workload of another namespace")


def _pend(out: CycleWrites, row: WorkloadRow, reason: PendingReason, now: datetime) -> None:
    status = row.status
    message = _words(row, reason)
    same = (
        status.get("pendingReasonCode") == reason.reason
        and status.get("pendingCause") == reason.cause
        and (not reason.cluster_queue or status.get("clusterQueue") == reason.cluster_queue)
    )
    if same and status.get("pendingReason") == message:
        return  # unchanged: no write, so an idle cycle writes nothing
    if same and _seconds_since(status.get("pendingReasonAt"), now) < PENDING_MESSAGE_REFRESH:
        # The same reason in other numbers: under churn every cycle changed
        # every pending gang's words, and wrote each an event; the numbers
        # are refreshed now and then.
        return
    change = lifecycle.pend(
        lifecycle.Status(status),
        reason.reason,
        message,
        reason.cluster_queue,
        now,
        cause=reason.cause,
        fragmentation=_fragmentation(reason.fragmentation),
    )
    out.appends.append((_stream(row), row.version, change.event, row.state(change.status.raw)))
    out.pending_changed += 1


def _fragmentation(found: Fragmentation | None) -> dict[str, Any] | None:
    """A fragmentation's numbers as the status keeps them (canonical amounts)."""
    if found is None:
        return None
    return {
        "flavor": found.flavor,
        "resource": found.resource,
        "requested": found.requested,
        "freeInFleet": found.fleet_free,
        "largestFreeIsland": {"name": found.largest_island, "free": found.largest_free},
    }
