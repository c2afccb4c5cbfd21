"""What people look at: the fleet's islands, the quota tree and a workload's
history, for the web console (``service/console``).

Each view checks the caller's role with the same :func:`require` and kind
roles the API's routes use, and reads the same read models: cluster rows and
the admissions of workloads that hold quota (the fleet), the engine's own
quota tree over them (the queues: Kueue's arithmetic and fair-share values,
not a second copy of it), and the workload's event stream (its timeline).
Names of workloads in namespaces the caller may not read never leave here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, select

from service.app.admission.caches import ConfigCache, cached_workload
from service.app.admission.repository import WorkloadRow, workloads_by_key
from service.app.auth import Principal, Role, require
from service.app.errors import NotFound
from service.app.kinds import KINDS
from service.app.lifecycle import HOLDS_QUOTA, PENDING
from service.app.resources import stream_name
from service.app.visibility import may_read_workloads
from service.domain.times import parse_time
from service.engine import EngineConfig, FairSharingConfig, Snapshot
from service.engine.fair_sharing import dominant_resource_share
from service.engine.quota import QuotaNode
from service.engine.state import CycleState
from service.eventstore.postgres import PostgresEventStore
from service.projections.schema import resources

GPU_SUFFIX = "gpu"
#: Pending reasons shown per ClusterQueue, most frequent first.
TOP_REASONS = 3
EVERYONE = frozenset(Role)


def is_gpu(resource: str) -> bool:
    return resource.endswith(GPU_SUFFIX)


# -- the fleet -----------------------------------------------------------------------------


@dataclass
class Gang:
    """A gang on an island: its name only where the reader may read it."""

    namespace: str | None
    name: str | None
    state: str
    gpus: int


@dataclass
class IslandTile:
    cluster: str
    flavor: str
    island: str
    gpus: int = 0
    used: int = 0
    nodes: int = 0
    ready_nodes: int = 0
    gangs: list[Gang] = field(default_factory=list)

    @property
    def free(self) -> int:
        return max(0, self.gpus - self.used)


@dataclass
class ClusterTile:
    name: str
    state: str
    cordoned: bool
    heartbeat: datetime | None
    lease_ends: datetime | None
    version: str
    islands: list[IslandTile] = field(default_factory=list)


def _holding(engine: Engine) -> list[WorkloadRow]:
    """Every workload that holds quota and capacity now."""
    state = resources.c.status["state"].astext
    query = select(resources.c.namespace, resources.c.name).where(
        resources.c.kind == "Workload",
        resources.c.deleted.is_(False),
        state.in_(sorted(HOLDS_QUOTA)),
    )
    with engine.connect() as conn:
        keys = [(r.namespace, r.name) for r in conn.execute(query)]
        if not keys:
            return []
        return [r for r in workloads_by_key(conn, keys) if admissions(r.status)]


def admissions(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Where a workload holds room: its admission, or each admitted unit's
    (a serving workload's replicas, docs/serving.md)."""
    units = status.get("replicaAdmissions") or ()
    if units:
        return [u.get("admission") or {} for u in units]
    admission = status.get("admission")
    return [admission] if admission else []


def assignment_gpus(assignment: Mapping[str, Any]) -> int:
    """GPUs a pod-set assignment holds, all its pods."""
    total = 0
    for resource, quantity in (assignment.get("resourceUsage") or {}).items():
        if is_gpu(str(resource)):
            try:
                total += int(float(quantity))
            except (TypeError, ValueError):
                continue  # a quantity no GPU count is written as
    return total


def _pod_gpus(assignment: Mapping[str, Any]) -> int:
    """GPUs one pod of a pod-set assignment holds."""
    return assignment_gpus(assignment) // max(int(assignment.get("count") or 1), 1)


def fleet(
    engine: Engine, principal: Principal, lease: timedelta, now: datetime | None = None
) -> list[ClusterTile]:
    """Member clusters with health, heartbeat and lease, and each cluster's
    islands per flavor with the GPUs the admitted gangs use on them."""
    require(principal, KINDS["clusters"].read)
    with engine.connect() as conn:
        rows = conn.execute(
            select(resources)
            .where(resources.c.kind == "Cluster", resources.c.deleted.is_(False))
            .order_by(resources.c.name)
        ).all()
    tiles: dict[str, ClusterTile] = {}
    islands: dict[tuple[str, str], IslandTile] = {}
    node_island: dict[tuple[str, str], IslandTile] = {}
    for row in rows:
        status = dict(row.status or {})
        beat = parse_time(status.get("lastHeartbeat"))
        tile = ClusterTile(
            name=row.name,
            state=str(status.get("state") or "Unknown"),
            cordoned=bool((row.spec or {}).get("cordoned")),
            heartbeat=beat,
            lease_ends=beat + lease if beat is not None else None,
            version=f"{row.resource_version} (generation {row.generation})",
        )
        tiles[row.name] = tile
        for node in (status.get("inventory") or {}).get("nodes") or ():
            flavor = str(node.get("flavor") or "")
            island = str(node.get("island") or f"{row.name}-{flavor}")
            key = (row.name, island)
            if key not in islands:
                islands[key] = IslandTile(row.name, flavor, island)
                tile.islands.append(islands[key])
            found = islands[key]
            found.nodes += 1
            ready = bool(node.get("ready", True)) and not node.get("unschedulable")
            found.ready_nodes += ready
            found.gpus += sum(
                int(float(v)) for r, v in (node.get("allocatable") or {}).items() if is_gpu(str(r))
            )
            node_island[(row.name, str(node.get("name")))] = found
    for workload in _holding(engine):
        _place(workload, node_island, principal)
    for tile in tiles.values():
        tile.islands.sort(key=lambda i: (i.flavor, i.island))
    return list(tiles.values())


def _place(
    workload: WorkloadRow, node_island: Mapping[tuple[str, str], IslandTile], reader: Principal
) -> None:
    """The workload's GPUs on each island it holds: one gang per island, its
    units' (a serving workload's replicas there) summed."""
    on: dict[int, tuple[IslandTile, int]] = {}
    for admission in admissions(workload.status):
        cluster = str(admission.get("cluster"))
        for assignment in admission.get("podSetAssignments") or ():
            per_pod = _pod_gpus(assignment)
            for placed in assignment.get("placement") or ():
                island = node_island.get((cluster, str(placed.get("node"))))
                if island is None:
                    continue
                gpus = per_pod * int(placed.get("count") or 0)
                island.used += gpus
                seen = on.get(id(island))
                on[id(island)] = (island, gpus + (seen[1] if seen else 0))
    readable = may_read_workloads(reader, workload.namespace)
    for island, gpus in on.values():
        island.gangs.append(
            Gang(
                workload.namespace if readable else None,
                workload.name if readable else None,
                str(workload.status.get("state")),
                gpus,
            )
        )


# -- the queues ----------------------------------------------------------------------------


@dataclass
class QuotaRow:
    """One flavor and resource of a ClusterQueue, in canonical amounts."""

    flavor: str
    resource: str
    nominal: int
    usage: int
    borrowed: int
    lent: int
    borrowing_limit: int | None
    lending_limit: int | None


@dataclass
class QueueNode:
    """A Cohort or a ClusterQueue of the tree, children first by kind then name."""

    name: str
    is_cluster_queue: bool
    children: list[QueueNode] = field(default_factory=list)
    rows: list[QuotaRow] = field(default_factory=list)
    admitted: int = 0
    pending: int = 0
    reasons: list[tuple[str, int]] = field(default_factory=list)
    fair_share: float | None = None
    """Kueue's dominant resource share (0 to 1000; infinite when a weight of
    zero borrows), where fair sharing is on."""
    weight: float = 1.0


@dataclass
class QueueTree:
    roots: list[QueueNode]
    fair_sharing: bool
    pending_scope: str
    """Whose pending workloads the counts cover: ``all namespaces`` or the reader's."""


def _pending_counts(
    engine: Engine, namespaces: Iterable[str] | None
) -> dict[str, list[tuple[str, int]]]:
    """Pending workloads per ClusterQueue and reason code, most frequent first."""
    cq = resources.c.status["clusterQueue"].astext
    code = func.coalesce(resources.c.status["pendingReasonCode"].astext, "NotYetTried")
    state = func.coalesce(resources.c.status["state"].astext, PENDING)
    query = (
        select(cq, code, func.count())
        .where(resources.c.kind == "Workload", resources.c.deleted.is_(False), state == PENDING)
        .group_by(cq, code)
    )
    if namespaces is not None:
        query = query.where(resources.c.namespace.in_(sorted(namespaces)))
    found: dict[str, list[tuple[str, int]]] = {}
    with engine.connect() as conn:
        for queue, reason, count in conn.execute(query):
            found.setdefault(str(queue or ""), []).append((str(reason), int(count)))
    for reasons in found.values():
        reasons.sort(key=lambda r: (-r[1], r[0]))
    return found


def _snapshot(engine: Engine, fair_sharing: bool) -> tuple[Snapshot, list[WorkloadRow]]:
    holding = _holding(engine)
    admitted = []
    for row in holding:
        try:
            entry = cached_workload(row)
        except (ValueError, KeyError, TypeError):
            continue  # the admission cycle leaves an unreadable row out too (caches.py)
        if entry.admitted is not None:
            admitted.append(entry.admitted)
        if entry.units is not None:  # a serving workload's admitted replicas
            admitted += entry.units.admitted
    with engine.connect() as conn:
        by_kind = ConfigCache().refresh(conn)
    config = EngineConfig(fair_sharing=FairSharingConfig(enable=fair_sharing))
    snapshot = Snapshot(
        cluster_queues=by_kind.get("ClusterQueue", []),
        resource_flavors=by_kind.get("ResourceFlavor", []),
        cohorts=by_kind.get("Cohort", []),
        local_queues=by_kind.get("LocalQueue", []),
        priority_classes=by_kind.get("WorkloadPriorityClass", []),
        topologies=by_kind.get("Topology", []),
        admitted=admitted,
        config=config,
    )
    return snapshot, holding


def queues(engine: Engine, principal: Principal, fair_sharing: bool) -> QueueTree:
    """The cohort tree with, per ClusterQueue and flavor, nominal quota,
    usage, borrowed and lent; pending counts with their top reasons (in the
    reader's namespaces, for a submitter); fair-share values where on."""
    require(principal, EVERYONE)
    snapshot, holding = _snapshot(engine, fair_sharing)
    state = CycleState(snapshot, datetime.now(UTC).timestamp())
    scoped = not principal.roles - {Role.SUBMITTER} and "*" not in principal.namespaces
    pending = _pending_counts(engine, principal.namespaces if scoped else None)
    admitted: dict[str, int] = {}
    for row in holding:  # a workload counts once, a serving one with all its replicas
        queue = str(admissions(row.status)[0].get("clusterQueue"))
        admitted[queue] = admitted.get(queue, 0) + 1
    lent = _lent(state.tree.roots)
    cache: dict[str, dict[str, int]] = {}

    def view(node: QuotaNode) -> QueueNode:
        out = QueueNode(node.name, node.is_cluster_queue, weight=node.fair_weight)
        out.children = [view(child) for child in node.children]
        if fair_sharing:
            share = dominant_resource_share(node, cache)
            out.fair_share = float("inf") if share[0] else share[1]
        if node.is_cluster_queue:
            out.rows = _rows(node, lent)
            out.admitted = admitted.get(node.name, 0)
            reasons = pending.get(node.name, [])
            out.pending = sum(n for _, n in reasons)
            out.reasons = reasons[:TOP_REASONS]
        return out

    return QueueTree(
        [view(root) for root in state.tree.roots],
        fair_sharing,
        "your namespaces" if scoped else "all namespaces",
    )


def _rows(node: QuotaNode, lent: Mapping[tuple[str, str, str], int]) -> list[QuotaRow]:
    rows = []
    for (flavor, resource), quota in sorted(node.quotas.items(), key=_gpus_first):
        used = node.usage.get((flavor, resource), 0)
        rows.append(
            QuotaRow(
                flavor,
                resource,
                quota.nominal,
                used,
                max(0, used - quota.nominal),
                lent.get((node.name, flavor, resource), 0),
                quota.borrowing_limit,
                quota.lending_limit,
            )
        )
    return rows


def _gpus_first(item: tuple[tuple[str, str], Any]) -> tuple[str, bool, str]:
    (flavor, resource), _ = item
    return flavor, not is_gpu(resource), resource


def _lent(roots: Iterable[QuotaNode]) -> dict[tuple[str, str, str], int]:
    """``(ClusterQueue, flavor, resource) -> amount`` of its nominal quota in
    use by others. Kueue does not say who lends what another borrows: in each
    tree, the borrowed total is attributed to the ClusterQueues that could
    lend, in proportion to what each could lend (unused nominal quota, within
    its lending limit)."""
    out: dict[tuple[str, str, str], int] = {}
    for root in roots:
        queues = root.cluster_queues if not root.is_cluster_queue else [root]
        borrowed: dict[tuple[str, str], int] = {}
        lendable: dict[tuple[str, str], dict[str, int]] = {}
        for cq in queues:
            for fr, quota in cq.quotas.items():
                used = cq.usage.get(fr, 0)
                borrowed[fr] = borrowed.get(fr, 0) + max(0, used - quota.nominal)
                spare = max(0, quota.nominal - used)
                if quota.lending_limit is not None:
                    spare = min(spare, quota.lending_limit)
                if spare:
                    lendable.setdefault(fr, {})[cq.name] = spare
        for fr, spares in lendable.items():
            total, wanted = sum(spares.values()), borrowed.get(fr, 0)
            if not wanted or not total:
                continue
            for name, spare in spares.items():
                out[(name, *fr)] = min(spare, round(wanted * spare / total))
    return out


# -- a workload's history ------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEvent:
    position: int
    type: str
    at: datetime
    actor: str
    status: Mapping[str, Any]
    spec: Mapping[str, Any]
    #: Of a serving workload's units: the replicas the event is about.
    replicas: tuple[int, ...] = ()


def timeline(
    engine: Engine, principal: Principal, namespace: str, name: str
) -> list[TimelineEvent]:
    """The events of Workload ``namespace/name``'s stream, oldest first."""
    require(principal, KINDS["workloads"].read, namespace)
    events = PostgresEventStore(engine).read_stream(stream_name("Workload", namespace, name))
    if not events:
        raise NotFound(f'workloads "{name}" not found')
    return [
        TimelineEvent(
            e.position,
            e.type,
            e.recorded_at,
            e.metadata.actor,
            dict(e.data.get("status") or {}),
            dict(e.data.get("spec") or {}),
            tuple(e.data.get("replicas") or ()),
        )
        for e in events
    ]


__all__ = [
    "ClusterTile",
    "Gang",
    "IslandTile",
    "QueueNode",
    "QueueTree",
    "QuotaRow",
    "TimelineEvent",
    "fleet",
    "queues",
    "timeline",
]
