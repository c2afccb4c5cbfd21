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
from service.app.lifecycle import ADMITTED, EVICTED, PENDING, RUNNING
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
    #: Member clusters where a serving workload's units were admitted or
    #: released (a released unit's cluster is no longer in its row's status).
    clusters: set[str] = field(default_factory=set)
    #: Each row written so far as the next write meets it: the version to
    #: append at, its status, and the index in ``appends`` of its last event
    #: (units of one workload write in sequence).
    current: dict[str, tuple[int, Obj, int]] = field(default_factory=dict, repr=False)


def unit_of(key: str) -> tuple[str, int | None]:
    """An engine key's row key and, for a serving workload's unit
    (``ns/name#i``), its replica; ``None`` for a one-gang workload."""
    row_key, mark, replica = key.rpartition("#")
    return (row_key, int(replica)) if mark else (key, None)


def cycle_writes(loaded: Loaded, result: CycleResult, now: datetime) -> CycleWrites:
    """The writes that apply ``result``. Victims and evictions first, then
    admissions, then changed pending reasons (those of workloads held out of
    the snapshot too); at most one event per one-gang workload (the engine
    never both evicts and admits one in a cycle); for a serving workload one
    per kind of change to its units (:func:`_write`), then its lowest
    waiting unit's reason."""
    out = CycleWrites()
    rows = loaded.workloads
    touched: set[str] = set()
    for preemption in result.preemptions:
        key, replica = unit_of(preemption.workload)
        _preempt(out, rows[key], preemption, now, replica)
        touched.add(preemption.workload)
    for eviction in result.evictions:
        if eviction.workload not in touched:
            key, replica = unit_of(eviction.workload)
            _evict(out, rows[key], eviction, now, replica)
            touched.add(eviction.workload)
    for decision in result.admissions:
        key, replica = unit_of(decision.workload)
        _admit(out, rows[key], decision, now, replica)
        touched.add(decision.workload)
    waiting: dict[str, tuple[int, PendingReason]] = {}
    for key, reason in (*result.pending.items(), *loaded.held.items()):
        row_key, replica = unit_of(key)
        if replica is not None:
            if row_key not in waiting or replica < waiting[row_key][0]:
                waiting[row_key] = (replica, reason)
            continue
        row = rows.get(key)
        if row is not None and key not in touched and row.status.get("state", PENDING) == PENDING:
            _pend(out, row, reason, now)
    for row_key, (_, reason) in waiting.items():
        row = rows.get(row_key)
        if row is not None and _status(out, row).state in (PENDING, ADMITTED, RUNNING):
            _pend(out, row, reason, now)
    return out


def reconcile_clusters(writes: CycleWrites) -> list[str]:
    """The member clusters whose jobs this cycle's decisions change: where
    gangs were admitted, and where victims and evicted gangs were running."""
    clusters = set(writes.clusters)
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
    # One append per stream: the events of a serving workload's units follow
    # one another from the version the cycle read (two appends to one stream
    # would each be checked against that version), and its row is the last.
    streams: dict[str, list[tuple[int, str, Obj]]] = {}
    for stream, version, kind, data in writes.appends:
        streams.setdefault(stream, []).append((version, kind, data))
    rows = []
    for stream, written in streams.items():
        events = [NewEvent(uuid4(), kind, data, meta) for _, kind, data in written]
        uow.events.append(stream, written[0][0], events)
        version, _, data = written[-1]
        rows.append(resource_row(data, version + 1, now))
    defer_resources(uow.events.defer, rows)
    if writes.ledger:
        uow.record(writes.ledger)
    if touched := reconcile_clusters(writes):
        uow.publish([OutboxMessage(uuid4(), RECONCILE_CLUSTER, {"cluster": c}) for c in touched])


def _stream(row: WorkloadRow) -> str:
    return stream_name("Workload", row.namespace, row.name)


def _status(out: CycleWrites, row: WorkloadRow) -> lifecycle.Status:
    """``row``'s status as this cycle's writes so far leave it."""
    found = out.current.get(row.key)
    return lifecycle.Status(row.status if found is None else found[1])


def _write(out: CycleWrites, row: WorkloadRow, change: lifecycle.Transition) -> None:
    """Append ``change``'s event for ``row``. Units of one workload changed
    alike in one cycle are one event naming them (``replicas``): each event
    carries the workload's whole state, so an event per unit would write as
    the square of the units (a Deployment of 1,000 replicas admitted at once:
    a quarter of a billion bytes); each unit keeps its own ledger entry."""
    version, _, last = out.current.get(row.key, (row.version, row.status, -1))
    data = row.state(change.status.to_json(), change.spec)
    out.ledger += change.entries
    if change.replica is not None:
        before = out.appends[last] if last >= 0 else None
        if before is not None and before[2] == change.event and "replicas" in before[3]:
            data["replicas"] = [*before[3]["replicas"], change.replica]
            out.appends[last] = (before[0], before[1], change.event, data)
            out.current[row.key] = (version, change.status.to_json(), last)
            return
        data["replicas"] = [change.replica]
    out.appends.append((_stream(row), version, change.event, data))
    out.current[row.key] = (version + 1, change.status.to_json(), len(out.appends) - 1)


def _admit(
    out: CycleWrites,
    row: WorkloadRow,
    decision: AdmissionDecision,
    now: datetime,
    replica: int | None = None,
) -> None:
    borrowed: dict[str, dict[str, int]] = {}
    for (flavor, resource), amount in decision.borrowed.items():
        borrowed.setdefault(flavor, {})[resource] = amount
    subject, status = lifecycle.Subject.of(row), _status(out, row)
    admission = admission_to_status(decision, now)
    with_preemption = bool(decision.preempted)
    if replica is None:
        change = lifecycle.admit(
            subject, status, admission, borrowed=borrowed, with_preemption=with_preemption, now=now
        )
    else:
        change = lifecycle.admit_unit(
            subject,
            status,
            replica,
            admission,
            borrowed=borrowed,
            with_preemption=with_preemption,
            now=now,
        )
        out.clusters.add(decision.admission.cluster)
    _write(out, row, change)
    out.admitted += 1
    queued = timestamp(row.status.get("queuedAt"), row.created_at.timestamp())
    out.waits.append((decision.cluster_queue, max(0.0, now.timestamp() - queued)))


def _cohort_path(path: str) -> list[str]:
    """``/root/mid/cq`` → ``["mid", "root"]``: cohorts from the ClusterQueue up."""
    parts = [p for p in path.split("/") if p]
    return list(reversed(parts[:-1]))


def _preempt(
    out: CycleWrites,
    row: WorkloadRow,
    preemption: Preemption,
    now: datetime,
    replica: int | None = None,
) -> None:
    subject, status = lifecycle.Subject.of(row), _status(out, row)
    if replica is not None:
        out.clusters.update(_unit_cluster(status, replica))
    change = (
        lifecycle.preempt(subject, status, **_preemption(preemption, now))
        if replica is None
        else lifecycle.preempt_unit(subject, status, replica, **_preemption(preemption, now))
    )
    _write(out, row, change)
    out.preempted += 1


def _unit_cluster(status: lifecycle.Status, replica: int) -> set[str]:
    """The member cluster where ``replica``'s unit runs (none if unknown)."""
    cluster = ((status.unit(replica) or {}).get("admission") or {}).get("cluster")
    return {str(cluster)} if cluster else set()


def _preemption(preemption: Preemption, now: datetime) -> dict[str, Any]:
    return {
        "reason": preemption.reason,
        "message": preemption.message,
        "preemptor": preemption.preemptor,
        "preemptor_cluster_queue": preemption.preemptor_cluster_queue,
        "cohort_path": _cohort_path(preemption.victim_path),
        "now": now,
        "work_destroyed": preemption.work_destroyed,
        "budgeted": preemption.budgeted,
    }


def _evict(
    out: CycleWrites,
    row: WorkloadRow,
    eviction: Eviction,
    now: datetime,
    replica: int | None = None,
) -> None:
    """Pods-ready timeout (requeued with backoff, or deactivated past its
    limit) or a stopped queue draining; a unit is pending again at once."""
    if replica is not None:
        status = _status(out, row)
        out.clusters.update(_unit_cluster(status, replica))
        change = lifecycle.evict_unit(
            lifecycle.Subject.of(row),
            status,
            replica,
            reason=eviction.reason,
            message=eviction.message,
            now=now,
        )
        _write(out, row, change)
        out.evicted += 1
        return
    requeue_state = None
    if eviction.requeue_state is not None:
        at = eviction.requeue_state.requeue_at
        requeue_state = {
            "count": eviction.requeue_state.count,
            "requeueAt": datetime.fromtimestamp(at, UTC).isoformat() if at is not None else None,
        }
    change = lifecycle.evict(
        lifecycle.Subject.of(row),
        _status(out, row),
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
    """A pending workload's reason; an admitted serving workload's for its
    waiting units (without the pending condition: it holds quota)."""
    current = _status(out, row)
    status = current.raw
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
    if current.state != PENDING:
        change = lifecycle.pend_units(current, reason.reason, message, now)
    else:
        change = lifecycle.pend(
            current,
            reason.reason,
            message,
            reason.cluster_queue,
            now,
            cause=reason.cause,
            fragmentation=_fragmentation(reason.fragmentation),
        )
    _write(out, row, change)
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
