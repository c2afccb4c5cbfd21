"""What accepted submissions write: each Workload's event, read-model row and
``workload.submitted`` ledger entry, and one wake message per namespace."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from uuid import UUID, uuid4

from service.app import lifecycle
from service.app.kinds import KINDS
from service.app.resources import stream_name, to_object
from service.app.schemas import dump
from service.app.submissions.values import Accepted, Obj, Submission, Target
from service.app.uow import SqlUnitOfWork
from service.domain.events import ADMISSION_WAKE
from service.eventstore.port import EventMetadata, NewEvent, OutboxMessage
from service.ledger import entries as ledger
from service.ledger.chain import NewLedgerEntry
from service.projections.resources import defer_new_workloads

WORKLOADS = KINDS["workloads"]


def new_uuids(count: int) -> Iterator[UUID]:
    """``count`` random (version 4) UUIDs, as ``uuid4()`` makes them, from one
    read of the system's random source. ``uuid4()`` reads it once per id and
    releases the GIL each time: with the event loop's thread busy, each call
    then waits for the GIL to come back."""
    data = os.urandom(16 * count)
    return (UUID(bytes=data[i : i + 16], version=4) for i in range(0, 16 * count, 16))


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


def stage_submissions(uow: SqlUnitOfWork, accepted: Sequence[Accepted]) -> list[Obj]:
    """Each accepted submission's event, read-model row and ledger entry, and
    one wake message per namespace, into ``uow`` (which the caller commits);
    answer the created objects."""
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
        status = lifecycle.submitted(item.target.cluster_queue, stamp).to_json()
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
            stream, item.version, [NewEvent(next(ids), lifecycle.SUBMITTED_EVENT, data, meta)]
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
                {**rows[-1], "resource_version": version, "generation": 1, "created_at": now},
            )
        )
        namespaces[namespace] += 1
        submitted.append(submitted_entry(item.submission, item.target, next(ids), now))
    defer_new_workloads(uow.events.defer, rows, now)
    # Wake the admission cycle (the workers' outbox relay delivers it).
    uow.publish(
        [
            OutboxMessage(uuid4(), ADMISSION_WAKE, {"submitted": n, "namespace": ns})
            for ns, n in namespaces.items()
        ]
    )
    # Last before COMMIT: the ledger's tip lock is held until then.
    uow.record(submitted)
    return objects
