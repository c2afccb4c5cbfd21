"""Sync one member cluster back into the centre: Nodes → the Cluster's
inventory and heartbeat; our jobs → workload events (Running, Finished with
its ledger entry, Evicted by the member); silence past the lease → Lost, its
gangs requeued whole.

Shapes are those documented in service/app/admission/__init__.py. Each change is one
event carrying the object's whole new state, with its read-model row, in the
caller's unit of work (workers/records.py).

A job is only ever read back for the admission that created it (its
``quartermaster.dev/admission`` label): a job left behind on a cluster that
was lost, whose gang has since run elsewhere, reports nothing — reconcile
removes it — so nothing is counted or finished twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

from sqlalchemy import Engine

from service.app import lifecycle
from service.app.admission import WorkloadRow
from service.app.lifecycle import Status, Subject
from service.app.uow import SqlUnitOfWork
from service.app.workloads import Problems, pod_requests
from service.domain.quantity import format_amount
from service.domain.times import parse_time, rfc3339
from service.eventstore.port import ConcurrencyConflict
from service.ledger import entries as ledger
from service.ledger.chain import NewLedgerEntry
from workers import fence
from workers.clusters import Member, MemberError
from workers.plan import (
    ADMISSION_LABEL,
    CHECKPOINT_ANNOTATION,
    MANAGED,
    RUNS_HERE,
    SERVING_JOB_KINDS,
    UID_ANNOTATION,
    WORKLOAD_ANNOTATION,
    ClusterView,
    WorkloadView,
    admission_id,
    job_kinds,
    member_status,
    tier_one_islands,
    volcano_status,
)
from workers.plan.serving import admission_label, available, is_serving, parts
from workers.reconcile import managed
from workers.records import (
    ClusterRow,
    append_cluster,
    append_workload,
    load,
    one_ledger_append,
    wake,
)

log = logging.getLogger(__name__)

ACTOR = "system:sync"
SYNCED, LOST = "ClusterSynced", "ClusterLost"
RUNNING, FINISHED, EVICTED = "WorkloadRunning", "WorkloadFinished", "WorkloadEvicted"
DISPATCHED = "WorkloadDispatched"
GPU_SUFFIX = "gpu"

Connect = Callable[[ClusterRow], Member]


@dataclass
class SyncReport:
    cluster: str
    reachable: bool = True
    heartbeat: bool = False
    lost: bool = False
    returned: bool = False
    events: list[tuple[str, str]] = field(default_factory=list)  # (workload, event type)
    #: Seconds from admission to the job's creation, of gangs first seen here.
    lags: list[float] = field(default_factory=list)
    #: The centre's heartbeat Lease was written on the member (workers/fence.py).
    fence_renewed: bool = False


# -- nodes → inventory -----------------------------------------------------------------------


def _flavor_of(labels: Mapping[str, str], flavors: Mapping[str, Mapping[str, Any]]) -> str | None:
    for name, spec in sorted(flavors.items()):
        wanted = spec.get("nodeLabels") or {}
        if wanted and all(labels.get(k) == str(v) for k, v in wanted.items()):
            return name
    return None


def reserved(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """What pods we do not manage take, per node: ``{node: {resource: quantity}}``
    (bound and not terminated; requests as the scheduler counts them)."""
    totals: dict[str, dict[str, int]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        bucket = totals.setdefault(str(node), {})
        for resource, amount in pod_requests(pod, "", Problems()).items():
            bucket[resource] = bucket.get(resource, 0) + amount
    return {
        node: {r: format_amount(r, a) for r, a in sorted(amounts.items()) if a}
        for node, amounts in totals.items()
    }


def inventory(
    cluster: str,
    nodes: Iterable[Mapping[str, Any]],
    view: ClusterView,
    taken: Mapping[str, Mapping[str, str]] | None = None,
    hypernodes: Mapping[str, str] | None = None,
) -> list[Any]:
    """The inventory nodes (admission.py's shape) of the nodes that carry a
    flavor's labels; the rest are not ours to schedule on. ``taken``: what
    pods we do not manage reserve per node; ``hypernodes``: a Volcano
    member's tier-1 HyperNode of each node, its island there (marked
    ``islandFrom: HyperNode``), else the island label's value."""
    taken = taken or {}
    hypernodes = hypernodes or {}
    out = []
    for node in nodes:
        meta, spec, status = (
            node.get("metadata") or {},
            node.get("spec") or {},
            node.get("status") or {},
        )
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        flavor = _flavor_of(labels, view.flavors)
        if flavor is None:
            continue
        topology = view.topologies.get(str(view.flavors[flavor].get("topologyName") or "")) or {}
        levels = topology.get("levels") or ()
        island = labels.get(str(levels[0]["nodeLabel"])) if levels else None
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or ()
        )
        hypernode = hypernodes.get(str(meta["name"])) if levels else None
        extra = {"islandFrom": "HyperNode"} if hypernode else {}
        out.append(
            {
                **extra,
                "name": meta["name"],
                "flavor": flavor,
                "island": hypernode or island or f"{cluster}-{flavor}",
                "allocatable": {
                    k: v for k, v in (status.get("allocatable") or {}).items() if k != "pods"
                },
                "reserved": dict(taken.get(str(meta["name"])) or {}),
                "labels": labels,
                "taints": [
                    {k: t[k] for k in ("key", "value", "effect") if k in t}
                    for t in spec.get("taints") or ()
                ],
                "ready": ready,
                "unschedulable": bool(spec.get("unschedulable", False)),
            }
        )
    return sorted(out, key=lambda n: n["name"])


# -- the pass --------------------------------------------------------------------------------


UnitOfWork = Callable[[], SqlUnitOfWork]


Write = Callable[[SqlUnitOfWork], None]
#: Collects one workload's change: ``(workload, event type)`` and its write.
Change = Callable[[tuple[str, str], Write], None]
#: Workload changes of one pass written in one transaction, at most.
BATCH = 200


def _write_all(
    unit_of_work: UnitOfWork, report: SyncReport, changes: list[tuple[tuple[str, str], Write]]
) -> None:
    """The pass's workload changes, up to ``BATCH`` in one transaction: one
    commit (and one turn at the ledger's tip) for many finished gangs rather
    than one each, which under churn could not keep up with what finished
    (quota stayed held, and admission stalled). A batch that conflicts (one
    of its workloads moved on since the pass read it) is written again one
    change at a time, each conflict skipped for the next pass."""
    for start in range(0, len(changes), BATCH):
        batch = changes[start : start + BATCH]
        if len(batch) > 1:
            try:
                with unit_of_work() as uow:
                    with one_ledger_append(uow):
                        for _, write in batch:
                            write(uow)
                    uow.commit()
            except ConcurrencyConflict:
                log.info("%d changes of one batch moved on under sync; one by one", len(batch))
            else:
                report.events += [what for what, _ in batch]
                continue
        for what, write in batch:
            _write(unit_of_work, report, what, write)


def _write(
    unit_of_work: UnitOfWork,
    report: SyncReport,
    what: tuple[str, str],
    write: Write,
) -> bool:
    """One change in its own transaction: a change that conflicts (the
    object moved on since it was read) is skipped, the next pass sees it
    again, and no other change waits on it."""
    try:
        with unit_of_work() as uow:
            write(uow)
            uow.commit()
    except ConcurrencyConflict:
        log.info("%s %s changed under sync; next pass", *what)
        return False
    report.events.append(what)
    return True


def sync(
    engine: Engine,
    unit_of_work: UnitOfWork,
    cluster: str,
    connect: Connect,
    *,
    lease: float,
    heartbeat_interval: float,
    pods_ready: bool = False,
    fencing: fence.FencePolicy = fence.NO_FENCE,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> SyncReport:
    """One list pass over ``cluster``. The heartbeat commits on its own (it
    never waits on a workload that moved on), then the centre's heartbeat
    Lease is renewed on the member within the promise that heartbeat
    recorded (``fencing``: workers/fence.py), then the workloads' changes
    (in batches: ``_write_all``). ``pods_ready``:
    record ``podsReady: false`` on a dispatched gang not yet running, so that
    waitForPodsReady can time it out."""
    report = SyncReport(cluster)
    row, rows, view = load(engine, cluster)
    if row is None or row.deleted:
        return report
    try:
        member = connect(row)
        nodes, member_time = member.dated_nodes()
        foreign = member.pods(f"!{ADMISSION_LABEL}")
        # Only the kinds of the gangs read above: a job of another kind has
        # no row here, and sync would pass it over.
        backend = _backend(row, member)
        jobs = managed(member, job_kinds(r.spec for r in rows))
        volcano = (row.spec.get("backend") or backend) == "volcano"
        hypernodes: dict[str, str] = {}
        if volcano:
            owners = _groups(member.list_objects("PodGroup", MANAGED))
            hypernodes = tier_one_islands(member.list_objects("HyperNode"), nodes)
        else:
            owners = _owners(member.list_objects("Workload"))
    except MemberError as error:
        report.reachable = False
        log.info("%s unreachable: %s", cluster, error)
        _check_lease(unit_of_work, row, rows, lease, clock(), report, fencing)
        return report
    agent = _agent(member, fencing)
    now = clock()
    nodes_now = inventory(cluster, nodes, view, reserved(foreign), hypernodes)
    fenced = fence.status(row.status.get("fence"), agent, fencing, now)
    if _heartbeat(
        unit_of_work, row, nodes_now, fenced, heartbeat_interval, now, report, member_time, backend
    ):
        promise = fenced
    else:
        promise = row.status.get("fence") or {}
    _renew(member, fencing, promise, clock, report)
    by_key = {r.key: r for r in rows}
    changes: list[tuple[tuple[str, str], Write]] = []
    for job in jobs:
        _job(
            lambda what, write: changes.append((what, write)),
            cluster,
            job,
            owners,
            by_key,
            now,
            report,
            pods_ready,
            volcano,
        )
    for workload in rows:
        _replicas(lambda what, write: changes.append((what, write)), cluster, workload, jobs, now)
    _write_all(unit_of_work, report, changes)
    return report


def _replicas(
    change: Change,
    cluster: str,
    row: WorkloadRow,
    objects: Sequence[Mapping[str, Any]],
    now: datetime,
) -> None:
    """A serving workload's replicas available on ``cluster``: summed over
    its member objects of the placements admitted here now (an object of a
    placement since left is going, and counts for nothing), each no more
    than admitted there; a missing object (deleted under us: reconcile
    makes it again) counts none."""
    workload = WorkloadView(row.namespace, row.name, row.uid, row.spec, row.status)
    if not is_serving(workload) and cluster not in (row.status.get("availableByCluster") or {}):
        return
    labels = {admission_label(workload, p.key): p.replicas for p in parts(workload, cluster)}
    count = 0
    for obj in objects:
        meta = obj.get("metadata") or {}
        label = str((meta.get("labels") or {}).get(ADMISSION_LABEL, ""))
        mine = (meta.get("annotations") or {}).get(UID_ANNOTATION) == row.uid
        if mine and label in labels and obj.get("kind") in SERVING_JOB_KINDS:
            count += min(available(obj), labels[label])
    transition = lifecycle.replicas_available(Status(row.status), cluster, count, now)
    if transition is not None:
        _change(change, row.key, row, transition, now)


def asks_discovery(row: ClusterRow) -> bool:
    """Whether sync asks the member which backend it serves: only when the
    registration names none, and none was recorded yet or the member was
    lost (it may come back rebuilt, e.g. with Volcano instead of Kueue;
    its gangs were requeued, so nothing of ours runs there meanwhile)."""
    if row.spec.get("backend"):
        return False
    return not row.status.get("backend") or row.state == "Lost"


def _backend(row: ClusterRow, member: Member) -> str | None:
    """The backend discovery finds (see :func:`asks_discovery`), else the
    one recorded (``status.backend``, written with the heartbeat: sync is
    the one writer of a Cluster's status); none when the registration names it."""
    if asks_discovery(row):
        return member.backend()
    recorded = row.status.get("backend")
    return str(recorded) if recorded and not row.spec.get("backend") else None


def _groups(groups: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Any]:
    """A Volcano member's PodGroups of ours by (namespace, admission id): a
    group of an earlier admission of the same gang is never read as the new
    one's."""
    out = {}
    for group in groups:
        meta = group.get("metadata") or {}
        admission = str((meta.get("labels") or {}).get(ADMISSION_LABEL, ""))
        out[(str(meta.get("namespace")), admission)] = group
    return out


def _owners(workloads: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Any]:
    """Member Kueue Workloads by the (namespace, uid) of the job owning them:
    by uid, so that a workload of an earlier job of the same name (not yet
    collected) is never read as the new one's."""
    out = {}
    for w in workloads:
        meta = w.get("metadata") or {}
        for owner in meta.get("ownerReferences") or ():
            out[(str(meta.get("namespace")), str(owner.get("uid")))] = w
    return out


def _heartbeat(
    unit_of_work: UnitOfWork,
    row: ClusterRow,
    nodes: list[Any],
    fenced: Mapping[str, Any],
    interval: float,
    now: datetime,
    report: SyncReport,
    member_time: datetime | None = None,
    backend: str | None = None,
) -> bool:
    """Record the heartbeat (and with it ``status.fence``, the promise of
    heartbeat writes that lets the member's Lease be renewed: one per
    ``interval``, or when something an operator sees changed; and
    ``memberTime``, the member's own clock then, where a lost member's
    estimate of what ran ends; and ``backend``, what discovery found when
    the registration names none); whether it was written."""
    status = dict(row.status)
    last = parse_time(status.get("lastHeartbeat"))
    changed = (
        row.state != "Ready"
        or (status.get("inventory") or {}).get("nodes") != nodes
        or fence.settled(status.get("fence") or {}) != fence.settled(fenced)
        or (backend is not None and status.get("backend") != backend)
    )
    if not changed and last is not None and (now - last).total_seconds() < interval:
        return False
    entries: list[NewLedgerEntry] = []
    if row.state == "Lost":
        lost_at = parse_time((status.get("lost") or {}).get("at"))
        body = ledger.ClusterReturned(cluster=row.name, lost_at=lost_at)
        entries.append(ledger.new_entry(body, uuid4(), now))
    status.update(
        state="Ready", inventory={"nodes": nodes}, lastHeartbeat=rfc3339(now), fence=dict(fenced)
    )
    if member_time is not None:
        status["memberTime"] = rfc3339(member_time)
    if backend is not None:
        status["backend"] = backend

    def write(uow: SqlUnitOfWork) -> None:
        append_cluster(uow, row, SYNCED, status, ACTOR, now, entries)
        if changed:
            wake(uow)  # capacity came, went or returned

    if not _write(unit_of_work, report, (row.name, SYNCED), write):
        return False
    report.heartbeat = True
    report.returned = bool(entries)
    return True


def _agent(member: Member, fencing: fence.FencePolicy) -> Mapping[str, Any] | None:
    """The fence agent's report; one we cannot read (say, our role may not
    list Leases) is no agent, never an unreachable member."""
    if fencing.seconds <= 0:
        return None
    try:
        return fence.agent_lease(member)
    except MemberError as error:
        log.warning("%s: fence agent's lease unreadable: %s", member.name, error)
        return None


def _renew(
    member: Member,
    fencing: fence.FencePolicy,
    promise: Mapping[str, Any],
    clock: Callable[[], datetime],
    report: SyncReport,
) -> None:
    """The centre's heartbeat on the member, only while the promise in
    Postgres covers the whole attempt: a write that could land later than
    ``writableUntil`` would let the agent fence later than the centre
    requeues."""
    now = clock()
    if fencing.seconds <= 0 or not fence.may_write(promise, fencing.attempt, now):
        return
    try:
        fence.renew(member, fencing.seconds, now)
    except MemberError as error:
        log.warning("%s: heartbeat lease not renewed: %s", member.name, error)
        return
    report.fence_renewed = True


def _job(
    change: Change,
    cluster: str,
    job: Mapping[str, Any],
    owners: Mapping[tuple[str, str], Any],
    rows: Mapping[str, WorkloadRow],
    now: datetime,
    report: SyncReport,
    pods_ready: bool,
    volcano: bool = False,
) -> None:
    meta = job.get("metadata") or {}
    key = str((meta.get("annotations") or {}).get(WORKLOAD_ANNOTATION, ""))
    row = rows.get(key)
    if row is None:
        return
    state = str(row.status.get("state", "Pending"))
    workload = WorkloadView(row.namespace, row.name, row.uid, row.spec, row.status)
    if state not in RUNS_HERE or workload.admission.get("cluster") != cluster:
        return
    if (meta.get("labels") or {}).get(ADMISSION_LABEL) != admission_id(workload):
        return  # a job of an earlier admission: stale, reconcile removes it
    if volcano:  # its PodGroup, by admission
        group = owners.get((str(meta.get("namespace")), admission_id(workload)))
        seen = volcano_status(job, group)
    else:  # its member Kueue Workload, by owner
        seen = member_status(job, owners.get((str(meta.get("namespace")), str(meta.get("uid")))))
    phase = seen["phase"]
    if state == "Admitted" and (phase != "Pending" or pods_ready) and "podsReady" not in row.status:
        created = parse_time(meta.get("creationTimestamp"))
        admitted = parse_time(workload.admission.get("admittedAt"))
        if created is not None and admitted is not None:
            report.lags.append(max(0.0, (created - admitted).total_seconds()))
    if phase == "Running" and state == "Admitted":
        started = str(seen.get("at") or rfc3339(now))
        _change(change, key, row, lifecycle.run(Status(row.status), started, now), now)
    elif (
        phase == "Pending" and state == "Admitted" and pods_ready and "podsReady" not in row.status
    ):
        at = str(meta.get("creationTimestamp") or rfc3339(now))
        _change(change, key, row, lifecycle.dispatch(Status(row.status), at, now), now)
    elif phase in ("Succeeded", "Failed"):
        finished = lifecycle.finish(
            Subject.of(row),
            Status(row.status),
            succeeded=phase == "Succeeded",
            reason=str(seen["reason"]),
            finished_at=parse_time(seen.get("at")) or now,
            now=now,
            kind=str(job.get("kind") or "Job"),
        )
        _change(change, key, row, finished, now)
    elif phase == "Evicted":
        # Evicted by the member (node failure and the like): quota released
        # at once; reconcile deletes the job and then requeues the gang whole.
        evicted = lifecycle.evict(
            Subject.of(row),
            Status(row.status),
            reason=str(seen["reason"]),
            message=str(seen.get("message") or "evicted by the member"),
            now=now,
        )
        _change(change, key, row, evicted, now)
    elif phase == "Running":
        _checkpoint(change, key, row, meta, now)


def _checkpoint(
    change: Change, key: str, row: WorkloadRow, meta: Mapping[str, Any], now: datetime
) -> None:
    """A running job's ``quartermaster.dev/last-checkpoint``, when newer than
    the one recorded (an unreadable one is ignored: nothing saved is known)."""
    at = parse_time((meta.get("annotations") or {}).get(CHECKPOINT_ANNOTATION))
    transition = lifecycle.checkpoint(Status(row.status), at, now) if at is not None else None
    if transition is not None:
        _change(change, key, row, transition, now)


def _change(
    change: Change, key: str, row: WorkloadRow, transition: lifecycle.Transition, now: datetime
) -> None:
    status, entries = transition.status.to_json(), transition.entries

    def write(uow: SqlUnitOfWork) -> None:
        append_workload(uow, row, transition.event, status, ACTOR, now, entries)

    change((key, transition.event), write)


# -- cluster loss ----------------------------------------------------------------------------


def _check_lease(
    unit_of_work: UnitOfWork,
    row: ClusterRow,
    rows: Sequence[WorkloadRow],
    lease: float,
    now: datetime,
    report: SyncReport,
    fencing: fence.FencePolicy,
) -> None:
    if row.state == "Lost":
        _sweep_lost(unit_of_work, row, rows, now, report, fencing)
        return
    last = parse_time(row.status.get("lastHeartbeat")) or row.created_at
    if (now - last).total_seconds() <= lease:
        return
    if not fence.may_requeue(row.status.get("fence"), fencing, now):
        return  # its fence agent may not have stopped the gangs yet
    requeued: list[str] = []
    seen = last_seen(row, fencing)

    def write(uow: SqlUnitOfWork) -> None:
        requeued[:] = lose(uow, row, rows, last, now, seen)

    if not _write(unit_of_work, report, (row.name, LOST), write):
        return
    report.lost = True
    log.warning("cluster %s lost (silent since %s); requeued %s", row.name, last, requeued)


def _sweep_lost(
    unit_of_work: UnitOfWork,
    row: ClusterRow,
    rows: Sequence[WorkloadRow],
    now: datetime,
    report: SyncReport,
    fencing: fence.FencePolicy,
) -> None:
    """Requeue what a Lost cluster still holds, as its loss requeued the
    rest: a gang whose admission there committed while the loss was being
    written (the loss read it Pending), or one preempted there since, whose
    job's removal would otherwise be awaited from a member that is gone."""
    message = f"Cluster {row.name} is lost"
    seen = last_seen(row, fencing)

    def write_now(what: tuple[str, str], write: Write) -> None:
        _write(unit_of_work, report, what, write)

    for w in rows:
        change = lifecycle.lose_cluster(
            Subject.of(w), Status(w.status), row.name, "ClusterLost", message, now, seen
        )
        if change is None:
            continue
        log.warning("cluster %s is lost: %s left on it, requeued", row.name, w.key)
        _change(write_now, w.key, w, change, now)


def last_seen(row: ClusterRow, fencing: fence.FencePolicy = fence.NO_FENCE) -> lifecycle.Seen:
    """What the centre last saw of ``row``'s member: its own time at the last
    heartbeat recorded, and, when a reporting fence agent guards it, by when
    the agent had stopped our jobs at the latest (docs/fencing.md: the
    promise ``writableUntil`` plus the fence time and margin, by the
    centre's clock)."""
    status = row.status
    fenced = status.get("fence") or {}
    until = parse_time(fenced.get("writableUntil"))
    at_most = None
    if fenced.get("guaranteed") and until is not None and fencing.seconds > 0:
        at_most = until + timedelta(seconds=fencing.seconds + fencing.margin)
    return lifecycle.Seen(parse_time(status.get("memberTime")), at_most)


def lose(
    uow: SqlUnitOfWork,
    row: ClusterRow,
    rows: Sequence[WorkloadRow],
    last: datetime | None,
    now: datetime,
    seen: lifecycle.Seen | None = None,
) -> list[str]:
    """Mark ``row`` Lost and requeue its gangs whole (their quota released
    now: the centre cannot reach the jobs, and when the cluster returns the
    stale ones are removed before anything new runs there), with an
    estimate of what each ran there up to ``seen``."""
    message = f"Cluster {row.name} lost: no heartbeat since {last and rfc3339(last)}"
    requeued, entries = requeue(
        uow, row.name, rows, "ClusterLost", message, ACTOR, now, seen or last_seen(row)
    )
    lost = ledger.ClusterLost(cluster=row.name, last_heartbeat=last, requeued=sorted(requeued))
    entries.append(ledger.new_entry(lost, uuid4(), now))
    status = dict(row.status)
    status.update(state="Lost", lost={"at": rfc3339(now), "requeued": sorted(requeued)})
    append_cluster(uow, row, LOST, status, ACTOR, now, entries)
    return requeued


def requeue(
    uow: SqlUnitOfWork,
    cluster: str,
    rows: Sequence[WorkloadRow],
    reason: str,
    message: str,
    actor: str,
    now: datetime,
    seen: lifecycle.Seen | None = None,
) -> tuple[list[str], list[NewLedgerEntry]]:
    """Requeue whole every gang of ``rows`` that ``cluster`` holds (admitted,
    running; a cancelling one is Cancelled) or that was evicted from it and
    waits there; the ledger entries of the quota released (and of what
    each ran there, estimated up to ``seen``), for the caller to record
    with its own."""
    requeued: list[str] = []
    entries: list[NewLedgerEntry] = []
    for w in rows:
        change = lifecycle.lose_cluster(
            Subject.of(w), Status(w.status), cluster, reason, message, now, seen
        )
        if change is None:
            continue
        if change.status.state == lifecycle.CANCELLED:
            # Its own entry goes with its event: it is not requeued.
            append_workload(
                uow, w, change.event, change.status.to_json(), actor, now, change.entries
            )
            continue
        entries += change.entries
        append_workload(uow, w, change.event, change.status.to_json(), actor, now)
        requeued.append(w.key)
    return requeued, entries


__all__ = [
    "ACTOR",
    "LOST",
    "SYNCED",
    "SyncReport",
    "asks_discovery",
    "inventory",
    "last_seen",
    "lose",
    "requeue",
    "sync",
]
