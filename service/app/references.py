"""References between the API's objects: what an object names must exist
(a ClusterQueue's flavors, a flavor's topology, a LocalQueue's ClusterQueue,
a cohort's parent without a cycle), and what still names an object before
it may be deleted. Queries on the ``resources`` read model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, or_, select, text
from sqlalchemy.engine import Row

from service.app.kinds import Kind
from service.projections.schema import resources

Obj = dict[str, Any]


def exists(
    conn: Connection, kind: str, namespace: str, names: Sequence[str], lock: bool = True
) -> dict[str, Row[Any]]:
    """Live objects among ``names``, locked FOR SHARE until commit unless
    ``lock`` is false."""
    if not names:
        return {}
    query = select(resources).where(
        resources.c.kind == kind,
        resources.c.namespace == namespace,
        resources.c.name.in_(sorted(set(names))),
        resources.c.deleted.is_(False),
    )
    if lock:
        query = query.with_for_update(read=True)
    return {r.name: r for r in conn.execute(query).all()}


def _flavor_names(spec: Obj) -> list[tuple[str, str]]:
    return [
        (f"spec.resourceGroups[{g}].flavors[{f}].name", flavor["name"])
        for g, group in enumerate(spec.get("resourceGroups") or [])
        for f, flavor in enumerate(group.get("flavors") or [])
    ]


def references(
    conn: Connection, kind: Kind, namespace: str, name: str, spec: Obj, current: Row[Any] | None
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if kind.kind in ("ClusterQueue", "Cohort"):
        flavors = _flavor_names(spec)
        found = exists(conn, "ResourceFlavor", "", [n for _, n in flavors])
        problems += [(p, f"ResourceFlavor {n} not found") for p, n in flavors if n not in found]
    if kind.kind == "ResourceFlavor" and spec.get("topologyName"):
        if not exists(conn, "Topology", "", [spec["topologyName"]]):
            problems.append(("spec.topologyName", f"Topology {spec['topologyName']} not found"))
        if current is not None and not current.deleted:
            before = current.spec.get("topologyName")
            if before and before != spec.get("topologyName"):
                problems.append(("spec.topologyName", "topologyName is immutable when set"))
    if kind.kind == "Cohort" and spec.get("parentName"):
        problems += _cohort_cycle(conn, name, spec["parentName"])
    if kind.kind == "LocalQueue":
        moved = current is not None and current.spec.get("clusterQueue") != spec["clusterQueue"]
        if moved and current is not None and not current.deleted:
            problems.append(("spec.clusterQueue", "field is immutable"))
        if not exists(conn, "ClusterQueue", "", [spec["clusterQueue"]]):
            problems.append(("spec.clusterQueue", f"ClusterQueue {spec['clusterQueue']} not found"))
    return problems


def _cohort_cycle(conn: Connection, name: str, parent: str) -> list[tuple[str, str]]:
    if parent == name:
        return [("spec.parentName", "a cohort cannot be its own parent")]
    parents: dict[str, str | None] = dict(
        conn.execute(
            select(resources.c.name, resources.c.spec["parentName"].astext).where(
                resources.c.kind == "Cohort", resources.c.deleted.is_(False)
            )
        ).all()
    )
    seen = [name, parent]
    node: str | None = parent
    while node is not None and (node := parents.get(node)) is not None:
        if node in seen:
            return [("spec.parentName", f"cohort cycle: {' -> '.join([*seen, node])}")]
        seen.append(node)
    return []


_ACTIVE_WORKLOAD = text("coalesce(status->>'state', 'Pending') NOT IN ('Finished', 'Cancelled')")


def dependents(conn: Connection, kind: Kind, namespace: str, name: str) -> list[str]:
    """What still refers to this object, as ``Kind/name`` strings."""
    live = resources.c.deleted.is_(False)

    def users(*conditions: Any) -> list[str]:
        rows = conn.execute(
            select(resources.c.kind, resources.c.namespace, resources.c.name)
            .where(live, *conditions)
            .order_by(resources.c.kind, resources.c.namespace, resources.c.name)
            .limit(11)
        ).all()
        return [f"{r.kind}/{r.namespace + '/' if r.namespace else ''}{r.name}" for r in rows]

    contains = resources.c.spec.contains
    if kind.kind == "Topology":
        return users(resources.c.kind == "ResourceFlavor", contains({"topologyName": name}))
    if kind.kind == "ResourceFlavor":
        used = {"resourceGroups": [{"flavors": [{"name": name}]}]}
        return users(resources.c.kind.in_(["ClusterQueue", "Cohort"]), contains(used))
    if kind.kind == "Cohort":
        return users(
            or_(
                and_(resources.c.kind == "Cohort", contains({"parentName": name})),
                and_(resources.c.kind == "ClusterQueue", contains({"cohortName": name})),
            )
        )
    if kind.kind == "ClusterQueue":
        return users(resources.c.kind == "LocalQueue", contains({"clusterQueue": name}))
    if kind.kind == "LocalQueue":
        return users(
            resources.c.kind == "Workload",
            resources.c.namespace == namespace,
            contains({"queueName": name}),
            _ACTIVE_WORKLOAD,
        )
    if kind.kind == "WorkloadPriorityClass":
        return users(
            resources.c.kind == "Workload", contains({"priorityClassName": name}), _ACTIVE_WORKLOAD
        )
    if kind.kind == "Cluster":
        # A gang admitted there, or a serving workload with a replica there.
        here = {"admission": {"cluster": name}}
        return users(
            resources.c.kind == "Workload",
            or_(
                resources.c.status.contains(here),
                resources.c.status.contains({"replicaAdmissions": [here]}),
            ),
            _ACTIVE_WORKLOAD,
        )
    return []
