"""Reconcile one member cluster with the centre's decisions: load, plan
(workers/plan.py, pure), carry out, record.

Order matters and is the point of this module:

1. delete jobs no longer desired (finished, evicted, preempted, cancelled,
   stale after a cluster loss) and wait until they are gone — a preemptor
   never starts beside its victims;
2. apply queue objects (Namespace, ResourceFlavors, ClusterQueue with the
   quota the centre admitted, LocalQueue) before the jobs that need them;
3. dispatch new jobs, and scale up a serving workload's member objects
   whose admitted replicas grew (scaled down in step 1, their pods gone
   before anything is dispatched, as a deleted job's);
4. collect queue objects nothing uses;
5. record: an evicted workload whose job is gone goes back to ``Pending``
   (``WorkloadRequeued``) so the cycle can admit it again; a cancelling one
   becomes ``Cancelled``.

Every member write is a server-side apply or a delete, idempotent, so a crash
anywhere repeats nothing harmful; the records are appended with the version
read, so a concurrent change makes the commit fail and the next pass redo it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine

from service.app import lifecycle
from service.app.lifecycle import Status, Subject
from service.app.resources import stream_name
from service.app.uow import SqlUnitOfWork
from workers.clusters import KINDS, Member, MemberError
from workers.metering import Meter, admission_ids, ended
from workers.plan import (
    ADMISSION_LABEL,
    GROUP_KIND,
    JOB_KINDS,
    MANAGED,
    RUN_KINDS,
    SERVING_JOB_KINDS,
    WORKLOAD_ANNOTATION,
    Actions,
    PlanMemo,
    Ref,
    job_kinds,
    member_status,
    plan,
)
from workers.records import (
    ClusterRow,
    append,
    append_workload,
    cluster_row,
    load,
    unchanged,
    workload_rows,
)

log = logging.getLogger(__name__)

ACTOR = "system:reconcile"
TOPIC = "reconcile.cluster"
REQUEUED = "WorkloadRequeued"
CANCELLED = "WorkloadCancelled"
_LISTED = (
    "Namespace",
    "WorkloadPriorityClass",
    "ResourceFlavor",
    "ClusterQueue",
    "LocalQueue",
    *JOB_KINDS,
)
#: What a pass lists on a Volcano member: its queue objects, the gangs'
#: PodGroups, the jobs.
_VOLCANO_LISTED = ("Namespace", "PriorityClass", "Queue", GROUP_KIND, *JOB_KINDS)


def listed(backend: str) -> tuple[str, ...]:
    """The kinds of ours a member of ``backend`` may hold, jobs last."""
    return _VOLCANO_LISTED if backend == "volcano" else _LISTED


Connect = Callable[[ClusterRow], Member]


@dataclass
class Report:
    cluster: str
    deleted: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    dispatched: list[str] = field(default_factory=list)
    #: Serving member objects scaled in place: ``Kind ns/name -> n``.
    scaled: list[str] = field(default_factory=list)
    collected: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    #: Workloads whose job the member refused, with its words.
    refused: dict[str, str] = field(default_factory=dict)
    #: Deletions still in progress: dispatch waits for the next pass.
    waiting: list[str] = field(default_factory=list)
    skipped: str | None = None


def _in_use(engine: Engine, cluster: str, backend: str = "kueue") -> tuple[str, ...]:
    """The queue kinds, and the job kinds of the gangs the centre has on
    ``cluster`` (read before the member is listed: a job of a kind not
    listed can only be one no pass has dispatched yet, since passes of a
    cluster never overlap, or a stray)."""
    with engine.connect() as conn:
        specs = [r.spec for r in workload_rows(conn, cluster)]
    return (*listed(backend)[: -len(JOB_KINDS)], *job_kinds(specs))


def _kinds(engine: Engine, row: ClusterRow, strays: bool) -> tuple[str, ...]:
    """What a pass lists: the kinds in use, or (looking for strays) every
    kind of ours. A cluster that was ever lost may hold jobs of gangs since
    requeued, of any kind, that must be gone before anything new runs: all
    are listed, the serving kinds with them (an older member role that does
    not grant them answers 403, and then holds none of ours: ``managed``)."""
    if strays or row.status.get("lost"):
        return (*listed(row.backend), *SERVING_JOB_KINDS)
    return _in_use(engine, row.name, row.backend)


def managed(member: Member, kinds: tuple[str, ...] = _LISTED) -> list[dict[str, Any]]:
    """Every object of ours on the member cluster. One that another object
    controls is that owner's, not a job of ours: KubeRay copies a RayJob's
    labels to the RayCluster it makes, which is no stray. A serving kind
    the workers' role may not list (403) holds none of ours: the role that
    would have created them is the same."""
    out: list[dict[str, Any]] = []
    for kind in kinds:
        try:
            found = member.list_objects(kind, MANAGED)
        except MemberError as error:
            if kind not in SERVING_JOB_KINDS or error.status != 403:
                raise
            continue
        out += [o for o in found if not _controlled(o)]
    return out


def _controlled(obj: Mapping[str, Any]) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(ref.get("controller") for ref in refs)


#: What this process's passes worked out of each cluster's gangs, for its
#: next pass (as records.ROWS keeps their rows): see PlanMemo.
PLACEMENTS = PlanMemo()


def reconcile(
    engine: Engine,
    uow: SqlUnitOfWork,
    cluster: str,
    connect: Connect,
    *,
    delete_wait: float = 30.0,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    strays: bool = True,
    memo: PlanMemo = PLACEMENTS,
) -> Report:
    """One pass over ``cluster``; its records are written in ``uow`` (the
    caller commits). ``strays=False``: list only the job kinds the centre's
    gangs there use (a pass asked for by an admission cycle; three kinds of
    four are usually empty, and each list is a round trip), leaving jobs of
    other kinds that nothing wants to the fleet loop's passes."""
    report = Report(cluster)
    row = cluster_row(engine, cluster)
    if row is None or row.deleted:
        report.skipped = "no such cluster"
        return report
    if row.state == "Lost":
        report.skipped = "lost"  # sync brings it back first
        return report
    member = connect(row)
    kinds = _kinds(engine, row, strays)
    # The member is read before the centre: a view older than the listing
    # would take a job that another pass dispatched meanwhile (for a gang
    # admitted after this view was read) for a stray, delete it, and the
    # next pass would dispatch the same admission again.
    actual = managed(member, kinds)
    row, rows, view = load(engine, cluster)
    if row is None or row.deleted or row.state == "Lost":
        report.skipped = "gone or lost meanwhile"
        return report
    actions = plan(view, actual, memo)
    meter = Meter(member, engine, clock, admission_ids(actual, rows))
    if strays:
        meter.sweep(_admission_of(o) for o in actual if o.get("kind") in RUN_KINDS)
    if actions.scale_down and _shrink(member, actions, report, delete_wait):
        return report
    if actions.draining:
        # What the pods ran is read before they go: recorded now if they
        # have all ended, else held until they have (workers/metering.py).
        # A serving object's pods are not held: what its replicas ran is
        # the centre's, by their admission and release (docs/serving.md).
        serving = _serving_labels(actual)
        meter.before_stop([a for a in actions.draining if a not in serving])
        _delete(member, actions, report, actual)
        running = _holding(actual, actions.draining)
        if running:
            # What the deleted jobs' pods hold must be free before anything
            # new starts: a preemptor never runs beside its victims. A pod
            # that has ended holds nothing (a held one waits for its record).
            jobs = [
                Ref.of(o)
                for o in actual
                if o.get("kind") in RUN_KINDS and _admission_of(o) in running
            ]
            gone = [r for r in jobs if r in actions.delete or _terminating(actual, r)]
            ids = sorted(a for a in running if a)  # a stray job may have none
            left = meter.wait_stopped(gone, ids, delete_wait)
            if left:
                report.waiting = left
                log.info("%s: waiting for %d deletions", cluster, len(left))
                return report
            meter.after_stop(ids)
            actual = managed(member, kinds)
            row, rows, view = load(engine, cluster)  # after the listing, as above
            if row is None or row.deleted or row.state == "Lost":
                report.skipped = "gone or lost meanwhile"
                return report
            actions = plan(view, actual, memo)
            _delete(member, actions, report, actual)
            still = _holding(actual, actions.draining)
            if still:  # deleted by someone else meanwhile, or newly preempted: next pass
                report.waiting = [f"admission {a}" for a in still]
                return report
    elif actions.delete:  # no job to drain: a stray PodGroup of ours, which holds no pod
        _delete(member, actions, report, actual)
    by_key = {r.key: r for r in rows}
    if actions.dispatch or actions.scale_up:
        _still_as_read(engine, actions, actual, by_key)
    _carry_out(member, actions, report)
    _record(uow, actions, by_key, report, clock())
    return report


def _still_as_read(
    engine: Engine, actions: Actions, actual: list[dict[str, Any]], rows: Mapping[str, Any]
) -> None:
    """A view read before a cycle preempted one of these must not start it
    beside its preemptor: dispatch (and scale up) only what is still as read."""
    up = [rows[_workload_of(_of(actual, ref))] for ref, _ in actions.scale_up]
    current = unchanged(engine, [*(rows[_workload_of(j)] for j in actions.dispatch), *up])
    actions.dispatch = [j for j in actions.dispatch if _workload_of(j) in current]
    actions.scale_up = [
        (ref, n) for ref, n in actions.scale_up if _workload_of(_of(actual, ref)) in current
    ]


#: Admission ids in one label selector (its request line stays a few kB).
DELETE_BATCH = 100


def _delete(member: Member, actions: Actions, report: Report, actual: list[dict[str, Any]]) -> None:
    """Delete ``actions.delete``: the jobs that carry an admission label
    no other listed object of their kind and namespace carries, by label
    selector, up to ``DELETE_BATCH`` a request; any other one by name."""
    labelled: dict[tuple[str, str, str], int] = {}
    for obj in actual:
        ref = Ref.of(obj)
        if admission := _admission_of(obj):
            key = (ref.kind, ref.namespace, admission)
            labelled[key] = labelled.get(key, 0) + 1
    by_name = {Ref.of(o): _admission_of(o) for o in actual}
    batches: dict[tuple[str, str], list[str]] = {}
    for ref in actions.delete:
        admission = by_name.get(ref, "")
        if ref.namespace and labelled.get((ref.kind, ref.namespace, admission)) == 1:
            batches.setdefault((ref.kind, ref.namespace), []).append(admission)
        else:
            member.delete(ref)
    for (kind, namespace), ids in sorted(batches.items()):
        for start in range(0, len(ids), DELETE_BATCH):
            chosen = ",".join(sorted(ids[start : start + DELETE_BATCH]))
            member.delete_labelled(kind, namespace, f"{MANAGED},{ADMISSION_LABEL} in ({chosen})")
    report.deleted += [str(ref) for ref in actions.delete]


def _of(actual: list[dict[str, Any]], ref: Ref) -> dict[str, Any]:
    return next(o for o in actual if Ref.of(o) == ref)


def _serving_labels(actual: list[dict[str, Any]]) -> set[str]:
    return {_admission_of(o) for o in actual if o.get("kind") in SERVING_JOB_KINDS}


def _shrink(member: Member, actions: Actions, report: Report, timeout: float) -> bool:
    """Scale down the serving objects whose admitted replicas fell, and wait
    (up to ``timeout``) until each runs no more pods than its new count
    allows: the replicas the centre released (preempted, scaled away) stop
    before anything is dispatched, as a deleted job's pods do. Whether some
    are still going (the pass ends there; the next one goes on)."""
    for ref, replicas in actions.scale_down:
        member.scale(ref, replicas)
        report.scaled.append(f"{ref} -> {replicas}")
    deadline = time.monotonic() + timeout
    while True:
        over = _over(member, actions.shrinking)
        if not over or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if over:
        report.waiting = [f"admission {a}: {n} pods over" for a, n in sorted(over.items())]
        log.info("%s: waiting for %d scale-downs", member.name, len(over))
    return bool(over)


def _over(member: Member, allowed: Mapping[str, int]) -> dict[str, int]:
    """Per admission label, how many more pods than ``allowed`` still run."""
    chosen = ",".join(sorted(allowed))
    pods = member.pods(f"{ADMISSION_LABEL} in ({chosen})")
    live: dict[str, int] = {}
    for pod in pods:
        if not ended(pod):
            live[_admission_of(pod)] = live.get(_admission_of(pod), 0) + 1
    return {a: live[a] - n for a, n in allowed.items() if live.get(a, 0) > n}


def _holding(actual: list[dict[str, Any]], draining: list[str]) -> list[str]:
    """The admissions among ``draining`` whose pods may still hold nodes:
    all but those whose job the member reports Succeeded (every pod of it
    completed). A job that finished must not hold back what is dispatched
    next: under steady churn some always have, and dispatch would wait on
    them pass after pass."""
    succeeded = {
        _admission_of(o)
        for o in actual
        if o.get("kind") in RUN_KINDS and member_status(o, None)["phase"] == "Succeeded"
    }
    return [a for a in draining if not a or a not in succeeded]


def _admission_of(obj: dict[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(ADMISSION_LABEL, ""))


def _workload_of(obj: dict[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(WORKLOAD_ANNOTATION))


def _terminating(actual: list[dict[str, Any]], ref: Ref) -> bool:
    return any(
        Ref.of(o) == ref and (o.get("metadata") or {}).get("deletionTimestamp") for o in actual
    )


#: Jobs dispatched at once: a pass that starts hundreds of gangs would
#: otherwise wait for the member one round trip after another.
DISPATCHERS = 8


def _dispatch(
    member: Member, obj: dict[str, Any], group: dict[str, Any] | None = None
) -> MemberError | None:
    """Apply one job, after its PodGroup on a Volcano member (its pods,
    created with the job, name the group that binds them)."""
    try:
        if group is not None:
            member.apply(group)
        member.apply(obj)
    except MemberError as error:
        return error
    return None


def _carry_out(member: Member, actions: Actions, report: Report) -> None:
    for obj in actions.apply:
        member.apply(obj)
        report.applied.append(str(Ref.of(obj)))
    with ThreadPoolExecutor(min(DISPATCHERS, max(1, len(actions.dispatch)))) as pool:
        outcomes = list(
            pool.map(
                lambda obj: _dispatch(member, obj, actions.groups.get(str(Ref.of(obj)))),
                actions.dispatch,
            )
        )
    for ref, replicas in actions.scale_up:
        member.scale(ref, replicas)
        report.scaled.append(f"{ref} -> {replicas}")
    failed: MemberError | None = None
    for obj, error in zip(actions.dispatch, outcomes, strict=True):
        if error is None:
            report.dispatched.append(str(Ref.of(obj)))
        elif error.refused:
            # Asking again will not help (the job is invalid there, or its
            # kind is not installed): the gang is evicted, not retried forever.
            log.warning("%s refused %s: %s %s", member.name, Ref.of(obj), error, error.body)
            report.refused[_workload_of(obj)] = f"{error} {error.body}".strip()[:1024]
        else:
            failed = failed or error
    if failed is not None:
        raise failed
    for ref in actions.collect:
        member.delete(ref)
        report.collected.append(str(ref))


def _record(
    uow: SqlUnitOfWork,
    actions: Actions,
    rows: dict[str, Any],
    report: Report,
    now: datetime,
) -> None:
    for key in actions.requeue:
        _apply(uow, rows[key], lifecycle.requeue(Status(rows[key].status), now), now)
        report.requeued.append(key)
    for key, message in report.refused.items():
        _refuse(uow, rows[key], message, now, report.cluster)
    for key in actions.cancelled:
        # Its job is gone from the member: the usage it held closes now (a
        # serving workload's replicas here: each its own close).
        row = rows[key]
        if isinstance(row.status.get(lifecycle.REPLICA_ADMISSIONS), list):
            change = lifecycle.cancel_replicas(
                Subject.of(row), Status(row.status), report.cluster, now
            )
        else:
            change = lifecycle.cancelled(Subject.of(row), Status(row.status), now)
        _apply(uow, row, change, now)
        report.cancelled.append(key)


def _apply(uow: SqlUnitOfWork, row: Any, change: lifecycle.Transition, now: datetime) -> None:
    status = change.status.to_json()
    if change.spec is None:
        append_workload(uow, row, change.event, status, ACTOR, now, change.entries)
        return
    stream = stream_name("Workload", row.namespace, row.name)
    data = row.state(status, change.spec)
    append(uow, stream, row.version, change.event, data, ACTOR, now, change.entries)


def _refuse(uow: SqlUnitOfWork, row: Any, message: str, now: datetime, here: str) -> None:
    """Evicted and deactivated: its quota released, never admitted again
    until someone fixes and reactivates it. A serving workload's every
    replica is released (the manifest its other objects run is the same)."""
    if isinstance(row.status.get(lifecycle.REPLICA_ADMISSIONS), list):
        words = f"cluster {here} refused the object: {message}"
        refused = lifecycle.refuse_replicas(
            Subject.of(row), Status(row.status), here, words, now, row.spec
        )
        _apply(uow, row, refused, now)
        return
    cluster = Status(row.status).cluster
    change = lifecycle.evict(
        Subject.of(row),
        Status(row.status),
        reason="DispatchFailed",
        message=f"cluster {cluster} refused the job: {message}",
        now=now,
        spec=row.spec,
        deactivate=True,
    )
    _apply(uow, row, change, now)


__all__ = ["ACTOR", "KINDS", "REQUEUED", "TOPIC", "Report", "listed", "managed", "reconcile"]
