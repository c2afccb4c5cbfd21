"""Teams' commands: submit (one or in bulk), cancel, explain."""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg.types.json import Jsonb
from pydantic import ValidationError
from sqlalchemy import BigInteger, Connection, Engine, and_, func, or_, select
from sqlalchemy.engine import Row
from sqlalchemy.exc import DataError

from service.app import lifecycle
from service.app.admission import (
    RECONCILE_TOPIC,
    ConfigCache,
    WorkloadRow,
    flavors_without_nodes,
    fleet_snapshot,
    workload_from_row,
)
from service.app.auth import Principal, require
from service.app.errors import (
    AlreadyExists,
    AppError,
    Forbidden,
    Invalid,
    NotFound,
    PolicyRefused,
    UnknownReference,
    UnsupportedKind,
)
from service.app.kinds import KINDS
from service.app.resources import (
    Actor,
    ResourceService,
    _exists,
    check_version,
    stream_name,
    to_object,
)
from service.app.schemas import SecurityPolicy, WorkloadClass, dump
from service.app.uow import SqlUnitOfWork
from service.app.workloads import (
    SubmissionError,
    WorkloadObject,
    WorkloadSpec,
    class_field,
    parse_submission,
    security_violations,
    total_requests,
)
from service.domain.quantity import format_amount
from service.engine import Snapshot
from service.engine.feasibility import Verdict, never_fits_in
from service.eventstore.port import (
    ANY_VERSION,
    ConcurrencyConflict,
    EventMetadata,
    NewEvent,
    OutboxMessage,
)
from service.jsonio import dumps
from service.ledger import entries as ledger
from service.ledger.chain import NewLedgerEntry
from service.projections.resources import UPSERT_SQL, resource_row, upsert_resources
from service.projections.schema import resources

WORKLOADS = KINDS["workloads"]
MAX_BULK = 5000
BULK_CHUNK = 1000
Obj = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """What a submission resolves to: its ClusterQueue and priority."""

    cluster_queue: str
    priority: int
    requests: dict[str, int]
    """The whole gang's requests per resource (canonical units)."""


@dataclass(frozen=True)
class ItemResult:
    index: int
    name: str | None
    status: int
    error: AppError | None = None
    object: Obj | None = None


@dataclass(frozen=True)
class Submission:
    """A parsed submission on its way into a unit of work."""

    actor: Actor
    namespace: str
    workload: WorkloadObject


#: What a submission came to: the created Workload, or why it was refused.
Outcome = Obj | AppError


class Unstorable(AppError):
    """What validation let through but Postgres cannot hold (a non-finite
    number in a pod template, say); the same answer as the API's for a
    DataError."""

    status, kind, title = 422, "invalid-request", "Invalid request"


_REFUSED_BY_DATABASE = (DataError, psycopg.DataError)


class Unsatisfiable(AppError):
    """A workload that no empty fleet could admit, submitted to a ClusterQueue
    whose ``spec.unsatisfiable`` is ``Refuse``."""

    status, kind, title = 422, "unsatisfiable", "Can never be admitted"


#: The fleet as configured, fetched at most once per unit of work, and only
#: when a ClusterQueue of it refuses what can never be admitted.
Fleet = Callable[[], Snapshot]


@dataclass(frozen=True)
class _Accepted:
    submission: Submission
    target: Target
    version: int
    """The stream's version before this submission (a deleted workload's
    name starts again after its tombstone)."""


def _by_namespace(
    submissions: Sequence[Submission],
) -> dict[str, list[tuple[int, Submission]]]:
    groups: dict[str, list[tuple[int, Submission]]] = {}
    for index, submission in enumerate(submissions):
        groups.setdefault(submission.namespace, []).append((index, submission))
    return groups


# The read-model rows of a unit's new Workloads in one statement: one JSON
# array that Postgres reads as a record set, instead of one execution per row
# (psycopg's per-row pipeline work cost ~30 µs of the API's CPU per
# submission; Postgres's cost is the same either way). The conflict clause is
# the projection's own (service/projections/resources.py), so a row is
# written exactly as ``upsert_resources`` would write it.
_UPSERT_WORKLOADS = (
    "INSERT INTO resources (kind, namespace, name, uid, resource_version, generation, labels, "
    "annotations, spec, status, secret, created_at, updated_at, deleted) "
    "SELECT 'Workload', r.namespace, r.name, r.uid, r.version, 1, r.labels, r.annotations, "
    "r.spec, r.status, NULL, %(now)s, %(now)s, false "
    "FROM jsonb_to_recordset(%(rows)s) AS r(namespace text, name text, uid uuid, "
    "version bigint, labels jsonb, annotations jsonb, spec jsonb, status jsonb)"
    + UPSERT_SQL[UPSERT_SQL.index(" ON CONFLICT") :]
)


def new_uuids(count: int) -> Iterator[UUID]:
    """``count`` random (version 4) UUIDs, as ``uuid4()`` makes them, from one
    read of the system's random source. ``uuid4()`` reads it once per id and
    releases the GIL each time: with the event loop's thread busy, each call
    then waits for the GIL to come back (3 ids per submission took 15 % of a
    unit of work's samples; 34 µs a call beside a busy thread, 7 µs here)."""
    data = os.urandom(16 * count)
    return (UUID(bytes=data[i : i + 16], version=4) for i in range(0, 16 * count, 16))


def _pending_status(cluster_queue: str, stamp: str) -> Obj:
    """A new Workload's status; ``stamp`` is the submission time as RFC 3339
    (formatted once per unit of work)."""
    return {
        "state": "Pending",
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


def submitted_entry(
    submission: Submission, target: Target, entry_id: UUID, now: datetime
) -> NewLedgerEntry:
    """The ledger's ``workload.submitted`` entry, its body written straight
    as ``ledger.WorkloadSubmitted(...).model_dump(mode="json")`` would write
    it (every field comes from a validated submission, so validating them
    again per item only cost time; a test keeps the two equal)."""
    workload, actor = submission.workload, submission.actor.principal.name
    body = {
        "namespace": submission.namespace,
        "workload": workload.metadata.name,
        "local_queue": workload.spec.queueName,
        "cluster_queue": target.cluster_queue,
        "actor": actor,
        "workload_class": workload.spec.workloadClass,
        "priority": target.priority,
        "requests": target.requests,
    }
    return NewLedgerEntry(entry_id, ledger.WorkloadSubmitted.KIND, body, now)


class SubmissionService:
    def __init__(
        self,
        engine: Engine,
        unit_of_work: Callable[[], SqlUnitOfWork],
        resources_service: ResourceService,
    ) -> None:
        self._engine = engine
        self._uow = unit_of_work
        self._resources = resources_service
        # Quota and fleet as domain values, parsed when they change: the
        # never-fits verdicts of submissions and explain read them.
        self._configuration = ConfigCache()
        self._configuration_lock = threading.Lock()

    def _fleet(self, conn: Connection) -> Snapshot:
        with self._configuration_lock:  # the cache is shared by request threads
            return fleet_snapshot(conn, self._configuration)

    def _lazy_fleet(self, conn: Connection) -> Fleet:
        found: list[Snapshot] = []

        def fleet() -> Snapshot:
            if not found:
                found.append(self._fleet(conn))
            return found[0]

        return fleet

    def quota_warnings(self, cluster_queue: Mapping[str, Any]) -> list[str]:
        """What ``qmctl apply`` should warn of in a ClusterQueue just written:
        quota of a flavor that no node of the fleet carries."""
        with self._engine.connect() as conn:
            snapshot = self._fleet(conn)
        name = (cluster_queue.get("metadata") or {}).get("name")
        spec = cluster_queue.get("spec") or {}
        return [f"ClusterQueue {name}: {w}" for w in flavors_without_nodes(snapshot, spec)]

    # -- submit --------------------------------------------------------------------------

    def parse(self, actor: Actor, namespace: str, body: Any) -> WorkloadObject:
        require(actor.principal, WORKLOADS.write, namespace)
        try:
            workload = parse_submission(body)
        except SubmissionError as error:
            failure = UnsupportedKind if error.kind == "unsupported-kind" else Invalid
            raise failure(f"the submission is invalid: {error}", error.problems) from None
        if workload.metadata.namespace not in (None, namespace):
            raise Invalid(
                "namespace mismatch",
                [("metadata.namespace", f"does not match the path's namespace {namespace}")],
            )
        return workload

    def submit(self, actor: Actor, namespace: str, body: Any) -> Obj:
        workload = self.parse(actor, namespace, body)
        outcome = self.submit_parsed([Submission(actor, namespace, workload)])[0]
        if isinstance(outcome, AppError):
            raise outcome
        return outcome

    def submit_parsed(self, submissions: Sequence[Submission]) -> list[Outcome]:
        """Commit parsed submissions in one unit of work (group commit): one
        prefetch per namespace, one turn at the ledger tip and one WAL flush
        for all of them. Each gets its own outcome, the created object or the
        error that refused it alone (a name taken, earlier in the group or
        before; an unknown queue; the security floor); the others commit."""
        outcomes = self._commit_group(submissions)
        for submission, outcome in zip(submissions, outcomes, strict=True):
            if isinstance(outcome, PolicyRefused):
                self._record_refusal(
                    submission.actor, submission.namespace, submission.workload, outcome
                )
        return outcomes

    def _commit_group(self, submissions: Sequence[Submission]) -> list[Outcome]:
        """A name created by a rival transaction between our prefetch and our
        commit fails the whole unit: try again (the prefetch now sees it and
        refuses that item alone), then, should it keep happening, one by one.
        A value the database refuses also fails the whole unit: one by one at
        once, so that only its own submission is refused."""
        if len(submissions) > 1:
            for _ in range(2):
                try:
                    return self._try_group(submissions)
                except AlreadyExists:
                    continue
                except _REFUSED_BY_DATABASE:
                    break
        return [self._try_alone(submission) for submission in submissions]

    def _try_alone(self, submission: Submission) -> Outcome:
        try:
            return self._try_group([submission])[0]
        except AlreadyExists as error:
            return error
        except _REFUSED_BY_DATABASE as error:
            return Unstorable(f"refused: {getattr(error, 'orig', None) or error}")

    def _try_group(self, submissions: Sequence[Submission]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(submissions)
        accepted: list[tuple[int, _Accepted]] = []
        with self._uow() as uow:
            fleet = self._lazy_fleet(uow.connection)
            for namespace, indexed in _by_namespace(submissions).items():
                resolver = _Resolver(uow.connection, namespace, fleet)
                current = resolver.prefetch([s.workload for _, s in indexed])
                taken = {n for n, row in current.items() if not row.deleted}
                for index, submission in indexed:
                    name = submission.workload.metadata.name
                    try:
                        if name in taken:
                            raise AlreadyExists(f'workloads "{name}" already exists')
                        target = resolver.resolve(submission.workload)
                    except AppError as error:
                        outcomes[index] = error
                        continue
                    taken.add(name)
                    version = current[name].resource_version if name in current else 0
                    accepted.append((index, _Accepted(submission, target, version)))
            if accepted:
                created = self._append(uow, [a for _, a in accepted])
                for (index, _), obj in zip(accepted, created, strict=True):
                    outcomes[index] = obj
        return [o if o is not None else AppError("not submitted") for o in outcomes]

    def bulk(self, actor: Actor, namespace: str, items: Sequence[Any]) -> list[ItemResult]:
        """All-or-nothing per item: the valid items commit together, each
        invalid one gets its own error (a name twice in the request: both)."""
        results: dict[int, ItemResult] = {}
        parsed: list[tuple[int, WorkloadObject]] = []
        for index, body in enumerate(items):
            try:
                parsed.append((index, self.parse(actor, namespace, body)))
            except AppError as error:
                name = (
                    ((body or {}).get("metadata") or {}).get("name")
                    if isinstance(body, Mapping)
                    else None
                )
                results[index] = ItemResult(index, name, error.status, error)
        names = Counter(w.metadata.name for _, w in parsed)
        unique: list[tuple[int, WorkloadObject]] = []
        for index, workload in parsed:
            name = workload.metadata.name
            if names[name] > 1:
                twice = Invalid("duplicate name in this request", [("metadata.name", name)])
                results[index] = ItemResult(index, name, twice.status, twice)
            else:
                unique.append((index, workload))
        outcomes = self._submit_chunked([Submission(actor, namespace, w) for _, w in unique])
        for (index, workload), outcome in zip(unique, outcomes, strict=True):
            name = workload.metadata.name
            if isinstance(outcome, AppError):
                results[index] = ItemResult(index, name, outcome.status, outcome)
            else:
                results[index] = ItemResult(index, name, 201, None, outcome)
        return [results[i] for i in sorted(results)]

    def _submit_chunked(self, submissions: Sequence[Submission]) -> list[Outcome]:
        """Large groups in chunks, two units of work at a time: while one
        waits for Postgres to write and flush its chunk, the next is resolved
        and encoded (Python's share of a chunk is about as long as
        Postgres's)."""
        if len(submissions) <= BULK_CHUNK:
            return self.submit_parsed(submissions)
        chunks = [submissions[i : i + BULK_CHUNK] for i in range(0, len(submissions), BULK_CHUNK)]
        with ThreadPoolExecutor(2, thread_name_prefix="bulk") as pool:
            return [o for outcomes in pool.map(self.submit_parsed, chunks) for o in outcomes]

    def _append(self, uow: SqlUnitOfWork, accepted: Sequence[_Accepted]) -> list[Obj]:
        """Each accepted submission's event, read-model row and ledger entry,
        one outbox message per namespace; commit."""
        now = datetime.now(UTC)
        stamp, created_at = now.strftime("%Y-%m-%dT%H:%M:%SZ"), now.isoformat()
        metas: dict[tuple[str, str | None], EventMetadata] = {}
        objects: list[Obj] = []
        rows: list[Obj] = []
        submitted: list[NewLedgerEntry] = []
        namespaces: Counter[str] = Counter()
        ids = new_uuids(3 * len(accepted))
        for item in accepted:
            actor, namespace, workload = (
                item.submission.actor,
                item.submission.namespace,
                item.submission.workload,
            )
            name, labels, annotations = (
                workload.metadata.name,
                workload.metadata.labels,
                workload.metadata.annotations,
            )
            key = (actor.principal.name, actor.request_id)
            meta = metas.get(key)
            if meta is None:
                meta = metas[key] = EventMetadata(actor.principal.name, now, actor.request_id)
            spec = dump(workload.spec)
            spec["priority"] = item.target.priority
            status = _pending_status(item.target.cluster_queue, stamp)
            uid, version = str(next(ids)), item.version + 1
            data = {
                "kind": "Workload",
                "namespace": namespace,
                "name": name,
                "uid": uid,
                "generation": 1,
                "labels": labels,
                "annotations": annotations,
                "spec": spec,
                "status": status,
                "created_at": created_at,
            }
            stream = stream_name("Workload", namespace, name)
            uow.events.append(
                stream, item.version, [NewEvent(next(ids), "WorkloadSubmitted", data, meta)]
            )
            rows.append(
                {
                    "namespace": namespace,
                    "name": name,
                    "uid": uid,
                    "version": version,
                    "labels": labels,
                    "annotations": annotations,
                    "spec": spec,
                    "status": status,
                }
            )
            objects.append(
                to_object(
                    WORKLOADS,
                    {
                        **rows[-1],
                        "resource_version": version,
                        "generation": 1,
                        "created_at": now,
                    },
                )
            )
            namespaces[namespace] += 1
            submitted.append(submitted_entry(item.submission, item.target, next(ids), now))
        uow.events.defer(_UPSERT_WORKLOADS, [{"now": now, "rows": Jsonb(rows, dumps=dumps)}])
        # Wake the admission cycle (the workers' outbox relay delivers it).
        uow.publish(
            [
                OutboxMessage(uuid4(), "admission.wake", {"submitted": n, "namespace": ns})
                for ns, n in namespaces.items()
            ]
        )
        # Last before COMMIT: the ledger's tip lock is held until then.
        uow.record(submitted)
        try:
            uow.commit()
        except ConcurrencyConflict as error:
            raise AlreadyExists(f"a workload was created concurrently: {error}") from error
        return objects

    def _record_refusal(
        self, actor: Actor, namespace: str, workload: WorkloadObject | None, refusal: AppError
    ) -> None:
        """Refusals are decisions too: an event the ledger issue turns into an entry."""
        meta = actor.metadata()
        data = {
            "namespace": namespace,
            "name": workload.metadata.name if workload else None,
            "queueName": workload.spec.queueName if workload else None,
            "rules": [{"field": p, "message": m} for p, m in refusal.errors],
        }
        refused = ledger.PolicyRefused(
            actor=actor.principal.name,
            namespace=namespace,
            workload=workload.metadata.name if workload else "",
            local_queue=workload.spec.queueName if workload else None,
            rules=[ledger.BrokenRule(rule=p or "(body)", message=m) for p, m in refusal.errors]
            or [ledger.BrokenRule(rule="(body)", message=refusal.detail)],
        )
        with self._uow() as uow:
            uow.events.append(
                f"refusal-{namespace}",
                ANY_VERSION,
                [NewEvent(uuid4(), "SubmissionRefused", data, meta)],
            )
            uow.record([ledger.new_entry(refused, uuid4(), meta.occurred_at)])
            uow.commit()

    # -- cancel --------------------------------------------------------------------------

    def cancel(self, actor: Actor, namespace: str, name: str, if_match: str | None = None) -> Obj:
        require(actor.principal, WORKLOADS.write, namespace)
        with self._uow() as uow:
            conn = uow.connection
            row = conn.execute(
                select(resources)
                .where(
                    resources.c.kind == "Workload",
                    resources.c.namespace == namespace,
                    resources.c.name == name,
                    resources.c.deleted.is_(False),
                )
                .with_for_update()
            ).first()
            if row is None:
                raise NotFound(f'workloads "{name}" not found')
            check_version(if_match, row)
            state = row.status.get("state", "Pending")
            if state in ("Finished", "Cancelled", "Cancelling"):
                return to_object(WORKLOADS, row)
            meta = actor.metadata()
            # An admitted gang keeps its quota until the workers have removed
            # it from its member cluster (reconcile closes its usage then); a
            # pending one is simply gone.
            change = lifecycle.request_cancel(
                lifecycle.Status(row.status), actor.principal.name, meta.occurred_at
            )
            status = change.status.to_json()
            data = {
                "kind": "Workload",
                "namespace": namespace,
                "name": name,
                "uid": str(row.uid),
                "generation": row.generation,
                "labels": row.labels,
                "annotations": row.annotations,
                "spec": row.spec,
                "status": status,
                "created_at": row.created_at.isoformat(),
            }
            uow.events.append(
                stream_name("Workload", namespace, name),
                row.resource_version,
                [NewEvent(uuid4(), change.event, data, meta)],
            )
            new = resource_row(data, row.resource_version + 1, meta.occurred_at)
            upsert_resources(conn, [new])
            cluster = (status.get("admission") or {}).get("cluster")
            if change.status.state == lifecycle.CANCELLING and cluster:
                # Remove its job now rather than at the next resync.
                uow.publish([OutboxMessage(uuid4(), RECONCILE_TOPIC, {"cluster": str(cluster)})])
            uow.commit()
        return to_object(WORKLOADS, new)

    # -- explain -------------------------------------------------------------------------

    def explain(self, actor: Actor, namespace: str, name: str) -> Obj:
        """Where the workload stands and the true cause of a wait: a gang that
        can never be admitted says so (and why, judged on the fleet as
        configured, now); another says what it waits for and who is ahead,
        named only in namespaces the reader may read."""
        obj = self._resources.get(actor.principal, "workloads", namespace, name)
        status, spec = obj["status"], obj["spec"]
        state = status.get("state", "Pending")
        latest = (status.get("conditions") or [{}])[-1]
        reader = actor.principal
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
            with self._engine.connect() as conn:
                position, total = _position(conn, obj)
                ahead = _ahead(conn, obj, reader)
                verdict = _verdict(self._fleet(conn), namespace, obj, cq) if cq else None
            answer["positionInQueue"] = position
            answer["pendingInClusterQueue"] = total
            answer["ahead"] = ahead
            answer.update(_waiting(status, verdict, position, total, ahead, reader))
        if status.get("admission"):
            answer["admission"] = status["admission"]
        return answer


#: Recorded reasons that mean the gang may fit and waits for what others hold.
_WAITS_FOR_OTHERS = frozenset({"WaitingForQuota", "WaitingForCapacity", "StrictFIFO", "Pending"})


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


_BEHIND = re.compile(r"Waiting behind (?P<key>[a-z0-9][-a-z0-9]*/[^\s]+)")


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


def _queue_order(conn: Connection, obj: Obj) -> tuple[Any, Any]:
    """``(pending, ahead)``: SQL conditions for the workload's ClusterQueue's
    pending workloads, and for those before it in admission order (priority,
    then age, then name)."""
    status, spec, meta = obj["status"], obj["spec"], obj["metadata"]
    cq = status.get("clusterQueue")
    priority = int(spec.get("priority", 0))
    prio = func.coalesce(resources.c.spec["priority"].astext.cast(BigInteger()), 0)
    created = conn.execute(
        select(resources.c.created_at).where(
            resources.c.kind == "Workload",
            resources.c.namespace == meta.get("namespace", ""),
            resources.c.name == meta["name"],
        )
    ).scalar_one()
    pending = and_(
        resources.c.kind == "Workload",
        resources.c.deleted.is_(False),
        resources.c.status["clusterQueue"].astext == cq,
        resources.c.status["state"].astext == "Pending",
    )
    ahead = or_(
        prio > priority,
        and_(prio == priority, resources.c.created_at < created),
        and_(
            prio == priority,
            resources.c.created_at == created,
            resources.c.namespace + "/" + resources.c.name
            < meta.get("namespace", "") + "/" + meta["name"],
        ),
    )
    return pending, ahead


def _position(conn: Connection, obj: Obj) -> tuple[int, int]:
    """1-based position among the ClusterQueue's pending workloads, in
    admission order (priority, then age), and how many are pending."""
    pending, ahead = _queue_order(conn, obj)
    before = conn.execute(select(func.count()).where(pending, ahead)).scalar_one()
    total = conn.execute(select(func.count()).where(pending)).scalar_one()
    return int(before) + 1, int(total)


#: How many of the workloads ahead explain names (those the reader may read).
AHEAD_NAMED = 10


def _ahead(conn: Connection, obj: Obj, reader: Principal) -> Obj:
    """Who is ahead in the queue: counts, and names only in namespaces
    ``reader`` may read (issue 18: a submitter must not learn others' names)."""
    pending, ahead = _queue_order(conn, obj)
    counts = conn.execute(
        select(resources.c.namespace, func.count())
        .where(pending, ahead)
        .group_by(resources.c.namespace)
    ).all()
    readable = sorted(ns for ns, _ in counts if _may_read(reader, ns))
    visible = sum(int(n) for ns, n in counts if ns in readable)
    total = sum(int(n) for _, n in counts)
    named: list[str] = []
    if readable:
        prio = func.coalesce(resources.c.spec["priority"].astext.cast(BigInteger()), 0)
        rows = conn.execute(
            select(resources.c.namespace, resources.c.name)
            .where(pending, ahead, resources.c.namespace.in_(readable))
            .order_by(prio.desc(), resources.c.created_at, resources.c.namespace, resources.c.name)
            .limit(AHEAD_NAMED)
        ).all()
        named = [f"{ns}/{n}" for ns, n in rows]
    return {
        "total": total,
        "inNamespacesYouCanRead": visible,
        "inOtherNamespaces": total - visible,
        "workloads": named,
    }


_PREFETCH = """
SELECT kind, name, spec, resource_version, deleted FROM resources
WHERE (kind = 'LocalQueue' AND namespace = %(ns)s AND name = ANY(%(queues)s) AND NOT deleted)
   OR (kind = 'ClusterQueue' AND namespace = '' AND NOT deleted AND name IN (
         SELECT spec->>'clusterQueue' FROM resources
         WHERE kind = 'LocalQueue' AND namespace = %(ns)s AND name = ANY(%(queues)s)
           AND NOT deleted))
   OR (kind = 'WorkloadPriorityClass' AND namespace = '' AND name = ANY(%(classes)s)
       AND NOT deleted)
   OR (kind = 'Workload' AND namespace = %(ns)s AND name = ANY(%(names)s))
"""


@dataclass(frozen=True)
class _QueueRules:
    """What a ClusterQueue asks of every submission, read from its spec once
    per unit of work rather than once per submission."""

    served: WorkloadClass
    covered: frozenset[str]
    policy: SecurityPolicy
    refuse_unsatisfiable: bool

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> _QueueRules:
        covered = {r for g in spec.get("resourceGroups", []) for r in g["coveredResources"]}
        return cls(
            served=spec.get("workloadClass", "training"),
            covered=frozenset(covered | {"pods"}),
            policy=SecurityPolicy.model_validate(spec.get("securityPolicy", {})),
            refuse_unsatisfiable=spec.get("unsatisfiable", "Hold") == "Refuse",
        )


class _Resolver:
    """Resolves queues, ClusterQueues and priority classes once per request,
    locking them FOR SHARE so that none is deleted under a submission."""

    def __init__(self, conn: Connection, namespace: str, fleet: Fleet | None = None) -> None:
        self._conn = conn
        self._namespace = namespace
        self._fleet = fleet
        self._queues: dict[str, Row[Any] | None] = {}
        self._cqs: dict[str, Row[Any] | None] = {}
        self._classes: dict[str, Row[Any] | None] = {}
        self._rules: dict[str, _QueueRules] = {}

    def _one(
        self, cache: dict[str, Row[Any] | None], kind: str, ns: str, name: str
    ) -> Row[Any] | None:
        # No lock: every submission would otherwise take a share lock on the
        # same LocalQueue and ClusterQueue rows, and Postgres turns concurrent
        # share locks into MultiXacts, which serialise busy queues. A queue
        # deleted at the same moment leaves a workload the admission cycle
        # reports as waiting for its LocalQueue, as Kueue does.
        if name not in cache:
            cache[name] = _exists(self._conn, kind, ns, [name], lock=False).get(name)
        return cache[name]

    def prefetch(self, workloads: Sequence[WorkloadObject]) -> dict[str, Row[Any]]:
        """One query for every LocalQueue, ClusterQueue and priority class the
        workloads name, and the workloads' own rows (tombstones included)."""
        queues = sorted({w.spec.queueName for w in workloads})
        classes = sorted({w.spec.priorityClassName for w in workloads if w.spec.priorityClassName})
        names = sorted({w.metadata.name for w in workloads})
        rows = self._conn.exec_driver_sql(
            _PREFETCH,
            {
                "ns": self._namespace,
                "queues": queues,
                "classes": classes,
                "names": names,
            },
        ).all()
        found: dict[str, dict[str, Row[Any]]] = {}
        for row in rows:
            found.setdefault(row.kind, {})[row.name] = row
        for name in queues:
            self._queues[name] = found.get("LocalQueue", {}).get(name)
        for name, row in found.get("ClusterQueue", {}).items():
            self._cqs[name] = row
        for name in classes:
            self._classes[name] = found.get("WorkloadPriorityClass", {}).get(name)
        return found.get("Workload", {})

    def resolve(self, workload: WorkloadObject) -> Target:
        spec = workload.spec
        queue = self._one(self._queues, "LocalQueue", self._namespace, spec.queueName)
        if queue is None:
            raise UnknownReference(
                f"LocalQueue {spec.queueName} not found in namespace {self._namespace}",
                [("spec.queueName", f"LocalQueue {spec.queueName} not found")],
            )
        cq_name = queue.spec["clusterQueue"]
        cq = self._one(self._cqs, "ClusterQueue", "", cq_name)
        if cq is None:
            raise UnknownReference(
                f"LocalQueue {spec.queueName} points to ClusterQueue {cq_name}, "
                "which does not exist",
                [("spec.queueName", f"ClusterQueue {cq_name} not found")],
            )
        priority = 0
        if spec.priorityClassName:
            wpc = self._one(self._classes, "WorkloadPriorityClass", "", spec.priorityClassName)
            if wpc is None:
                raise UnknownReference(
                    f"WorkloadPriorityClass {spec.priorityClassName} not found",
                    [("spec.priorityClassName", f"{spec.priorityClassName} not found")],
                )
            priority = int(wpc.spec["value"])
        rules = self._rules.get(cq_name)
        if rules is None:
            rules = self._rules[cq_name] = _QueueRules.of(cq.spec)
        if spec.workloadClass != rules.served:
            where = class_field(spec)
            if where is None:  # not chosen: the queue's
                spec.workloadClass = rules.served
            else:
                raise Invalid(
                    f"ClusterQueue {cq_name} serves {rules.served} workloads, "
                    f"not {spec.workloadClass}",
                    [(where, f"must be {rules.served} for queue {spec.queueName}")],
                )
        requests = total_requests(spec)
        missing = sorted(set(requests) - rules.covered)
        if missing:
            raise Invalid(
                f"ClusterQueue {cq_name} has no quota for {', '.join(missing)}",
                [
                    ("spec.podSets", f"resource {r} is not covered by ClusterQueue {cq_name}")
                    for r in missing
                ],
            )
        violations = security_violations(spec, rules.policy)
        if violations:
            raise PolicyRefused(
                f"the workload breaks {len(violations)} rule(s) of "
                f"ClusterQueue {cq_name}'s security policy",
                violations,
            )
        if rules.refuse_unsatisfiable and self._fleet is not None:
            verdict = _verdict(self._fleet(), self._namespace, workload, cq_name)
            if verdict is not None:
                raise Unsatisfiable(
                    f"ClusterQueue {cq_name} refuses a workload that can never be "
                    f"admitted: {verdict.message}",
                    [("spec.podSets", verdict.message)],
                )
        return Target(cq_name, priority, requests)


def _verdict(
    fleet: Snapshot, namespace: str, workload: WorkloadObject | Mapping[str, Any], cq: str
) -> Verdict | None:
    """Whether the workload (its model, or its stored spec) can never be admitted to ``cq``."""
    if isinstance(workload, WorkloadObject):
        name, spec = workload.metadata.name, dump(workload.spec)
    else:
        name, spec = str(workload["metadata"]["name"]), dict(workload["spec"])
    row = WorkloadRow(namespace, name, "", 0, 1, {}, {}, spec, {}, datetime.now(UTC))
    try:
        domain = workload_from_row(row)
    except (ValueError, KeyError, TypeError):  # stored by an older version of the service
        return None
    return never_fits_in(fleet, domain, cq)


__all__ = ["ItemResult", "Outcome", "Submission", "SubmissionService"]
