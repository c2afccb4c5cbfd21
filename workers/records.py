"""Read models in, events out: what reconcile and sync load and how they
write a change (an event carrying the object's whole new state, its read-model
row upserted inline, ledger entries alongside, all in the caller's unit of
work) — the same path as the admission cycle's writes."""

from __future__ import annotations

import base64
import json
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import Connection, Engine, text

from service.app.admission import WorkloadRow, workloads_by_key
from service.app.resources import stream_name
from service.app.uow import SqlUnitOfWork
from service.eventstore.port import EventMetadata, NewEvent, OutboxMessage
from service.ledger.chain import NewLedgerEntry
from service.projections.resources import defer_resources, resource_row
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
# admission (and would otherwise pile up in every pass). Their (uid,
# version) stamps first, whole rows only for what a process has not read at
# that version (RowCache).
# A serving workload is here while any of its replicas is admitted here
# (``replicaAdmissions``: workers/plan/serving.py), or while sync has a
# count of its replicas available here to take back.
_HERE = (
    "kind = 'Workload' AND NOT deleted AND ("
    "(status->'admission'->>'cluster' = :cluster "
    "AND status->>'state' IN ('Admitted', 'Running', 'Cancelling')) "
    "OR (status->'eviction'->>'cluster' = :cluster AND status->>'state' = 'Evicted') "
    "OR (status->'replicaAdmissions' @> CAST(:units AS jsonb) "
    "AND status->>'state' IN ('Pending', 'Admitted', 'Running', 'Cancelling')) "
    "OR (status->'availableByCluster'->>CAST(:cluster AS text) IS NOT NULL))"
)
_WORKLOAD_STAMPS = text(
    f"SELECT namespace, name, CAST(uid AS text), resource_version FROM resources WHERE {_HERE}"
)
_CONFIG = text(
    "SELECT kind, name, spec FROM resources "
    "WHERE kind IN ('ResourceFlavor', 'Topology', 'ClusterQueue') AND NOT deleted"
)
_CLUSTERS = text(
    "SELECT name, uid, resource_version, generation, labels, annotations, spec, status, "
    "secret, created_at, deleted FROM resources WHERE kind = 'Cluster' AND namespace = '' "
    "AND (CAST(:name AS text) IS NULL OR name = :name)"
)


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

    @property
    def backend(self) -> str:
        """``spec.backend``, else what discovery recorded (``status.backend``,
        written by sync), else ``kueue``: what every member was before."""
        return str(self.spec.get("backend") or self.status.get("backend") or "kueue")

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
    """Every Cluster row, or only ``name``'s (each carries its inventory:
    reading all to keep one was a pass's largest read)."""
    rows = conn.execute(_CLUSTERS, {"name": name}).all()
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
    ]


Stamp = tuple[str, int]


class RowCache:
    """The workload rows of each cluster as last read, by key, valid for one
    (uid, version): a pass reads every row it acts on, and decoding each
    in-flight gang's JSON pass after pass was most of what a pass cost. A
    version changes with every event, so a stamp identifies a row's content;
    rows are never written to (every change builds new dicts)."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, tuple[Stamp, WorkloadRow]]] = {}
        self._lock = threading.Lock()

    def rows(self, conn: Connection, cluster: str) -> list[WorkloadRow]:
        stamps = {
            f"{ns}/{name}": (ns, name, (uid, int(version)))
            for ns, name, uid, version in conn.execute(
                _WORKLOAD_STAMPS, {"cluster": cluster, "units": _units(cluster)}
            )
        }
        with self._lock:
            known = dict(self._rows.get(cluster, {}))
        missing = [
            (ns, name)
            for key, (ns, name, stamp) in stamps.items()
            if (hit := known.get(key)) is None or hit[0] != stamp
        ]
        if missing:
            for row in workloads_by_key(conn, missing):
                known[row.key] = ((row.uid, row.version), row)
        # Read in the caller's transaction, so each row is the one stamped;
        # one that moved on between the two reads (not possible in a
        # REPEATABLE READ, but cheap to check) is left out of the result.
        fresh = {
            key: known[key][1]
            for key, (_, _, stamp) in stamps.items()
            if key in known and known[key][0] == stamp
        }
        with self._lock:
            self._rows[cluster] = {k: known[k] for k in fresh}
        return list(fresh.values())


def _units(cluster: str) -> str:
    """What a ``replicaAdmissions`` list holding a replica admitted to
    ``cluster`` contains (jsonb containment, ``@>``)."""
    return json.dumps([{"admission": {"cluster": cluster}}])


#: This process's rows (a Celery pool process, the scheduler's fleet loop).
ROWS = RowCache()


def workload_rows(conn: Connection, cluster: str) -> list[WorkloadRow]:
    return ROWS.rows(conn, cluster)


def view(
    conn: Connection,
    cluster: str,
    rows: Sequence[WorkloadRow],
    uid: str = "",
    backend: str = "kueue",
    inventory: Sequence[Mapping[str, Any]] = (),
) -> ClusterView:
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
            WorkloadView(r.namespace, r.name, r.uid, r.spec, r.status, r.annotations, r.version)
            for r in rows
        ],
        flavors=config["ResourceFlavor"],
        topologies=config["Topology"],
        cluster_queues=config["ClusterQueue"],
        cluster_uid=uid,
        backend=backend,
        hyper_islands=hyper_islands(inventory),
    )


def hyper_islands(nodes: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """The islands that sync found as tier-1 HyperNodes, with their nodes."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        if node.get("islandFrom") == "HyperNode":
            out.setdefault(str(node["island"]), []).append(str(node["name"]))
    return {island: tuple(sorted(names)) for island, names in out.items()}


def cluster_row(engine: Engine, cluster: str) -> ClusterRow | None:
    """``cluster``'s row alone (what a pass checks before it lists the member)."""
    with engine.connect() as conn:
        found = clusters(conn, cluster)
    return found[0] if found else None


def load(engine: Engine, cluster: str) -> tuple[ClusterRow | None, list[WorkloadRow], ClusterView]:
    """One consistent read of a cluster, its workloads and the config they name."""
    options = {"isolation_level": "REPEATABLE READ"}
    with engine.connect().execution_options(**options) as conn, conn.begin():
        found = clusters(conn, cluster)
        rows = workload_rows(conn, cluster)
        row = found[0] if found else None
        cluster_view = view(
            conn,
            cluster,
            rows,
            row.uid if row else "",
            row.backend if row else "kueue",
            ((row.status.get("inventory") or {}).get("nodes") or ()) if row else (),
        )
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


_BATCHES: weakref.WeakKeyDictionary[SqlUnitOfWork, list[NewLedgerEntry]] = (
    weakref.WeakKeyDictionary()
)


@contextmanager
def one_ledger_append(uow: SqlUnitOfWork) -> Iterator[None]:
    """The ledger entries that :func:`append` writes in ``uow`` meanwhile,
    chained in one ``record`` when the block ends (before the commit, in
    the same order). Each ``record`` looks its entries up in the ledger
    first (a repeated entry id is not stored twice), a round trip of its
    own: sync's batch of 200 finished gangs paid 200 of them."""
    entries: list[NewLedgerEntry] = []
    _BATCHES[uow] = entries
    try:
        yield
    finally:
        del _BATCHES[uow]
    if entries:
        uow.record(entries)


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
    defer_resources(uow.events.defer, [resource_row(data, version + 1, now)])
    if ledger:
        batch = _BATCHES.get(uow)
        if batch is None:
            uow.record(list(ledger))
        else:
            batch += ledger
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
