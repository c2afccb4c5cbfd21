"""The admission cycle's queries of the read models.

Each kind of row is read in two steps: every live object's stamp first, then
whole rows only for those a cache has not seen at that stamp (caches.py). A
stamp identifies a row's content: its version changes with every event, its
uid with every re-creation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, text

#: ``(kind, namespace, name)`` of a configuration object.
ConfigKey = tuple[str, str, str]

_CONFIG_STAMPS = text(
    "SELECT kind, namespace, name, resource_version, CAST(uid AS text) FROM resources "
    "WHERE NOT deleted AND kind = ANY(:kinds)"
)
_CONFIG_ROWS = text(
    "SELECT r.kind, r.namespace, r.name, r.resource_version, CAST(r.uid AS text) AS uid, "
    "r.labels, r.spec, r.status "
    "FROM resources r JOIN unnest(CAST(:kinds AS text[]), CAST(:namespaces AS text[]), "
    "CAST(:names AS text[])) AS k(kind, namespace, name) "
    "ON r.kind = k.kind AND r.namespace = k.namespace AND r.name = k.name"
)
_WORKLOAD_STAMPS = text(
    "SELECT namespace, name, uid, resource_version FROM resources "
    "WHERE kind = 'Workload' AND NOT deleted "
    "AND coalesce(status->>'state', 'Pending') = ANY(:states)"
)
# The four JSON columns as one document: one decode a row rather than four
# (each through psycopg's loader and the process's JSON reader: most of what
# reading a row cost).
_WORKLOAD_ROWS = text(
    "SELECT r.namespace, r.name, CAST(r.uid AS text), r.resource_version, r.generation, "
    "r.created_at, jsonb_build_array(r.labels, r.annotations, r.spec, r.status) "
    "FROM resources r "
    "JOIN unnest(CAST(:namespaces AS text[]), CAST(:names AS text[])) AS k(namespace, name) "
    "ON r.kind = 'Workload' AND r.namespace = k.namespace AND r.name = k.name"
)

Obj = dict[str, Any]


@dataclass(frozen=True)
class WorkloadRow:
    """A workload's read-model row as the cycle saw it: what it writes against."""

    namespace: str
    name: str
    uid: str
    version: int
    generation: int
    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    created_at: datetime

    @classmethod
    def packed(cls, r: Any) -> WorkloadRow:
        """From a row of :func:`workloads_by_key`'s query."""
        namespace, name, uid, version, generation, created_at, json_columns = r
        labels, annotations, spec, status = json_columns
        return cls(
            namespace,
            name,
            uid,
            int(version),
            int(generation),
            labels or {},
            annotations or {},
            spec,
            status or {},
            created_at,
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def state(self, status: Mapping[str, Any], spec: Mapping[str, Any] | None = None) -> Obj:
        """The event data of this workload with a new status (and spec)."""
        return {
            "kind": "Workload",
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "generation": self.generation,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "spec": dict(spec if spec is not None else self.spec),
            "status": dict(status),
            "created_at": self.created_at.isoformat(),
        }


def config_stamps(conn: Connection, kinds: Sequence[str]) -> dict[ConfigKey, tuple[int, str]]:
    """``(version, uid)`` of every live object of ``kinds``. An object deleted
    and created again may come back at a version a cache holds, never with
    the same uid."""
    return {
        (kind, ns, name): (int(version), str(uid))
        for kind, ns, name, version, uid in conn.execute(_CONFIG_STAMPS, {"kinds": list(kinds)})
    }


def config_rows(conn: Connection, keys: Sequence[ConfigKey]) -> Iterable[Row[Any]]:
    """The rows of ``keys``: kind, namespace, name, resource_version, uid,
    labels, spec, status."""
    params = {
        "kinds": [k[0] for k in keys],
        "namespaces": [k[1] for k in keys],
        "names": [k[2] for k in keys],
    }
    return conn.execute(_CONFIG_ROWS, params)


def workload_stamps(
    conn: Connection, states: Sequence[str]
) -> dict[str, tuple[str, str, tuple[str, int]]]:
    """``key -> (namespace, name, (uid, version))`` of every live workload in
    one of ``states`` (no state: Pending)."""
    return {
        f"{ns}/{name}": (ns, name, (str(uid), int(version)))
        for ns, name, uid, version in conn.execute(_WORKLOAD_STAMPS, {"states": list(states)})
    }


def workloads_by_key(conn: Connection, keys: Sequence[tuple[str, str]]) -> Iterator[WorkloadRow]:
    """Whole workload rows by ``(namespace, name)``, tombstones included: the
    admission cycle's cache and the workers' RowCache read with it."""
    params = {"namespaces": [k[0] for k in keys], "names": [k[1] for k in keys]}
    return map(WorkloadRow.packed, conn.execute(_WORKLOAD_ROWS, params))


# Every preemption that took a token of a ClusterQueue's budget, in ledger order
# (the partial index is not needed: the scheduler reads this once as it starts
# leading, and preemptions are few beside the ledger's other entries).
_BUDGETED_PREEMPTIONS = text(
    "SELECT body->>'cluster_queue', recorded_at FROM ledger_entries "
    "WHERE kind = 'workload.preempted' AND (body->>'budgeted') = 'true' ORDER BY seq"
)


def budgeted_preemptions(conn: Connection) -> list[tuple[str, float]]:
    """``(ClusterQueue, time)`` of every budgeted preemption the ledger holds."""
    return [(str(cq), at.timestamp()) for cq, at in conn.execute(_BUDGETED_PREEMPTIONS)]
