"""Teams' commands on Workloads: submit (one, in a group commit, or in
bulk), cancel, explain."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from typing import Any
from uuid import uuid4

from sqlalchemy import Connection, Engine

from service.app import lifecycle
from service.app.admission import ConfigCache, flavors_without_nodes, fleet_snapshot
from service.app.auth import require
from service.app.errors import (
    AlreadyExists,
    AppError,
    Invalid,
    NotFound,
    PolicyRefused,
    UnsupportedKind,
)
from service.app.kinds import KINDS
from service.app.kube_schemas import custom_problems
from service.app.resources import Actor, ResourceService, check_version, stream_name, to_object
from service.app.submissions.explain import explain as _explain
from service.app.submissions.repository import runtime_spec, workload_for_update
from service.app.submissions.resolver import Resolver
from service.app.submissions.values import (
    REFUSED_BY_DATABASE,
    Accepted,
    Fleet,
    ItemResult,
    Obj,
    Outcome,
    Submission,
    Unstorable,
)
from service.app.submissions.writes import stage_submissions
from service.app.uow import SqlUnitOfWork
from service.app.workloads import (
    SubmissionError,
    WorkloadObject,
    parse_submission,
    scale_problems,
)
from service.domain.events import ADMISSION_WAKE, RECONCILE_CLUSTER
from service.domain.jobs import TRAINJOB_ANNOTATION, trainjob_jobset
from service.engine import Snapshot
from service.eventstore.port import (
    ANY_VERSION,
    ConcurrencyConflict,
    EventMetadata,
    NewEvent,
    OutboxMessage,
)
from service.ledger import entries as ledger
from service.projections.resources import resource_row, upsert_resources

WORKLOADS = KINDS["workloads"]
MAX_BULK = 5000
BULK_CHUNK = 1000


def _by_namespace(
    submissions: Sequence[Submission],
) -> dict[str, list[tuple[int, Submission]]]:
    groups: dict[str, list[tuple[int, Submission]]] = {}
    for index, submission in enumerate(submissions):
        groups.setdefault(submission.namespace, []).append((index, submission))
    return groups


RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")


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
        body = self._trainjob_as_jobset(namespace, body)
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

    def _trainjob_as_jobset(self, namespace: str, body: Any) -> Any:
        """A TrainJob becomes the JobSet its registered runtime describes (as Kueue's
        trainjob integration reads it, and as it runs on the member); the TrainJob is
        read against its CRD first, and a runtime not registered is named."""
        if not isinstance(body, Mapping) or body.get("kind") != "TrainJob":
            return body
        problems = custom_problems(body)
        if problems:
            raise Invalid("the submission is invalid: the TrainJob", problems)
        ref = (body.get("spec") or {}).get("runtimeRef") or {}
        kind = str(ref.get("kind") or "ClusterTrainingRuntime")
        if kind not in RUNTIME_KINDS:
            raise Invalid(
                "the submission is invalid",
                [("spec.runtimeRef.kind", f"must be one of {list(RUNTIME_KINDS)}")],
            )
        scope = namespace if kind == "TrainingRuntime" else ""
        with self._engine.connect() as conn:
            runtime = runtime_spec(conn, kind, scope, str(ref.get("name") or ""))
        if runtime is None:
            where = f" in namespace {namespace}" if scope else ""
            raise Invalid(
                "the submission is invalid",
                [("spec.runtimeRef", f"no {kind} {ref.get('name')!r}{where} is registered")],
            )
        jobset = trainjob_jobset(body, runtime)
        annotations = jobset["metadata"].setdefault("annotations", {})
        annotations[TRAINJOB_ANNOTATION] = f"{kind}/{ref.get('name')}"
        return jobset

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
                except REFUSED_BY_DATABASE:
                    break
        return [self._try_alone(submission) for submission in submissions]

    def _try_alone(self, submission: Submission) -> Outcome:
        try:
            return self._try_group([submission])[0]
        except AlreadyExists as error:
            return error
        except REFUSED_BY_DATABASE as error:
            return Unstorable(f"refused: {getattr(error, 'orig', None) or error}")

    def _try_group(self, submissions: Sequence[Submission]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(submissions)
        accepted: list[tuple[int, Accepted]] = []
        with self._uow() as uow:
            fleet = self._lazy_fleet(uow.connection)
            for namespace, indexed in _by_namespace(submissions).items():
                resolver = Resolver(uow.connection, namespace, fleet)
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
                    accepted.append((index, Accepted(submission, target, version)))
            if accepted:
                created = self._append(uow, [a for _, a in accepted])
                for (index, _), obj in zip(accepted, created, strict=True):
                    outcomes[index] = obj
        return [o if o is not None else AppError("not submitted") for o in outcomes]

    def _append(self, uow: SqlUnitOfWork, accepted: Sequence[Accepted]) -> list[Obj]:
        objects = stage_submissions(uow, accepted)
        try:
            uow.commit()
        except ConcurrencyConflict as error:
            raise AlreadyExists(f"a workload was created concurrently: {error}") from error
        return objects

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
        # Each chunk runs in a copy of this context, as the caller's thread
        # would run it (the API tracks a write's transactions in its context).
        contexts = [copy_context() for _ in chunks]
        with ThreadPoolExecutor(2, thread_name_prefix="bulk") as pool:
            done = pool.map(lambda c, chunk: c.run(self.submit_parsed, chunk), contexts, chunks)
            return [o for outcomes in done for o in outcomes]

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
            row = workload_for_update(conn, namespace, name)
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
            data = _state(row, status)
            uow.events.append(
                stream_name("Workload", namespace, name),
                row.resource_version,
                [NewEvent(uuid4(), change.event, data, meta)],
            )
            new = resource_row(data, row.resource_version + 1, meta.occurred_at)
            upsert_resources(conn, [new])
            cluster = (status.get("admission") or {}).get("cluster")
            clusters = lifecycle.unit_clusters(change.status) | (
                {str(cluster)} if cluster else set()
            )
            if change.status.state == lifecycle.CANCELLING:
                # Remove its job (a serving workload's units) now rather than at the next resync.
                messages = [{"cluster": c} for c in sorted(clusters)]
                uow.publish([OutboxMessage(uuid4(), RECONCILE_CLUSTER, m) for m in messages])
            uow.commit()
        return to_object(WORKLOADS, new)

    # -- scale ---------------------------------------------------------------------------

    def get_scale(self, actor: Actor, namespace: str, name: str) -> Obj:
        """The workload's ``Scale``: replicas asked and replicas admitted."""
        obj = self._resources.get(actor.principal, "workloads", namespace, name)
        return scale_object(obj)

    def scale(
        self, actor: Actor, namespace: str, name: str, body: Any, if_match: str | None = None
    ) -> Obj:
        """Set a serving workload's replicas (``lifecycle.scale``): admission
        then asks for the new replicas only, and releases the removed ones."""
        require(actor.principal, WORKLOADS.write, namespace)
        with self._uow() as uow:
            conn = uow.connection
            row = workload_for_update(conn, namespace, name)
            if row is None:
                raise NotFound(f'workloads "{name}" not found')
            check_version(if_match, row)
            replicas, problems = scale_problems(row.spec, body)
            if not problems and row.status.get("state") in ("Finished", "Cancelled", "Cancelling"):
                problems = [("spec.replicas", "the workload has ended: it no longer scales")]
            if problems:
                raise Invalid("the scale is invalid", problems)
            if row.spec.get("replicas", 1) == replicas:
                return scale_object(to_object(WORKLOADS, row))
            meta = actor.metadata()
            new = self._scaled(uow, row, replicas, meta)
            uow.commit()
        return scale_object(to_object(WORKLOADS, new))

    def _scaled(self, uow: SqlUnitOfWork, row: Any, replicas: int, meta: EventMetadata) -> Obj:
        """The scale's events into ``uow``: ``WorkloadScaled``, then on a scale
        down a ``WorkloadFinished`` naming the units released (``replicas``,
        highest index first; each its own closing ledger entry), all one
        append; the row as
        they leave it; a reconcile of the members whose units go, and a wake
        of the admission cycle (freed quota, or new units to admit)."""
        now = meta.occurred_at
        change = lifecycle.scale(lifecycle.Status(row.status), row.spec, replicas, now)
        subject = lifecycle.Subject.of(row)
        released = lifecycle.release_replicas(subject, change.status, replicas, now)
        base = {**_state(row, {}), "spec": change.spec, "generation": row.generation + 1}
        data = {**base, "status": change.status.to_json()}
        events = [NewEvent(uuid4(), change.event, data, meta)]
        if released:
            # One event for the units released, naming them (see admission.writes).
            gone = [step.replica for step in released]
            data = {**base, "status": released[-1].status.to_json(), "replicas": gone}
            events.append(NewEvent(uuid4(), released[-1].event, data, meta))
        stream = stream_name("Workload", row.namespace, row.name)
        uow.events.append(stream, row.resource_version, events)
        new = resource_row(data, row.resource_version + len(events), now)
        upsert_resources(uow.connection, [new])
        if released:
            uow.record([e for step in released for e in step.entries])
            # Where the released units ran: their member objects shrink now.
            units = lifecycle.Status(row.status).units
            where = {str(u["admission"]["cluster"]) for u in units if u["replica"] >= replicas}
            uow.publish(
                [OutboxMessage(uuid4(), RECONCILE_CLUSTER, {"cluster": c}) for c in sorted(where)]
            )
        key = f"{row.namespace}/{row.name}"
        uow.publish([OutboxMessage(uuid4(), ADMISSION_WAKE, {"scaled": key})])
        return new

    # -- explain -------------------------------------------------------------------------

    def explain(self, actor: Actor, namespace: str, name: str) -> Obj:
        """Where the workload stands and the true cause of a wait
        (``submissions.explain``)."""
        obj = self._resources.get(actor.principal, "workloads", namespace, name)
        return _explain(namespace, name, obj, actor.principal, self._engine, self._fleet)


def _state(row: Any, status: Obj) -> Obj:
    """The event data of Workload ``row`` with a new ``status``."""
    return {
        "kind": "Workload",
        "namespace": row.namespace,
        "name": row.name,
        "uid": str(row.uid),
        "generation": row.generation,
        "labels": row.labels,
        "annotations": row.annotations,
        "spec": row.spec,
        "status": status,
        "created_at": row.created_at.isoformat(),
    }


def scale_object(obj: Mapping[str, Any]) -> Obj:
    """A Workload as Kubernetes' ``autoscaling/v1`` ``Scale``: ``spec.replicas``
    asked, ``status.replicas`` admitted (``status.replicaAdmissions``)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 1)},
        "status": {"replicas": len(status.get("replicaAdmissions") or ())},
    }
