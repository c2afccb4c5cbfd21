"""Collect what Quartermaster wrote on a member cluster an admin deleted.

The delete request only records ``ResourceDeleted`` (the API refuses it
while gangs are admitted, running or cancelling there); the deleted row
keeps the Cluster's spec and its credentials, encrypted, as they were. The
fleet loop (the admission leader) then sweeps the member with them: our
jobs and serving objects (their pods and member Workloads follow by
owner), then LocalQueues,
ClusterQueues, ResourceFlavors and WorkloadPriorityClasses — every object
that carries our managed label and this registration's uid (or no uid:
written before the label existed), never one another registration of the
same member wrote. Namespaces stay: they may hold what is not ours.

An attempt that cannot reach the member, or leaves objects terminating, is
retried with backoff (from the resync interval up to a quarter lease) until
four leases have passed since the first. Each attempt is an event on the
Cluster's stream with ``status.collection``: ``state`` (``Collecting``, then
``Collected`` or ``Failed``), ``attempts``, ``startedAt``,
``nextAttemptAt``, ``lastError`` (our own words or an exception's type: never
a member's answer body or anything built from credentials), ``removed``,
``left``, ``requeued``. The final event drops the credentials from the read
model.

Gangs still tied to the cluster — evicted from it and waiting for their job
to go, or admitted there by a cycle that read before the delete — are
requeued whole once their jobs are gone, or when the collection gives up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from service.app.kinds import COLLECTION_ENDED
from service.app.uow import SqlUnitOfWork
from service.domain.events import CLUSTER_COLLECTED, CLUSTER_COLLECTING, CLUSTER_COLLECTION_FAILED
from service.domain.times import parse_time, rfc3339
from service.eventstore.port import ConcurrencyConflict
from workers.clusters import Member, MemberError
from workers.metering import Meter
from workers.plan import (
    CLUSTER_UID_LABEL,
    GROUP_KIND,
    MANAGED,
    QUEUE_KINDS,
    RUN_KINDS,
    SERVING_JOB_KINDS,
    VOLCANO_QUEUE_KINDS,
    WORKLOAD_ANNOTATION,
    Ref,
    close_command,
)
from workers.records import ClusterRow, append_cluster, load
from workers.settings import WorkerSettings
from workers.sync import last_seen, requeue

log = logging.getLogger(__name__)

ACTOR = "system:collect"
COLLECTING, COLLECTED, FAILED = CLUSTER_COLLECTING, CLUSTER_COLLECTED, CLUSTER_COLLECTION_FAILED
FINAL = COLLECTION_ENDED
REASON = "ClusterDeleted"
#: What we remove, in this order: jobs and serving objects first, then the
#: queues they used.
SWEPT = (*RUN_KINDS, *QUEUE_KINDS)
#: The same on a Volcano member: jobs, their PodGroups, then Queues and
#: PriorityClasses.
VOLCANO_SWEPT = (*RUN_KINDS, GROUP_KIND, *VOLCANO_QUEUE_KINDS)
_SHOWN = 50

Connect = Callable[[ClusterRow], Member]
UnitOfWork = Callable[[], SqlUnitOfWork]


@dataclass(frozen=True)
class CollectPolicy:
    first_backoff: float
    max_backoff: float
    deadline: float

    @classmethod
    def of(cls, settings: WorkerSettings) -> CollectPolicy:
        """From the fleet's own pace: retry from one resync interval, up to
        a quarter lease apart, for four leases (an hour by default)."""
        lease = settings.cluster_lease
        first = settings.resync_interval
        return cls(first, max(first, lease / 4), 4 * lease)

    def backoff(self, attempts: int) -> float:
        return float(min(self.max_backoff, self.first_backoff * 2 ** min(attempts - 1, 30)))


@dataclass
class CollectReport:
    cluster: str
    state: str = "Collecting"
    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    error: str | None = None
    #: Not written: the event conflicted with another change (next pass).
    conflicted: bool = False

    @property
    def final(self) -> bool:
        return self.state in FINAL


def waiting(rows: Iterable[ClusterRow]) -> list[ClusterRow]:
    """Deleted Clusters whose collection has not ended."""
    return [
        r
        for r in rows
        if r.deleted and (r.status.get("collection") or {}).get("state") not in FINAL
    ]


def due(row: ClusterRow, now: datetime) -> bool:
    at = parse_time((row.status.get("collection") or {}).get("nextAttemptAt"))
    return at is None or now >= at


def _ours(obj: Mapping[str, Any], uid: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(CLUSTER_UID_LABEL, uid) == uid)


def _closed(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("state") == "Closed")


def sweep(
    member: Member, uid: str, backend: str = "kueue"
) -> tuple[list[str], list[Mapping[str, Any]]]:
    """Delete every object of ours there (jobs first); what was deleted, and
    what is still there afterwards (terminating, or held by a finalizer).
    Volcano deletes only a Closed Queue: an open one of ours is asked to
    close and deleted by a later attempt, once its groups are gone."""
    removed: list[str] = []
    swept = VOLCANO_SWEPT if backend == "volcano" else SWEPT
    for kind in swept:
        for obj in _listed(member, kind):
            if not _ours(obj, uid) or (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue
            if backend == "volcano" and kind == "Queue" and not _closed(obj):
                member.apply(close_command(obj))
                continue
            member.delete(Ref.of(obj))
            removed.append(str(Ref.of(obj)))
    left: list[Mapping[str, Any]] = [
        o for kind in swept for o in _listed(member, kind) if _ours(o, uid)
    ]
    return removed, left


def _listed(member: Member, kind: str) -> list[dict[str, Any]]:
    """Our objects of ``kind`` there. A serving kind an older member role
    does not grant (403) holds none of ours: the role that would have
    created them is the same (as workers/reconcile.py reads it)."""
    try:
        return member.list_objects(kind, MANAGED)
    except MemberError as error:
        if kind in SERVING_JOB_KINDS and error.status == 403:
            return []
        raise


def _error(error: Exception) -> str:
    """What may be recorded of a failure: a MemberError's own message (the
    cluster, the request and the HTTP status), else only the exception's
    type — a decryption or kubeconfig error can quote the credentials."""
    if isinstance(error, MemberError):
        return str(error)[:500]
    return type(error).__name__


def collect(
    engine: Engine,
    unit_of_work: UnitOfWork,
    row: ClusterRow,
    connect: Connect,
    policy: CollectPolicy,
    now: datetime,
) -> CollectReport:
    """One attempt at the deleted ``row``, recorded in its own transaction."""
    report = CollectReport(row.name)
    previous = dict(row.status.get("collection") or {})
    started = parse_time(previous.get("startedAt")) or now
    attempts = int(previous.get("attempts") or 0) + 1
    left: list[Mapping[str, Any]] = []
    try:
        member = connect(row)
        report.removed, left = sweep(member, row.uid, row.backend)
        if not left:  # its pods, ended, wait for what they ran to be read: docs/billing.md
            Meter(member, engine, lambda: now).let_go()
    except Exception as error:  # every failure is retried, and recorded without secrets
        report.error = _error(error)
    report.left = sorted(str(Ref.of(o)) for o in left)
    if report.error is None and not left:
        report.state = "Collected"
    elif (now - started).total_seconds() >= policy.deadline:
        report.state = "Failed"
    _, rows, _ = load(engine, row.name)
    if report.state != "Failed":
        # A gang goes back to the queue once its job is gone (or, giving up,
        # when nothing more can be learnt of it): never beside its old job.
        busy = {_workload(o) for o in left if o.get("kind") in RUN_KINDS}
        rows = [w for w in rows if report.error is None and w.key not in busy]
    collection: dict[str, Any] = {
        "state": report.state,
        "attempts": attempts,
        "startedAt": rfc3339(started),
        "lastAttemptAt": rfc3339(now),
        "removed": int(previous.get("removed") or 0) + len(report.removed),
        "left": report.left[:_SHOWN],
        "requeued": sorted(previous.get("requeued") or ()),
    }
    if report.error is not None:
        collection["lastError"] = report.error
    if not report.final:
        # Sub-second precision: backoffs in tests are fractions of a second.
        at = now + timedelta(seconds=policy.backoff(attempts))
        collection["nextAttemptAt"] = at.astimezone(UTC).isoformat().replace("+00:00", "Z")
    kind = {"Collected": COLLECTED, "Failed": FAILED}.get(report.state, COLLECTING)

    def write(uow: SqlUnitOfWork) -> None:
        message = f"Cluster {row.name} was deleted"
        report.requeued, entries = requeue(
            uow, row.name, rows, REASON, message, ACTOR, now, last_seen(row)
        )
        collection["requeued"] = sorted({*collection["requeued"], *report.requeued})
        status = {**row.status, "collection": collection}
        append_cluster(uow, row, kind, status, ACTOR, now, entries, keep_secret=not report.final)

    try:
        with unit_of_work() as uow:
            write(uow)
            uow.commit()
    except ConcurrencyConflict:
        report.conflicted = True
        log.info("collection of %s: its records moved on; next pass", row.name)
        return report
    _log(report, attempts)
    return report


def _workload(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(WORKLOAD_ANNOTATION))


def _log(report: CollectReport, attempts: int) -> None:
    if report.state == "Collected":
        log.info("deleted cluster %s collected: %d objects", report.cluster, len(report.removed))
    elif report.state == "Failed":
        log.warning(
            "collection of deleted cluster %s given up after %d attempts (%s); %d objects left",
            report.cluster,
            attempts,
            report.error or "objects left",
            len(report.left),
        )
    else:
        log.info(
            "collection of deleted cluster %s: attempt %d, %s",
            report.cluster,
            attempts,
            report.error or f"{len(report.left)} objects still there",
        )


__all__ = [
    "COLLECTED",
    "COLLECTING",
    "FAILED",
    "CollectPolicy",
    "CollectReport",
    "collect",
    "due",
    "sweep",
    "waiting",
]
