"""The Workload lifecycle, one pure function per transition (as Kueue's
``pkg/workload``): each takes the workload's typed :class:`Status` and
returns a :class:`Transition` — the event type, the new status (and spec,
when it changes) and the ledger entry, if the transition writes one.

Every transition that ends holding capacity (finish, fail, preempt, evict,
cancel, cluster loss or deletion, pods-ready timeout, deactivation, a
member's refusal) closes the admission's usage in the ledger through
:func:`_close`, which is the idempotent guard: it writes an entry only
while the status still holds an admission, and the entry's id is derived
from that admission (:func:`closing_entry_id`), so a second close of the
same admission — a retry, or two paths racing — is not stored again by the
ledger. ``service.ledger.accounting.open_usage`` is the check that this
holds: the ledger's open usage equals what the members run. What the pods
*ran* is a ledger entry of its own (``workload.ran``, service/app/ran.py):
measured by the worker when it removes the job, or estimated here when a
cluster is lost (:func:`lose_cluster`).

A serving workload run as units has the same transitions per unit
(``admit_unit``, ``preempt_unit``, ``evict_unit``, ``release_replicas``,
and ``lose_cluster`` / ``cancelled`` for all of its units there): each
closes its own unit's admission, named by that admission's id.

Shapes are those documented in ``service/app/admission/__init__.py``. No I/O here:
callers (the admission cycle, submissions, reconcile, sync, cluster
collection) append ``event`` with ``status`` and record ``entries``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid4, uuid5

from service.app.ran import PodTimes, Seen, estimated_run, measured_run, ran_entry_id
from service.domain.quantity import canonical_amount
from service.domain.times import parse_time, rfc3339
from service.engine.types import PreemptionReason
from service.ledger import entries as ledger
from service.ledger.chain import NewLedgerEntry

Obj = dict[str, Any]
State = Literal["Pending", "Admitted", "Running", "Finished", "Evicted", "Cancelling", "Cancelled"]
PENDING, ADMITTED, RUNNING, FINISHED = "Pending", "Admitted", "Running", "Finished"
EVICTED, CANCELLING, CANCELLED = "Evicted", "Cancelling", "Cancelled"
#: Workload states that hold quota and capacity.
HOLDS_QUOTA = frozenset({ADMITTED, RUNNING, CANCELLING})
#: Event types, one per transition.
ADMITTED_EVENT, PREEMPTED_EVENT, EVICTED_EVENT = (
    "WorkloadAdmitted",
    "WorkloadPreempted",
    "WorkloadEvicted",
)
DISPATCHED_EVENT, RUNNING_EVENT, FINISHED_EVENT = (
    "WorkloadDispatched",
    "WorkloadRunning",
    "WorkloadFinished",
)
CANCELLED_EVENT, REQUEUED_EVENT = "WorkloadCancelled", "WorkloadRequeued"
CHECKPOINTED_EVENT = "WorkloadCheckpointed"
REPLICAS_AVAILABLE_EVENT = "WorkloadReplicasAvailable"
SCALED_EVENT = "WorkloadScaled"
#: A serving workload's per-replica admissions (docs/serving.md).
REPLICA_ADMISSIONS = "replicaAdmissions"
#: How much newer a checkpoint must be than the recorded one to be recorded.
CHECKPOINT_EVERY = timedelta(minutes=1)
SUBMITTED_EVENT, PENDING_EVENT = "WorkloadSubmitted", "WorkloadPending"
GPU_SUFFIX = "gpu"
#: What a pending status may tell beside its reason (see :func:`pend`).
PENDING_DETAIL_KEYS = ("pendingCause", "pendingFragmentation")
#: A serving workload's admitted units: ``[{replica, admission, admittedAt}]``
#: (``admission`` shaped as ``status.admission``), and their number.
REPLICA_ADMISSIONS, ADMITTED_REPLICAS = "replicaAdmissions", "admittedReplicas"
#: Names the closing entries of admissions stored before admissions had an id.
_LEGACY = UUID("6f0c5f3e-6a43-4c1b-9a57-3b1f1e2f7a10")


@dataclass(frozen=True)
class Status:
    """A Workload's ``status`` as a value: typed reads, copies for writes."""

    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> State:
        return str(self.raw.get("state", PENDING))  # type: ignore[return-value]

    @property
    def admission(self) -> Mapping[str, Any]:
        return self.raw.get("admission") or {}

    @property
    def cluster(self) -> str | None:
        cluster = self.admission.get("cluster")
        return str(cluster) if cluster else None

    @property
    def holds(self) -> bool:
        """Whether this status holds quota and capacity (an open usage)."""
        return self.state in HOLDS_QUOTA and bool(self.admission)

    @property
    def conditions(self) -> Sequence[Mapping[str, Any]]:
        return self.raw.get("conditions") or ()

    @property
    def holds_units(self) -> bool:
        """Whether a serving workload's units hold quota and capacity."""
        return self.state in HOLDS_QUOTA and bool(self.raw.get(REPLICA_ADMISSIONS))

    @property
    def units(self) -> list[Mapping[str, Any]]:
        """``replicaAdmissions``: a serving workload's admitted units, by replica."""
        return list(self.raw.get(REPLICA_ADMISSIONS) or ())

    def unit(self, replica: int) -> Mapping[str, Any] | None:
        return next((u for u in self.units if u.get("replica") == replica), None)

    def without(self, *keys: str) -> Obj:
        return {k: v for k, v in self.raw.items() if k not in keys}

    def to_json(self) -> Obj:
        return dict(self.raw)


@dataclass(frozen=True)
class Subject:
    """Who a transition is about: what ledger bodies name."""

    namespace: str
    name: str
    uid: str
    local_queue: str

    @classmethod
    def of(cls, row: Any) -> Subject:
        """From anything with ``namespace``, ``name``, ``uid`` and ``spec``."""
        return cls(row.namespace, row.name, str(row.uid), str(row.spec.get("queueName")))

    def names(self, cluster_queue: str) -> dict[str, str]:
        return {
            "namespace": self.namespace,
            "workload": self.name,
            "local_queue": self.local_queue,
            "cluster_queue": cluster_queue,
        }


@dataclass(frozen=True)
class Transition:
    event: str
    status: Status
    entry: NewLedgerEntry | None = None
    spec: Mapping[str, Any] | None = None
    #: Written with ``entry``: the estimate of what ran, for a lost member's gang.
    also: tuple[NewLedgerEntry, ...] = ()
    #: Of a serving workload's unit: the replica the transition is about
    #: (its event's data names it in ``replicas``, with the others of its
    #: workload that changed alike in the same write).
    replica: int | None = None

    @property
    def entries(self) -> list[NewLedgerEntry]:
        return [*([self.entry] if self.entry is not None else []), *self.also]


# --- shared pieces --------------------------------------------------------------------------


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    kind: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
) -> list[Obj]:
    """Kueue's conditions: one per type, its transition time kept while its status holds."""
    result: list[Obj] = []
    previous = None
    for condition in conditions:
        if condition.get("type") == kind:
            previous = condition
        else:
            result.append(dict(condition))
    since = (
        previous["lastTransitionTime"]
        if previous is not None and previous.get("status") == status
        else rfc3339(now)
    )
    result.append(
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }
    )
    return result


@functools.lru_cache(maxsize=4096)
def _amount(resource: str, quantity: str | int | float) -> int:
    return canonical_amount(resource, quantity)


def amounts(admission: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """``{flavor: {resource: amount}}`` that an admission (status shape) reserves."""
    reserved: dict[str, dict[str, int]] = {}
    for ps in admission.get("podSetAssignments") or ():
        usage = ps.get("resourceUsage") or {}
        for resource, flavor in (ps.get("flavors") or {}).items():
            amount = _amount(resource, usage[resource]) if resource in usage else 0
            bucket = reserved.setdefault(str(flavor), {})
            bucket[resource] = bucket.get(resource, 0) + amount
    return reserved


def closing_entry_id(uid: str, admission: Mapping[str, Any]) -> UUID:
    """The one id every close of ``admission`` carries: the ledger stores an
    id once, so a second close of the same admission writes nothing."""
    if admission.get("id"):
        return uuid5(UUID(str(admission["id"])), "closed")
    key = f"{uid}/{admission.get('cluster')}/{admission.get('admittedAt')}"
    return uuid5(_LEGACY, key)


def _close(
    subject: Subject, status: Status, body: ledger.Body, now: datetime
) -> NewLedgerEntry | None:
    """The entry that closes ``status``'s admission, or none if it holds none."""
    if not status.holds:
        return None
    return ledger.new_entry(body, closing_entry_id(subject.uid, status.admission), now)


def _estimate(
    subject: Subject, status: Status, cluster: str, seen: Seen | None, now: datetime
) -> NewLedgerEntry | None:
    """What ``status``'s admission ran on the lost ``cluster``, estimated
    (service/app/ran.py); None for an admission without an id."""
    admission = status.admission
    if not admission.get("id"):
        return None
    started = parse_time(status.raw.get("startedAt")) if status.raw.get("podsReady") else None
    pods = sum(int(p.get("count") or 1) for p in admission.get("podSetAssignments") or ())
    names = {
        **subject.names(str(admission.get("clusterQueue") or status.raw.get("clusterQueue"))),
        "cluster": cluster,
    }
    return estimated_run(names, str(admission["id"]), started, pods, amounts(admission), seen, now)


def _stopped(status: Status, reason: str, message: str, now: datetime) -> Obj:
    conditions = status.conditions
    for kind, value in (("Evicted", "True"), ("QuotaReserved", "False"), ("Admitted", "False")):
        conditions = set_condition(conditions, kind, value, reason, message, now)
    return {**status.without("admission"), "conditions": conditions}


def _consumed(
    reserved: Mapping[str, Mapping[str, int]], started: datetime, finished: datetime
) -> tuple[dict[str, dict[str, float]], float, float, float]:
    """``amount * seconds`` per flavor and resource, and GPU-, core- and GiB-seconds."""
    seconds = max(0.0, (finished - started).total_seconds())
    consumed = {
        flavor: {r: float(a) * seconds for r, a in resources.items()}
        for flavor, resources in reserved.items()
    }
    flat = [(r, a) for f in consumed.values() for r, a in f.items()]
    gpu = sum(a for r, a in flat if r.endswith(GPU_SUFFIX))
    cpu = sum(a for r, a in flat if r == "cpu") / 1000.0
    memory = sum(a for r, a in flat if r == "memory") / 2**30
    return consumed, gpu, cpu, memory


# --- taking capacity ------------------------------------------------------------------------


def submitted(cluster_queue: str, stamp: str) -> Status:
    """A new Workload's status: Pending until the next admission cycle.
    ``stamp`` is the submission time as RFC 3339 (formatted once per batch)."""
    return Status(
        {
            "state": PENDING,
            "clusterQueue": cluster_queue,
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "Waiting for the next admission cycle",
                    "lastTransitionTime": stamp,
                }
            ],
        }
    )


#: Status keys of a pending reason, dropped on admission and on a new reason without them.
_PENDING_KEYS = ("pendingReason", "pendingReasonCode", "pendingReasonAt", *PENDING_DETAIL_KEYS)


def pend(
    status: Status,
    reason: str,
    message: str,
    cluster_queue: str | None,
    now: datetime,
    *,
    cause: str | None = None,
    fragmentation: Mapping[str, Any] | None = None,
) -> Transition:
    """Pending for ``reason``: the cycle's words on why it waits (Kueue's
    ``QuotaReserved=False`` condition), and the ClusterQueue it waits in;
    ``cause`` and ``fragmentation`` when the engine tells more (a gang
    blocked only by fragmentation across islands: its numbers)."""
    new = {
        **status.without(*PENDING_DETAIL_KEYS),
        "pendingReason": message,
        "pendingReasonCode": reason,
        "pendingReasonAt": rfc3339(now),
        "conditions": set_condition(
            status.conditions, "QuotaReserved", "False", reason, message, now
        ),
    }
    if cluster_queue:
        new["clusterQueue"] = cluster_queue
    if cause:
        new["pendingCause"] = cause
    if fragmentation:
        new["pendingFragmentation"] = dict(fragmentation)
    return Transition(PENDING_EVENT, Status(new))


def admit(
    subject: Subject,
    status: Status,
    admission: Mapping[str, Any],
    *,
    borrowed: Mapping[str, Mapping[str, int]],
    with_preemption: bool,
    now: datetime,
    replica: int | None = None,
) -> Transition:
    """Pending → Admitted. ``admission`` is the status shape; its ``id`` is
    given here (the admitted entry's), naming this admission's close.
    ``replica``: the unit's, named in the entry (:func:`admit_unit`)."""
    entry_id = uuid4()
    admission = {**admission, "id": str(entry_id)}
    cluster, cluster_queue = str(admission["cluster"]), str(admission["clusterQueue"])
    new = status.without(*_PENDING_KEYS, "eviction")
    message = f"Quota reserved in ClusterQueue {cluster_queue}, cluster {cluster}"
    conditions = set_condition(
        status.conditions, "QuotaReserved", "True", "QuotaReserved", message, now
    )
    conditions = set_condition(
        conditions, "Admitted", "True", "Admitted", f"Admitted to cluster {cluster}", now
    )
    new.update(
        state=ADMITTED, clusterQueue=cluster_queue, admission=admission, conditions=conditions
    )
    flavors = {
        r: f for p in admission.get("podSetAssignments") or () for r, f in p["flavors"].items()
    }
    body = ledger.WorkloadAdmitted(
        **subject.names(cluster_queue),
        cluster=cluster,
        flavors=dict(sorted(flavors.items())),
        island=admission.get("island"),
        reserved=amounts(admission),
        borrowed={f: dict(r) for f, r in borrowed.items()},
        reason="AdmittedWithPreemption" if with_preemption else "QuotaReserved",
        replica=replica,
    )
    return Transition(ADMITTED_EVENT, Status(new), ledger.new_entry(body, entry_id, now))


def dispatch(status: Status, dispatched_at: str, now: datetime) -> Transition:
    """Admitted, its job created on the member but not yet running: pods not
    ready, so that waitForPodsReady can time it out."""
    return Transition(
        DISPATCHED_EVENT, Status({**status.raw, "podsReady": False, "dispatchedAt": dispatched_at})
    )


def run(status: Status, started_at: str, now: datetime) -> Transition:
    """Admitted → Running: every pod of the gang is ready on the member."""
    conditions = set_condition(
        status.conditions, "PodsReady", "True", "PodsReady", "All pods are ready", now
    )
    new = {**status.raw, "state": RUNNING, "podsReady": True, "startedAt": started_at}
    return Transition(RUNNING_EVENT, Status({**new, "conditions": conditions}))


def replicas_available(
    status: Status, cluster: str, available: int, now: datetime
) -> Transition | None:
    """A serving workload's replicas available on ``cluster`` (its member
    objects' available replicas, a LeaderWorkerSet's ready groups, never
    more than admitted there), recorded per cluster in
    ``availableByCluster`` and summed in ``availableReplicas``. Admitted →
    Running once every admitted replica (``replicaAdmissions``) is
    available: its PodsReady. A serving workload never finishes by itself;
    a count that falls (a member object lost, a replica restarting) is
    recorded, the state kept. ``None`` when nothing changed."""
    recorded = dict(status.raw.get("availableByCluster") or {})
    counts = {**recorded, cluster: available} if available else dict(recorded)
    if not available:
        counts.pop(cluster, None)
    total = sum(int(n) for n in counts.values())
    new = Status({**status.raw, "availableByCluster": counts, "availableReplicas": total})
    admitted = len(status.raw.get("replicaAdmissions") or ())
    if status.state == ADMITTED and admitted and total >= admitted:
        return run(new, rfc3339(now), now)
    if counts == recorded and status.raw.get("availableReplicas", 0) == total:
        return None
    return Transition(REPLICAS_AVAILABLE_EVENT, new)


def checkpoint(status: Status, at: datetime, now: datetime) -> Transition | None:
    """A running gang saved its work at ``at`` (its job's
    ``quartermaster.dev/last-checkpoint``): a preemption now destroys only
    what it did since (the engine's victim order). A time ahead of ``now``
    counts as ``now`` (a member's clock, or a tenant, cannot make work look
    saved later than it is read). ``None`` when the gang does not run, or
    the checkpoint is less than :data:`CHECKPOINT_EVERY` newer than the one
    recorded: a job that rewrites its annotation every second costs one
    event a minute, and the victim order is wrong by a minute at most."""
    if status.state != RUNNING:
        return None
    at = min(at, now).replace(microsecond=0)  # as recorded: RFC 3339 in whole seconds
    recorded = parse_time(status.raw.get("lastCheckpoint"))
    if recorded is not None and at - recorded < CHECKPOINT_EVERY:
        return None
    return Transition(CHECKPOINTED_EVENT, Status({**status.raw, "lastCheckpoint": rfc3339(at)}))


# --- ending holding capacity: each closes the admission's usage once -----------------------


def finish(
    subject: Subject,
    status: Status,
    *,
    succeeded: bool,
    reason: str,
    finished_at: datetime,
    now: datetime,
    kind: str = "Job",
) -> Transition:
    """Admitted or Running → Finished (succeeded or failed) on its member;
    ``kind``: what ran there (a JobSet's end is not a Job's)."""
    admission = status.admission
    cluster = str(admission.get("cluster"))
    started = parse_time(status.raw.get("startedAt")) or parse_time(admission.get("admittedAt"))
    started = started or finished_at
    outcome: Literal["succeeded", "failed"] = "succeeded" if succeeded else "failed"
    new = status.without()
    new.update(
        state=FINISHED,
        outcome=outcome,
        finishedAt=rfc3339(finished_at),
        startedAt=rfc3339(started),
        conditions=set_condition(
            status.conditions,
            "Finished",
            "True",
            reason,
            f"{kind} {outcome} on cluster {cluster}",
            now,
        ),
    )
    consumed, gpu, cpu, memory = _consumed(amounts(admission), started, finished_at)
    body = ledger.WorkloadFinished(
        **subject.names(str(admission.get("clusterQueue") or status.raw.get("clusterQueue"))),
        replica=None,
        cluster=cluster,
        outcome=outcome,
        started_at=started,
        finished_at=finished_at,
        consumed=consumed,
        gpu_seconds=gpu,
        cpu_seconds=cpu,
        memory_gib_seconds=memory,
    )
    return Transition(FINISHED_EVENT, Status(new), _close(subject, status, body, now))


def preempt(
    subject: Subject,
    status: Status,
    *,
    reason: PreemptionReason,
    message: str,
    preemptor: str,
    preemptor_cluster_queue: str,
    cohort_path: list[str],
    now: datetime,
    work_destroyed: float | None = None,
    budgeted: bool = False,
    replica: int | None = None,
) -> Transition:
    """Admitted or Running → Evicted by a preemptor: quota released now; the
    reconciler deletes the job and then requeues it (:func:`requeue`).
    ``replica``: the unit's, named in the entry (:func:`preempt_unit`)."""
    admission = status.admission
    new = _stopped(status, "Preempted", message, now)
    new.update(
        state=EVICTED,
        eviction={
            "reason": "Preempted",
            "message": message,
            "cluster": admission.get("cluster"),
            "at": rfc3339(now),
            "preemptor": preemptor,
            "preemptionReason": reason,
        },
    )
    body = ledger.WorkloadPreempted(
        **subject.names(str(admission.get("clusterQueue"))),
        cluster=str(admission.get("cluster")),
        reason=reason,
        preemptor=preemptor,
        preemptor_cluster_queue=preemptor_cluster_queue,
        cohort_path=cohort_path,
        released=amounts(admission),
        work_destroyed_gpu_seconds=None if work_destroyed is None else round(work_destroyed, 3),
        budgeted=budgeted,
        replica=replica,
    )
    return Transition(PREEMPTED_EVENT, Status(new), _close(subject, status, body, now))


def evict(
    subject: Subject,
    status: Status,
    *,
    reason: str,
    message: str,
    now: datetime,
    spec: Mapping[str, Any] | None = None,
    requeue_state: Mapping[str, Any] | None = None,
    deactivate: bool = False,
    replica: int | None = None,
) -> Transition:
    """Admitted or Running → Evicted: pods-ready timeout (with its backoff
    ``requeue_state``), a stopped queue, the member's eviction, its refusal
    of the job. ``deactivate`` sets ``spec.active`` false: it stays Evicted
    until someone reactivates it."""
    admission = status.admission
    new = _stopped(status, reason, message, now)
    new.update(
        state=EVICTED,
        eviction={
            "reason": reason,
            "message": message,
            "cluster": admission.get("cluster"),
            "at": rfc3339(now),
        },
    )
    if requeue_state is not None:
        new["requeueState"] = dict(requeue_state)
    new_spec = {**(spec or {}), "active": False} if deactivate else None
    body = ledger.WorkloadEvicted(
        **subject.names(str(admission.get("clusterQueue"))),
        cluster=str(admission.get("cluster")),
        reason=reason,
        message=message,
        requeued=not deactivate,
        released=amounts(admission),
        replica=replica,
    )
    return Transition(EVICTED_EVENT, Status(new), _close(subject, status, body, now), new_spec)


def refuse_replicas(
    subject: Subject,
    status: Status,
    cluster: str,
    message: str,
    now: datetime,
    spec: Mapping[str, Any],
) -> Transition:
    """A member refused a serving workload's object (invalid there, its kind
    not installed): every replica released (each its own close, as
    :func:`_released`), the workload Evicted from ``cluster`` and
    deactivated, as a refused gang is (:func:`evict`): asking again will not
    help until someone fixes and reactivates it."""
    replicas = list(status.raw.get(REPLICA_ADMISSIONS) or ())
    new, closes = _released(subject, status, replicas, "DispatchFailed", message, False, now)
    conditions = new.get("conditions") or ()
    for kind, value in (("Evicted", "True"), ("QuotaReserved", "False"), ("Admitted", "False")):
        conditions = set_condition(conditions, kind, value, "DispatchFailed", message, now)
    new = {k: v for k, v in new.items() if k != "podsReady"}
    new.update(
        state=EVICTED,
        conditions=conditions,
        eviction={
            "reason": "DispatchFailed",
            "message": message,
            "cluster": cluster,
            "at": rfc3339(now),
        },
    )
    entry, also = (closes[0], tuple(closes[1:])) if closes else (None, ())
    return Transition(EVICTED_EVENT, Status(new), entry, {**spec, "active": False}, also)


def scale(status: Status, spec: Mapping[str, Any], replicas: int, now: datetime) -> Transition:
    """A serving workload's ``spec.replicas`` (and its job's) set to
    ``replicas``: the number of replica gangs it asks admission for
    (docs/serving.md). The status is unchanged but for when it was scaled:
    what is admitted changes only by the admission cycle's decisions."""
    new_spec = {**spec, "replicas": replicas}
    job = spec.get("job")
    if isinstance(job, Mapping):
        new_spec["job"] = {**job, "spec": {**(job.get("spec") or {}), "replicas": replicas}}
    new = {**status.raw, "scaledAt": rfc3339(now)}
    if status.units and set(range(replicas)) <= {u["replica"] for u in status.units}:
        new = {k: v for k, v in new.items() if k not in _PENDING_KEYS}  # no unit waits now
    return Transition(SCALED_EVENT, Status(new), spec=new_spec)


# --- a serving workload's units (docs/serving.md) -------------------------------------------
#
# Each replica of a serving workload is admitted as its own gang (a unit):
# its admission is an entry of ``replicaAdmissions`` on the workload's one
# row, with a ledger entry of its own naming its ``replica`` (its event
# names it in ``replicas``, with its workload's others changed alike).
# The workload is Admitted while one unit is; a unit released goes back to
# pending (it is a missing index again) at once, its usage closed.


def _with_units(raw: Mapping[str, Any], units: Sequence[Mapping[str, Any]]) -> Obj:
    """``raw`` with ``units`` as its replica admissions, by replica."""
    ordered = sorted(units, key=lambda u: int(u["replica"]))
    return {**raw, REPLICA_ADMISSIONS: ordered, ADMITTED_REPLICAS: len(ordered)}


def _as_one_gang(status: Status, unit: Mapping[str, Any]) -> Status:
    """A unit's admission seen as a one-gang workload's status, for the
    one-gang transitions to close (its closing id derives from its own
    admission id)."""
    raw = {k: v for k, v in status.raw.items() if k not in (REPLICA_ADMISSIONS, ADMITTED_REPLICAS)}
    started = {"startedAt": unit["startedAt"]} if unit.get("startedAt") else {}
    return Status({**raw, **started, "state": ADMITTED, "admission": unit["admission"]})


def _unit_of(status: Status, replica: int) -> Mapping[str, Any]:
    unit = status.unit(replica)
    if unit is None:
        raise ValueError(f"replica {replica} holds no admission")
    return unit


def admit_unit(
    subject: Subject,
    status: Status,
    replica: int,
    admission: Mapping[str, Any],
    *,
    borrowed: Mapping[str, Mapping[str, int]],
    with_preemption: bool,
    now: datetime,
) -> Transition:
    """One unit admitted: its ``{replica, admission, admittedAt}`` joins
    ``replicaAdmissions`` (the admission with its id, as :func:`admit` gives
    it); the workload is Admitted (a Running one stays Running)."""
    whole = admit(
        subject,
        status,
        admission,
        borrowed=borrowed,
        with_preemption=with_preemption,
        now=now,
        replica=replica,
    )
    new = dict(whole.status.raw)
    given = new.pop("admission")
    unit = {"replica": replica, "admission": given, "admittedAt": given.get("admittedAt")}
    others = [u for u in status.units if u.get("replica") != replica]
    new = _with_units(new, [*others, unit])
    if status.state == RUNNING:
        new["state"] = RUNNING
    return dataclasses.replace(whole, status=Status(new), replica=replica)


def _without_unit(status: Status, replica: int, reason: str, message: str, now: datetime) -> Obj:
    """``status`` less ``replica``'s unit; Pending when it was the last one."""
    left = [u for u in status.units if u.get("replica") != replica]
    new = _with_units(status.raw, left)
    if not left and status.state in (ADMITTED, RUNNING):
        conditions = status.conditions
        for kind in ("QuotaReserved", "Admitted"):
            conditions = set_condition(conditions, kind, "False", reason, message, now)
        new.update(state=PENDING, conditions=conditions)
        new.pop("podsReady", None)
    return new


def preempt_unit(
    subject: Subject,
    status: Status,
    replica: int,
    *,
    reason: PreemptionReason,
    message: str,
    preemptor: str,
    preemptor_cluster_queue: str,
    cohort_path: list[str],
    now: datetime,
    work_destroyed: float | None = None,
    budgeted: bool = False,
) -> Transition:
    """One unit preempted: out of ``replicaAdmissions`` and pending again,
    its quota released now (the entry names reason and preemptor)."""
    whole = preempt(
        subject,
        _as_one_gang(status, _unit_of(status, replica)),
        reason=reason,
        message=message,
        preemptor=preemptor,
        preemptor_cluster_queue=preemptor_cluster_queue,
        cohort_path=cohort_path,
        now=now,
        work_destroyed=work_destroyed,
        budgeted=budgeted,
        replica=replica,
    )
    new = _without_unit(status, replica, "Preempted", message, now)
    return Transition(PREEMPTED_EVENT, Status(new), whole.entry, replica=replica)


def evict_unit(
    subject: Subject, status: Status, replica: int, *, reason: str, message: str, now: datetime
) -> Transition:
    """One unit evicted (pods-ready timeout, a stopped queue): out of
    ``replicaAdmissions`` and pending again, its quota released now. A
    unit has no backoff of its own, and is never deactivated alone."""
    whole = evict(
        subject,
        _as_one_gang(status, _unit_of(status, replica)),
        reason=reason,
        message=message,
        now=now,
        replica=replica,
    )
    new = _without_unit(status, replica, reason, message, now)
    return Transition(EVICTED_EVENT, Status(new), whole.entry, replica=replica)


def _unit_finished(subject: Subject, unit: Mapping[str, Any], now: datetime) -> NewLedgerEntry:
    """The ``cancelled`` finish that closes a unit's usage (a scale down, its
    workload cancelled): its GPU-seconds are the unit's run, from when its
    pods were ready (its ``startedAt``, when sync recorded one) or else its
    admission, to now: the span the ledger's held usage closes."""
    replica, admission = int(unit["replica"]), unit["admission"]
    started = parse_time(unit.get("startedAt")) or parse_time(unit.get("admittedAt"))
    started = min(started or now, now)
    consumed, gpu, cpu, memory = _consumed(amounts(admission), started, now)
    body = ledger.WorkloadFinished(
        **subject.names(str(admission.get("clusterQueue"))),
        cluster=str(admission.get("cluster")),
        outcome="cancelled",
        started_at=started,
        finished_at=now,
        consumed=consumed,
        gpu_seconds=gpu,
        cpu_seconds=cpu,
        memory_gib_seconds=memory,
        replica=replica,
    )
    return ledger.new_entry(body, closing_entry_id(subject.uid, admission), now)


def _release_unit(
    subject: Subject, status: Status, unit: Mapping[str, Any], now: datetime
) -> Transition:
    """A unit released by a scale down: out of ``replicaAdmissions``, its
    usage closed (:func:`_unit_finished`)."""
    replica = int(unit["replica"])
    message = f"Replica {replica} released by a scale down"
    new = _without_unit(status, replica, "ScaledDown", message, now)
    entry = _unit_finished(subject, unit, now)
    return Transition(FINISHED_EVENT, Status(new), entry, replica=replica)


def release_replicas(
    subject: Subject, status: Status, replicas: int, now: datetime
) -> list[Transition]:
    """A scale down to ``replicas``: each unit of a higher index released at
    once, highest first, each its own ``WorkloadFinished`` and closing entry
    (quota and capacity freed for the next cycle). None to release: []."""
    changes: list[Transition] = []
    for unit in sorted(status.units, key=lambda u: -int(u["replica"])):
        if int(unit["replica"]) < replicas:
            break
        change = _release_unit(subject, status, unit, now)
        changes.append(change)
        status = change.status
    return changes


def unit_clusters(status: Status) -> set[str]:
    """The member clusters where a serving workload's units are admitted."""
    return {str(u["admission"]["cluster"]) for u in status.units if u.get("admission")}


def pend_units(status: Status, reason: str, message: str, now: datetime) -> Transition:
    """An admitted serving workload some of whose units wait: why (its
    lowest waiting unit's reason) without the pending workload's
    ``QuotaReserved=False`` condition, for it holds quota."""
    new = {
        **status.without(*PENDING_DETAIL_KEYS),
        "pendingReason": message,
        "pendingReasonCode": reason,
        "pendingReasonAt": rfc3339(now),
    }
    return Transition(PENDING_EVENT, Status(new))


def request_cancel(status: Status, by: str, now: datetime) -> Transition:
    """A user's cancel: a gang holding capacity becomes ``Cancelling`` (it
    holds until its member has removed it: :func:`cancelled` closes it);
    anything else not yet ended is ``Cancelled`` at once, holding nothing."""
    state = CANCELLING if status.state in (ADMITTED, RUNNING) else CANCELLED
    condition = {
        "type": "Cancelled",
        "status": "True",
        "reason": "CancelledByUser",
        "message": f"cancelled by {by}",
        "lastTransitionTime": rfc3339(now),
    }
    new = {**status.raw, "state": state, "conditions": [*status.conditions, condition]}
    return Transition(CANCELLED_EVENT, Status(new))


def cancelled(subject: Subject, status: Status, now: datetime, message: str = "") -> Transition:
    """Cancelling → Cancelled: its job is gone from the member (or the member
    is gone), so the usage it held closes now, as a ``cancelled`` finish."""
    admission = status.admission
    started = parse_time(status.raw.get("startedAt")) or now
    started = min(started, now)
    consumed, gpu, cpu, memory = _consumed(amounts(admission), started, now)
    body = ledger.WorkloadFinished(
        **subject.names(str(admission.get("clusterQueue") or status.raw.get("clusterQueue"))),
        replica=None,
        cluster=str(admission.get("cluster")),
        outcome="cancelled",
        started_at=started,
        finished_at=now,
        consumed=consumed,
        gpu_seconds=gpu,
        cpu_seconds=cpu,
        memory_gib_seconds=memory,
    )
    new = {**status.raw, "state": CANCELLED, "finishedAt": rfc3339(now)}
    if message:
        new["conditions"] = set_condition(
            status.conditions, "Finished", "True", "Cancelled", message, now
        )
    # A serving workload's units each close their own usage.
    held = status.units if status.holds_units else []
    units = tuple(_unit_finished(subject, u, now) for u in held)
    return Transition(CANCELLED_EVENT, Status(new), _close(subject, status, body, now), also=units)


def cancel_replicas(subject: Subject, status: Status, cluster: str, now: datetime) -> Transition:
    """A cancelling serving workload's objects are gone from ``cluster``: its
    replicas there close, each a ``cancelled`` finish of its own run
    (:func:`_unit_finished`); Cancelled once none is left anywhere, else still
    Cancelling while another member removes its objects."""
    here = [
        r
        for r in status.raw.get(REPLICA_ADMISSIONS) or ()
        if (r.get("admission") or {}).get("cluster") == cluster
    ]

    new = _without(status, here)
    closes = [_unit_finished(subject, r, now) for r in here]
    if not new[REPLICA_ADMISSIONS]:
        new.update(state=CANCELLED, finishedAt=rfc3339(now))
    entry, also = (closes[0], tuple(closes[1:])) if closes else (None, ())
    return Transition(CANCELLED_EVENT, Status(new), entry, also=also)


def lose_cluster(
    subject: Subject,
    status: Status,
    cluster: str,
    reason: str,
    message: str,
    now: datetime,
    seen: Seen | None = None,
) -> Transition | None:
    """``cluster`` is lost or deleted: a gang it holds is requeued whole (its
    usage closed, and what it ran there estimated from ``seen``), a
    cancelling one is Cancelled, one evicted from it and waiting for its
    job's removal is requeued; ``None`` if it has nothing there."""
    if status.units:
        return _lose_replicas(subject, status, cluster, reason, message, now)
    here = status.cluster == cluster and status.holds
    evicted_here = (
        status.state == EVICTED and (status.raw.get("eviction") or {}).get("cluster") == cluster
    )
    if not here and not evicted_here:
        return None
    estimate = _estimate(subject, status, cluster, seen, now) if here else None
    also = (estimate,) if estimate is not None else ()
    if status.state == CANCELLING:
        return dataclasses.replace(cancelled(subject, status, now, message), also=also)
    new = status.without("admission", "podsReady")
    new.update(
        state=PENDING,
        queuedAt=rfc3339(now),
        conditions=set_condition(status.conditions, "Requeued", "True", reason, message, now),
    )
    admission = status.admission
    body = ledger.WorkloadEvicted(
        **subject.names(str(admission.get("clusterQueue"))),
        replica=None,
        cluster=cluster,
        reason=reason,
        message=message,
        requeued=True,
        released=amounts(admission),
    )
    return Transition(REQUEUED_EVENT, Status(new), _close(subject, status, body, now), also=also)


def _released(
    subject: Subject,
    status: Status,
    released: Sequence[Mapping[str, Any]],
    reason: str,
    message: str,
    requeued: bool,
    now: datetime,
) -> tuple[Obj, list[NewLedgerEntry]]:
    """A serving workload's status without the replicas ``released`` (and
    without its available count in the clusters left with none), and one
    closing entry per replica (evicted: requeued or not), its id the
    replica's admission's: a second release of the same replica writes
    nothing again."""

    def evicted(replica: Mapping[str, Any]) -> NewLedgerEntry:
        admission = replica.get("admission") or {}
        body = ledger.WorkloadEvicted(
            **subject.names(str(admission.get("clusterQueue"))),
            replica=int(replica["replica"]),
            cluster=str(admission.get("cluster")),
            reason=reason,
            message=message,
            requeued=requeued,
            released=amounts(admission),
        )
        return ledger.new_entry(body, closing_entry_id(subject.uid, admission), now)

    return _without(status, released), [evicted(r) for r in released]


def _without(status: Status, released: Sequence[Mapping[str, Any]]) -> Obj:
    """A serving workload's status without the replicas ``released``, and
    without its available count in the clusters left with none."""
    kept = [r for r in status.raw.get(REPLICA_ADMISSIONS) or () if r not in released]
    here = {str((r.get("admission") or {}).get("cluster")) for r in kept}
    counts = {c: n for c, n in (status.raw.get("availableByCluster") or {}).items() if c in here}
    new = {
        **status.raw,
        REPLICA_ADMISSIONS: kept,
        "admittedReplicas": len(kept),
        "availableByCluster": counts,
        "availableReplicas": sum(int(n) for n in counts.values()),
    }
    return new


def _lose_replicas(
    subject: Subject, status: Status, cluster: str, reason: str, message: str, now: datetime
) -> Transition | None:
    """``cluster`` is lost or deleted: a serving workload's replicas admitted
    there are released, each its own close (its id the replica's
    admission's), and wait again as pending replicas; the replicas
    elsewhere keep running. Pending once none is left; a cancelling one
    with none left is Cancelled. ``None`` if it has none there."""
    replicas = list(status.raw.get(REPLICA_ADMISSIONS) or ())
    lost = [r for r in replicas if (r.get("admission") or {}).get("cluster") == cluster]
    if not lost or status.state in (FINISHED, CANCELLED, EVICTED):
        return None
    cancelling = status.state == CANCELLING
    new, closes = _released(subject, status, lost, reason, message, not cancelling, now)
    kept = new[REPLICA_ADMISSIONS]
    new["conditions"] = set_condition(status.conditions, "Requeued", "True", reason, message, now)
    event = REQUEUED_EVENT
    if not kept and cancelling:
        new.update(state=CANCELLED, finishedAt=rfc3339(now))
        event = CANCELLED_EVENT
    elif not kept:
        new = {k: v for k, v in new.items() if k != "podsReady"}
        new.update(state=PENDING, queuedAt=rfc3339(now))
    return Transition(event, Status(new), closes[0], also=tuple(closes[1:]))


# --- back to the queue ----------------------------------------------------------------------


def requeue(status: Status, now: datetime) -> Transition:
    """Evicted → Pending once its job is gone from the member (its usage was
    closed when it was evicted)."""
    cluster = (status.raw.get("eviction") or {}).get("cluster")
    message = f"Requeued after its job was removed from cluster {cluster}"
    new = status.without("admission", "pendingReason", *PENDING_DETAIL_KEYS)
    new.update(
        state=PENDING,
        queuedAt=rfc3339(now),
        conditions=set_condition(status.conditions, "Requeued", "True", "Requeued", message, now),
    )
    return Transition(REQUEUED_EVENT, Status(new))


__all__ = [
    "HOLDS_QUOTA",
    "PodTimes",
    "Seen",
    "State",
    "Status",
    "Subject",
    "Transition",
    "admit",
    "admit_unit",
    "amounts",
    "cancel_replicas",
    "cancelled",
    "closing_entry_id",
    "dispatch",
    "evict",
    "evict_unit",
    "finish",
    "lose_cluster",
    "measured_run",
    "pend_units",
    "preempt",
    "preempt_unit",
    "ran_entry_id",
    "refuse_replicas",
    "release_replicas",
    "replicas_available",
    "request_cancel",
    "requeue",
    "run",
    "set_condition",
    "unit_clusters",
]
