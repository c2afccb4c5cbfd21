"""Read models in, events out: what reconcile and sync load and how they
write a change (an event carrying the object's whole new state, its read-model
row upserted inline, ledger entries alongside, all in the caller's unit of
work) — the same path as the admission cycle's writes."""

from __future__ import annotations

import base64
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import Connection, Engine, text

from service.app.admission import WorkloadRow
from service.app.resources import stream_name
from service.app.uow import SqlUnitOfWork
from service.eventstore.port import EventMetadata, NewEvent, OutboxMessage
from service.ledger.chain import NewLedgerEntry
from service.projections.resources import UPSERT_SQL, resource_row, upsert_params
from workers.plan import ClusterView, WorkloadView

Obj = dict[str, Any]

#: The admission cycle's wake-up topic (workers/tasks.py consumes it).
WAKE_TOPIC = "admission.wake"
#: Events that change what the cycle may admit: quota released, a gang
#: pending again, capacity gone.
WAKES = frozenset(
    {"WorkloadRequeued", "WorkloadFinished", "WorkloadEvicted", "WorkloadCancelled", "ClusterLost"}
)
_WOKEN: weakref.WeakSet[SqlUnitOfWork] = weakref.WeakSet()


def wake(uow: SqlUnitOfWork) -> None:
    """Have the admission cycle run once ``uow`` commits (one message per
    unit of work, however many changes it holds)."""
    if uow not in _WOKEN:
        _WOKEN.add(uow)
        uow.publish([OutboxMessage(uuid4(), WAKE_TOPIC, {})])


# Only the workloads a cluster still has to act on: finished ones keep their
# admission (and would otherwise pile up in every pass).
_WORKLOADS = text(
    "SELECT namespace, name, uid, resource_version, generation, labels, annotations, spec, "
    "status, created_at FROM resources WHERE kind = 'Workload' AND NOT deleted AND ("
    "(status->'admission'->>'cluster' = :cluster "
    "AND status->>'state' IN ('Admitted', 'Running', 'Cancelling')) "
    "OR (status->'eviction'->>'cluster' = :cluster AND status->>'state' = 'Evicted'))"
)
_CONFIG = text(
    "SELECT kind, name, spec FROM resources "
    "WHERE kind IN ('ResourceFlavor', 'Topology', 'ClusterQueue') AND NOT deleted"
)
_CLUSTERS = text(
    "SELECT name, uid, resource_version, generation, labels, annotations, spec, status, "
    "secret, created_at, deleted FROM resources WHERE kind = 'Cluster' AND namespace = ''"
)


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ClusterRow:
    name: str
    uid: str
    version: int
    generation: int
    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    secret: bytes | None
    created_at: datetime
    deleted: bool

    @property
    def state(self) -> str:
        return str(self.status.get("state", "Ready"))

    def data(self, status: Mapping[str, Any], *, keep_secret: bool = True) -> Obj:
        """The Cluster's whole state with ``status``; ``keep_secret=False``
        drops its credentials from the read model (a deleted Cluster's,
        once nothing needs them)."""
        secret = self.secret if keep_secret else None
        return {
            "kind": "Cluster",
            "namespace": "",
            "name": self.name,
            "uid": self.uid,
            "generation": self.generation,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "spec": dict(self.spec),
            "status": dict(status),
            # The row's secret travels with every state, or the upsert drops it.
            "secret": base64.b64encode(secret).decode() if secret else None,
            "created_at": self.created_at.isoformat(),
            "deleted": self.deleted,
        }


def clusters(conn: Connection, name: str | None = None) -> list[ClusterRow]:
    rows = conn.execute(_CLUSTERS).all()
    return [
        ClusterRow(
            r.name,
            str(r.uid),
            int(r.resource_version),
            int(r.generation),
            r.labels or {},
            r.annotations or {},
            r.spec or {},
            r.status or {},
            bytes(r.secret) if r.secret is not None else None,
            r.created_at,
            bool(r.deleted),
        )
        for r in rows
        if name is None or r.name == name
    ]


def workload_rows(conn: Connection, cluster: str) -> list[WorkloadRow]:
    return [
        WorkloadRow(
            r.namespace,
            r.name,
            str(r.uid),
            int(r.resource_version),
            int(r.generation),
            r.labels or {},
            r.annotations or {},
            r.spec,
            r.status or {},
            r.created_at,
        )
        for r in conn.execute(_WORKLOADS, {"cluster": cluster})
    ]


def view(conn: Connection, cluster: str, rows: Sequence[WorkloadRow], uid: str = "") -> ClusterView:
    config: dict[str, dict[str, Mapping[str, Any]]] = {
        "ResourceFlavor": {},
        "Topology": {},
        "ClusterQueue": {},
    }
    for kind, name, spec in conn.execute(_CONFIG):
        config[kind][name] = spec or {}
    return ClusterView(
        cluster=cluster,
        workloads=[
            WorkloadView(r.namespace, r.name, r.uid, r.spec, r.status, r.annotations) for r in rows
        ],
        flavors=config["ResourceFlavor"],
        topologies=config["Topology"],
        cluster_queues=config["ClusterQueue"],
        cluster_uid=uid,
    )


def load(engine: Engine, cluster: str) -> tuple[ClusterRow | None, list[WorkloadRow], ClusterView]:
    """One consistent read of a cluster, its workloads and the config they name."""
    options = {"isolation_level": "REPEATABLE READ"}
    with engine.connect().execution_options(**options) as conn, conn.begin():
        found = clusters(conn, cluster)
        rows = workload_rows(conn, cluster)
        cluster_view = view(conn, cluster, rows, found[0].uid if found else "")
    return (found[0] if found else None), rows, cluster_view


_VERSIONS = text(
    "SELECT r.namespace, r.name, r.resource_version FROM resources r "
    "JOIN unnest(CAST(:namespaces AS text[]), CAST(:names AS text[])) AS k(namespace, name) "
    "ON r.kind = 'Workload' AND r.namespace = k.namespace AND r.name = k.name"
)


def unchanged(engine: Engine, rows: Sequence[WorkloadRow]) -> set[str]:
    """The keys of ``rows`` still at the version they were read at."""
    if not rows:
        return set()
    params = {"namespaces": [r.namespace for r in rows], "names": [r.name for r in rows]}
    with engine.connect() as conn:
        now = {f"{ns}/{name}": int(v) for ns, name, v in conn.execute(_VERSIONS, params)}
    return {r.key for r in rows if now.get(r.key) == r.version}


def append(
    uow: SqlUnitOfWork,
    stream: str,
    version: int,
    kind: str,
    data: Mapping[str, Any],
    actor: str,
    now: datetime,
    ledger: Sequence[NewLedgerEntry] = (),
) -> None:
    """One event with its read-model row (and ledger entries), written in
    ``uow``; a stream changed since ``version`` was read fails the commit."""
    meta = EventMetadata(actor=actor, occurred_at=now)
    uow.events.append(stream, version, [NewEvent(uuid4(), kind, dict(data), meta)])
    uow.events.defer(UPSERT_SQL, [upsert_params(resource_row(data, version + 1, now))])
    if ledger:
        uow.record(list(ledger))
    if kind in WAKES:
        wake(uow)


def append_workload(
    uow: SqlUnitOfWork,
    row: WorkloadRow,
    kind: str,
    status: Mapping[str, Any],
    actor: str,
    now: datetime,
    ledger: Sequence[NewLedgerEntry] = (),
) -> None:
    stream = stream_name("Workload", row.namespace, row.name)
    append(uow, stream, row.version, kind, row.state(status), actor, now, ledger)


def append_cluster(
    uow: SqlUnitOfWork,
    row: ClusterRow,
    kind: str,
    status: Mapping[str, Any],
    actor: str,
    now: datetime,
    ledger: Sequence[NewLedgerEntry] = (),
    *,
    keep_secret: bool = True,
) -> None:
    stream = stream_name("Cluster", "", row.name)
    data = row.data(status, keep_secret=keep_secret)
    append(uow, stream, row.version, kind, data, actor, now, ledger)
