"""The submit path's queries of the read models: what a submission names,
a workload to cancel, and where a pending one stands in its queue."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Connection, and_, func, or_, select
from sqlalchemy.engine import Row

from service.projections.schema import resources

Obj = dict[str, Any]

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


def named_by(
    conn: Connection,
    namespace: str,
    queues: Sequence[str],
    classes: Sequence[str],
    names: Sequence[str],
) -> list[Row[Any]]:
    """In one query: the live LocalQueues of ``namespace`` among ``queues``,
    the ClusterQueues they point to, the priority classes among ``classes``,
    and the Workload rows of ``names`` (tombstones included)."""
    params = {"ns": namespace, "queues": queues, "classes": classes, "names": names}
    return list(conn.exec_driver_sql(_PREFETCH, params).all())


def runtime_spec(conn: Connection, kind: str, namespace: str, name: str) -> Obj | None:
    """The spec of a live TrainingRuntime (in ``namespace``) or ClusterTrainingRuntime
    (``namespace`` ``""``), or None when there is none of that name."""
    found = conn.execute(
        select(resources.c.spec).where(
            resources.c.kind == kind,
            resources.c.namespace == namespace,
            resources.c.name == name,
            resources.c.deleted.is_(False),
        )
    ).scalar_one_or_none()
    return dict(found) if found is not None else None


def workload_for_update(conn: Connection, namespace: str, name: str) -> Row[Any] | None:
    """A live Workload's row, locked until commit."""
    return conn.execute(
        select(resources)
        .where(
            resources.c.kind == "Workload",
            resources.c.namespace == namespace,
            resources.c.name == name,
            resources.c.deleted.is_(False),
        )
        .with_for_update()
    ).first()


def _priority() -> ColumnElement[Any]:
    return func.coalesce(resources.c.spec["priority"].astext.cast(BigInteger()), 0)


@dataclass(frozen=True)
class QueueOrder:
    """SQL conditions for a workload's ClusterQueue's queued workloads
    (``pending``: pending and not held out of the queue), and for those before
    it in admission order (``ahead``: priority, then age, then name)."""

    pending: ColumnElement[bool]
    ahead: ColumnElement[bool]


def queue_order(conn: Connection, obj: Obj, held_reason: str) -> QueueOrder:
    """``held_reason``: the pending reason code of a workload the cycle leaves
    out of its snapshot; such a workload is ahead of nobody."""
    status, spec, meta = obj["status"], obj["spec"], obj["metadata"]
    cq = status.get("clusterQueue")
    priority = int(spec.get("priority", 0))
    prio = _priority()
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
        func.coalesce(resources.c.status["pendingReasonCode"].astext, "") != held_reason,
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
    return QueueOrder(pending, ahead)


@dataclass(frozen=True)
class QueueCounts:
    """Where a workload stands: its 1-based ``position`` among the ClusterQueue's
    ``total`` queued workloads, and how many are ahead of it per namespace."""

    position: int
    total: int
    ahead_by_namespace: list[tuple[str, int]]


def queue_counts(conn: Connection, order: QueueOrder) -> QueueCounts:
    """One pass over the queued workloads for the position, the total and the
    ahead per namespace (it reads every queued row: the total needs them all)."""
    rows = conn.execute(
        select(
            resources.c.namespace,
            func.count().filter(order.ahead),
            func.count(),
        )
        .where(order.pending)
        .group_by(resources.c.namespace)
    ).all()
    ahead = [(str(ns), int(n)) for ns, n, _ in rows if n]
    return QueueCounts(
        position=sum(n for _, n in ahead) + 1,
        total=sum(int(total) for _, _, total in rows),
        ahead_by_namespace=ahead,
    )


def ahead_names(
    conn: Connection, order: QueueOrder, namespaces: Sequence[str], limit: int
) -> list[str]:
    """The first ``limit`` queued workloads ahead in ``namespaces``, in
    admission order, as ``namespace/name``."""
    rows = conn.execute(
        select(resources.c.namespace, resources.c.name)
        .where(order.pending, order.ahead, resources.c.namespace.in_(namespaces))
        # Ties as ``ahead`` breaks them, and the engine (by ``namespace/name``).
        .order_by(
            _priority().desc(),
            resources.c.created_at,
            resources.c.namespace + "/" + resources.c.name,
        )
        .limit(limit)
    ).all()
    return [f"{ns}/{n}" for ns, n in rows]
