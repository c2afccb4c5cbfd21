"""The admission cycle's application side: read models → engine snapshot, and
the engine's decisions → events, read-model rows and ledger entries, all in
one transaction.

The engine (service/engine) decides; this module only translates. The cycle
runs in whoever holds the leadership (workers/scheduler.py), which passes a
``guard`` that runs first in the commit transaction: its fencing check.

Shapes this module reads and writes (documented here because the sync and
reconcile workers meet them):

* ``Cluster.status``: ``state`` (``Ready`` | ``Lost``; absent means Ready) and
  ``inventory.nodes``: a list of ``{name, flavor, island, allocatable:
  {resource: quantity}, reserved: {resource: quantity}, labels, taints:
  [{key, value, effect}], ready, unschedulable}``. ``reserved`` is what pods
  Quartermaster does not manage take; gangs it admitted are derived from the
  admissions. ``flavor`` and ``island`` are decided by whoever writes the
  inventory (the flavor whose nodeLabels the node carries; the value of the
  flavor topology's island level, or one island per cluster and flavor).
* ``Workload.status``: ``state`` is ``Pending`` → ``Admitted`` (this cycle) →
  ``Running`` / ``Finished`` (sync); ``Evicted`` when preempted or evicted by
  the engine (quota released at once; the reconciler deletes the job from
  ``status.eviction.cluster`` and then requeues it as ``Pending`` with
  ``queuedAt``); ``Cancelling`` holds quota until the member cluster has
  removed it. ``status.admission`` is ``{clusterQueue, cluster, island,
  podSetAssignments: [{name, count, flavors: {resource: flavor},
  resourceUsage: {resource: quantity}, placement: [{node, count}], islands}],
  borrowed: {flavor: {resource: quantity}}, preempted: [ns/name], admittedAt}``.
  A pending workload carries ``pendingReason`` (words), ``pendingReasonCode``
  (Kueue's reason), ``pendingReasonAt`` (when they were written: the same
  reason in other words is rewritten at most every 30 s) and a
  ``QuotaReserved=False`` condition saying the same.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import Engine, text

from service.app import lifecycle
from service.app.lifecycle import HOLDS_QUOTA
from service.app.resources import stream_name
from service.app.uow import SqlUnitOfWork
from service.app.workloads import Problems, pod_requests
from service.domain.inventory import Cluster, Node
from service.domain.manifests import (
    WORKLOAD_CLASS_LABEL,
    cluster_queue_from_manifest,
    cohort_from_manifest,
    label_selector_from_manifest,
    local_queue_from_manifest,
    priority_class_from_manifest,
    resource_flavor_from_manifest,
    taint_from_manifest,
    toleration_from_manifest,
    topology_from_manifest,
)
from service.domain.quantity import canonical_amount, format_amount
from service.domain.workload import (
    Admission,
    AdmittedWorkload,
    PodSet,
    PodSetAssignment,
    RequeueState,
    TopologyRequest,
    Workload,
)
from service.engine import (
    AdmissionDecision,
    CycleResult,
    EngineConfig,
    Eviction,
    LocalQueueUsage,
    PendingReason,
    Preemption,
    Snapshot,
    admission_cycle,
)
from service.eventstore.port import EventMetadata, NewEvent, OutboxMessage
from service.ledger.chain import NewLedgerEntry
from service.projections.resources import UPSERT_SQL, resource_row, upsert_params

__all__ = [
    "ADMITTED",
    "HOLDS_QUOTA",
    "AdmissionCycle",
    "ConfigCache",
    "CycleReport",
    "Loaded",
    "Plan",
    "WorkloadCache",
    "WorkloadRow",
    "flavors_without_nodes",
    "fleet_snapshot",
    "load",
    "plan",
]

log = logging.getLogger(__name__)

ACTOR = "system:admission"
#: The outbox topic that has a member cluster reconciled (workers/reconcile.py).
RECONCILE_TOPIC = "reconcile.cluster"
PENDING, ADMITTED, EVICTED = "Pending", "Admitted", "Evicted"
KINDS = (
    "ClusterQueue",
    "Cohort",
    "LocalQueue",
    "ResourceFlavor",
    "Topology",
    "WorkloadPriorityClass",
    "Cluster",
    "Workload",
)
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

_STATES = [PENDING, *sorted(HOLDS_QUOTA)]
# Configuration (queues, flavors, Clusters with their inventories) in two
# steps as well: parsing 3 Clusters' node inventories each cycle cost more
# than the engine's whole cycle, and they change only with a heartbeat.
# A stamp is (version, uid): an object deleted and created again may come
# back at a version the cache holds (a long-lived cache, or a database
# emptied under it), but never with the same uid.
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
# Workloads in two steps: every live one's (uid, version) stamp, then whole
# rows only for those the cache has not seen at that version. A version
# changes with every event, so a stamp identifies a row's content; decoding
# each pending workload's JSON every second would cost more than the engine.
_STAMPS = text(
    "SELECT namespace, name, uid, resource_version FROM resources "
    "WHERE kind = 'Workload' AND NOT deleted "
    "AND coalesce(status->>'state', 'Pending') = ANY(:states)"
)
# Whole workload rows by (namespace, name), for WorkloadRow.packed: the four
# JSON columns as one document, one decode a row rather than four (each through
# psycopg's loader and the process's JSON reader: most of what reading a row
# cost). The admission cycle's cache and the workers' RowCache read with it.
WORKLOAD_ROWS = text(
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
        """From a row of ``WORKLOAD_ROWS``."""
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


@dataclass(frozen=True)
class Loaded:
    snapshot: Snapshot
    workloads: Mapping[str, WorkloadRow]


# --- read models → snapshot -----------------------------------------------------------------


def _quantities(values: Mapping[str, Any] | None) -> dict[str, int]:
    return {str(r): _amount(str(r), q) for r, q in (values or {}).items()}


@functools.lru_cache(maxsize=4096)
def _amount(resource: str, quantity: str | int | float) -> int:
    """Parsed once per distinct quantity: a fleet's nodes and gangs carry a
    few, and parsing each (with fractions) every cycle cost more than the
    engine."""
    return canonical_amount(resource, quantity)


def _timestamp(value: Any, default: float) -> float:
    if not value:
        return default
    return datetime.fromisoformat(str(value)).timestamp()


def workload_from_row(row: WorkloadRow) -> Workload:
    spec, status = row.spec, row.status
    pod_sets = []
    for raw in spec.get("podSets") or ():
        template = raw.get("template") or {}
        pod_spec = template.get("spec") or {}
        request = raw.get("topologyRequest") or {}
        topology = None
        if request.get("required"):
            topology = TopologyRequest("required", request["required"])
        elif request.get("preferred"):
            topology = TopologyRequest("preferred", request["preferred"])
        pod_sets.append(
            PodSet(
                name=str(raw.get("name", "main")),
                count=int(raw["count"]),
                requests=pod_requests(template, "", Problems()),
                topology_request=topology,
                tolerations=tuple(
                    toleration_from_manifest(t) for t in pod_spec.get("tolerations") or ()
                ),
                node_selector={
                    str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()
                },
            )
        )
    requeue = status.get("requeueState")
    created = row.created_at.timestamp()
    return Workload(
        namespace=row.namespace,
        name=row.name,
        queue_name=str(spec["queueName"]),
        pod_sets=tuple(pod_sets),
        creation_time=created,
        priority=spec.get("priority"),
        priority_class_name=spec.get("priorityClassName"),
        workload_class=spec.get("workloadClass", "training"),
        cluster_selector=label_selector_from_manifest(spec.get("clusterSelector")),
        active=bool(spec.get("active", True)),
        requeue_state=RequeueState(
            count=int(requeue.get("count", 0)),
            requeue_at=_timestamp(requeue.get("requeueAt"), 0.0) or None,
        )
        if requeue
        else None,
        queued_at=_timestamp(status.get("queuedAt"), created) if status.get("queuedAt") else None,
    )


def admission_from_status(raw: Mapping[str, Any]) -> Admission:
    return Admission(
        cluster_queue=str(raw["clusterQueue"]),
        cluster=str(raw["cluster"]),
        pod_set_assignments=tuple(
            PodSetAssignment(
                name=str(p["name"]),
                count=int(p["count"]),
                flavors=dict(p.get("flavors") or {}),
                resource_usage=_quantities(p.get("resourceUsage")),
                placement=tuple(
                    (str(n["node"]), int(n["count"])) for n in p.get("placement") or ()
                ),
                islands=tuple(p.get("islands") or ()),
            )
            for p in raw.get("podSetAssignments") or ()
        ),
    )


def admission_to_status(decision: AdmissionDecision, admitted_at: datetime) -> Obj:
    admission = decision.admission
    islands = {i for p in admission.pod_set_assignments for i in p.islands}
    borrowed: dict[str, dict[str, str]] = {}
    for (flavor, resource), amount in sorted(decision.borrowed.items()):
        borrowed.setdefault(flavor, {})[resource] = format_amount(resource, amount)
    return {
        "clusterQueue": admission.cluster_queue,
        "cluster": admission.cluster,
        "island": next(iter(islands)) if len(islands) == 1 else None,
        "podSetAssignments": [
            {
                "name": p.name,
                "count": p.count,
                "flavors": dict(p.flavors),
                "resourceUsage": {r: format_amount(r, a) for r, a in p.resource_usage.items()},
                "placement": [{"node": node, "count": pods} for node, pods in p.placement],
                "islands": list(p.islands),
            }
            for p in admission.pod_set_assignments
        ],
        "borrowed": borrowed,
        "preempted": list(decision.preempted),
        "admittedAt": _rfc3339(admitted_at),
    }


def _node(cluster: str, raw: Mapping[str, Any]) -> Node:
    return Node(
        name=str(raw["name"]),
        cluster=cluster,
        flavor=str(raw["flavor"]),
        island=str(raw.get("island") or f"{cluster}-{raw['flavor']}"),
        allocatable=_quantities(raw.get("allocatable")),
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
        taints=tuple(taint_from_manifest(t) for t in raw.get("taints") or ()),
        reserved=_quantities(raw.get("reserved")),
        ready=bool(raw.get("ready", True)),
        unschedulable=bool(raw.get("unschedulable", False)),
    )


def _manifest(row: Any) -> Obj:
    labels = dict(row.labels or {})
    if row.kind == "ClusterQueue":
        labels[WORKLOAD_CLASS_LABEL] = row.spec.get("workloadClass", "training")
    return {
        "metadata": {"name": row.name, "namespace": row.namespace or None, "labels": labels},
        "spec": row.spec,
    }


@dataclass(frozen=True)
class _Cached:
    row: WorkloadRow
    workload: Workload
    admitted: AdmittedWorkload | None


def _cached(row: WorkloadRow, workload: Workload | None = None) -> _Cached:
    """``workload``: the row's domain value, if the caller knows it."""
    workload = workload or workload_from_row(row)
    raw = row.status.get("admission")
    admitted = None
    if row.status.get("state", PENDING) in HOLDS_QUOTA and raw:
        admitted = AdmittedWorkload(
            workload=workload,
            admission=admission_from_status(raw),
            admitted_at=_timestamp(raw.get("admittedAt"), workload.creation_time),
            pods_ready=row.status.get("podsReady"),
        )
    return _Cached(row, workload, admitted)


class WorkloadCache:
    """Workload rows and their domain values by key, valid for one (uid,
    version): a pending workload is fetched and parsed once, not per cycle."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[tuple[str, int], _Cached]] = {}
        self._unreadable: set[tuple[str, tuple[str, int]]] = set()

    def refresh(self, conn: Any) -> list[_Cached]:
        stamps = {
            f"{ns}/{name}": (ns, name, (str(uid), int(version)))
            for ns, name, uid, version in conn.execute(_STAMPS, {"states": _STATES})
        }
        for key, stamp in list(self._unreadable):
            if key in stamps and stamps[key][2] == stamp:
                del stamps[key]  # logged once already, at this version
            else:
                self._unreadable.discard((key, stamp))
        missing = [
            (ns, name)
            for key, (ns, name, stamp) in stamps.items()
            if (hit := self._items.get(key)) is None or hit[0] != stamp
        ]
        if missing:
            params = {"namespaces": [m[0] for m in missing], "names": [m[1] for m in missing]}
            for r in conn.execute(WORKLOAD_ROWS, params):
                row = WorkloadRow.packed(r)
                try:
                    entry = _cached(row)
                except (ValueError, KeyError, TypeError):
                    # One unreadable workload must not stop the fleet's admission.
                    log.exception("workload %s cannot be read; left out of the cycle", row.key)
                    stamps.pop(row.key, None)
                    self._unreadable.add((row.key, (row.uid, row.version)))
                    continue
                self._items[row.key] = ((row.uid, row.version), entry)
        for key in [k for k in self._items if k not in stamps]:
            del self._items[key]
        return [self._items[key][1] for key in stamps]

    def written(self, appends: Sequence[tuple[str, int, str, Obj]]) -> None:
        """The rows a committed cycle wrote, at the versions it wrote them:
        the next refresh finds them here instead of fetching and decoding
        again what this process just encoded (every admitted gang's row,
        once a cycle). A row changed since by someone else has another
        version, and is fetched as before."""
        for _, version, _, data in appends:
            key = f"{data['namespace']}/{data['name']}"
            hit = self._items.get(key)
            if hit is None or hit[0] != (str(data["uid"]), version):
                continue
            before = hit[1]
            row = WorkloadRow(
                before.row.namespace,
                before.row.name,
                before.row.uid,
                version + 1,
                int(data["generation"]),
                data["labels"],
                data["annotations"],
                data["spec"],
                data["status"],
                before.row.created_at,
            )
            # The domain value reads the spec, the requeue state and the
            # queue time: unchanged by an admission or a pending reason.
            same = row.spec == before.row.spec and all(
                row.status.get(k) == before.row.status.get(k) for k in ("requeueState", "queuedAt")
            )
            try:
                entry = _cached(row, before.workload if same else None)
            except (ValueError, KeyError, TypeError):
                del self._items[key]  # the next refresh reads it (and says why it cannot)
                continue
            self._items[key] = ((row.uid, row.version), entry)


def _cluster(row: Any) -> tuple[Cluster, list[Node]]:
    status = row.status or {}
    cluster = Cluster(
        name=row.name,
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        healthy=status.get("state", "Ready") != "Lost",
        cordoned=bool(row.spec.get("cordoned", False)),
    )
    return cluster, [_node(row.name, n) for n in (status.get("inventory") or {}).get("nodes") or ()]


#: Each configuration kind's domain value, from its read-model row.
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "ClusterQueue": lambda r: cluster_queue_from_manifest(_manifest(r)),
    "ResourceFlavor": lambda r: resource_flavor_from_manifest(_manifest(r)),
    "Cohort": lambda r: cohort_from_manifest(_manifest(r)),
    "LocalQueue": lambda r: local_queue_from_manifest(_manifest(r)),
    "WorkloadPriorityClass": lambda r: priority_class_from_manifest({"name": r.name, **r.spec}),
    "Topology": lambda r: topology_from_manifest(_manifest(r)),
    "Cluster": _cluster,
}
_UNREADABLE = object()


class ConfigCache:
    """Configuration objects as domain values by (kind, namespace, name),
    valid for one resource version: each is fetched and parsed when it
    changes, not every cycle. One the domain refuses is left out of the
    cycle (and logged once per version) rather than stopping admission."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str, str], tuple[tuple[int, str], Any]] = {}

    def refresh(self, conn: Any) -> dict[str, list[Any]]:
        stamps = {
            (kind, ns, name): (int(version), str(uid))
            for kind, ns, name, version, uid in conn.execute(
                _CONFIG_STAMPS, {"kinds": list(_CONVERT)}
            )
        }
        missing = [
            k for k, v in stamps.items() if (hit := self._items.get(k)) is None or hit[0] != v
        ]
        if missing:
            params = {
                "kinds": [m[0] for m in missing],
                "namespaces": [m[1] for m in missing],
                "names": [m[2] for m in missing],
            }
            for row in conn.execute(_CONFIG_ROWS, params):
                try:
                    value = _CONVERT[row.kind](row)
                except (ValueError, KeyError, TypeError):
                    log.exception("%s %s cannot be read; left out of the cycle", row.kind, row.name)
                    value = _UNREADABLE
                self._items[(row.kind, row.namespace, row.name)] = (
                    (int(row.resource_version), str(row.uid)),
                    value,
                )
        for key in [k for k in self._items if k not in stamps]:
            del self._items[key]
        by_kind: dict[str, list[Any]] = {}
        for key in sorted(stamps):
            hit = self._items.get(key)
            if hit is not None and hit[1] is not _UNREADABLE:
                by_kind.setdefault(key[0], []).append(hit[1])
        return by_kind


def fleet_snapshot(conn: Any, configuration: ConfigCache) -> Snapshot:
    """The quota and the fleet as configured, nothing admitted, every member
    counted healthy and uncordoned: the empty fleet on which a gang is judged
    never to fit (``service.engine.feasibility``), so that no gang is refused
    because a member is down or cordoned for now."""
    by_kind = configuration.refresh(conn)
    clusters, nodes = [], []
    for cluster, its_nodes in by_kind.get("Cluster", ()):
        clusters.append(replace(cluster, healthy=True, cordoned=False))
        nodes += [replace(node, ready=True, unschedulable=False) for node in its_nodes]
    return Snapshot(
        cluster_queues=by_kind.get("ClusterQueue", []),
        resource_flavors=by_kind.get("ResourceFlavor", []),
        cohorts=by_kind.get("Cohort", []),
        local_queues=by_kind.get("LocalQueue", []),
        priority_classes=by_kind.get("WorkloadPriorityClass", []),
        topologies=by_kind.get("Topology", []),
        clusters=clusters,
        nodes=nodes,
    )


def flavors_without_nodes(snapshot: Snapshot, spec: Mapping[str, Any]) -> list[str]:
    """Warnings for a ClusterQueue ``spec`` whose quota names a flavor that no
    node of the fleet carries (or that is not defined): quota nobody can use."""
    flavors = {f.name: f for f in snapshot.resource_flavors}
    warnings = []
    for group in spec.get("resourceGroups") or ():
        for quota in group.get("flavors") or ():
            name = str(quota.get("name"))
            flavor = flavors.get(name)
            if flavor is None:
                warnings.append(f"flavor {name} is not defined: its quota cannot be used")
                continue
            labels = flavor.node_labels
            if not any(
                all(node.labels.get(k) == v for k, v in labels.items()) for node in snapshot.nodes
            ):
                shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "any labels"
                warnings.append(
                    f"no node of the fleet carries flavor {name}'s labels ({shown}): "
                    "its quota cannot be used"
                )
    return warnings


def load(
    engine: Engine,
    config: EngineConfig,
    usage: Mapping[str, LocalQueueUsage],
    cache: WorkloadCache | None = None,
    configuration: ConfigCache | None = None,
) -> Loaded:
    """One consistent snapshot (a REPEATABLE READ transaction) of everything
    the engine needs."""
    cache = cache or WorkloadCache()
    configuration = configuration or ConfigCache()
    options = {"isolation_level": "REPEATABLE READ"}
    with engine.connect().execution_options(**options) as conn, conn.begin():
        by_kind = configuration.refresh(conn)
        entries = cache.refresh(conn)
    clusters, nodes = [], []
    for cluster, its_nodes in by_kind.get("Cluster", ()):
        clusters.append(cluster)
        nodes += its_nodes
    pending: list[Workload] = []
    admitted: list[AdmittedWorkload] = []
    workloads: dict[str, WorkloadRow] = {}
    for entry in entries:
        workloads[entry.row.key] = entry.row
        if entry.admitted is not None:
            admitted.append(entry.admitted)
        elif entry.row.status.get("state", PENDING) == PENDING:
            pending.append(entry.workload)
    local_queues = by_kind.get("LocalQueue", [])
    namespaces = {lq.namespace for lq in local_queues} | {w.namespace for w in workloads.values()}
    snapshot = Snapshot(
        cluster_queues=by_kind.get("ClusterQueue", []),
        resource_flavors=by_kind.get("ResourceFlavor", []),
        cohorts=by_kind.get("Cohort", []),
        local_queues=local_queues,
        priority_classes=by_kind.get("WorkloadPriorityClass", []),
        topologies=by_kind.get("Topology", []),
        clusters=clusters,
        nodes=nodes,
        admitted=admitted,
        pending=pending,
        # Namespaces are not objects of ours: each carries the label
        # Kubernetes gives every namespace, for namespaceSelector.
        namespaces={ns: {NAMESPACE_NAME_LABEL: ns} for ns in sorted(namespaces)},
        local_queue_usage=usage,
        config=config,
    )
    return Loaded(snapshot, workloads)


# --- decisions → writes ---------------------------------------------------------------------


@dataclass
class Plan:
    """Everything one cycle writes: ``(stream, expected version, type, data)``
    appends with their read-model rows, and ledger entries."""

    appends: list[tuple[str, int, str, Obj]] = field(default_factory=list)
    ledger: list[NewLedgerEntry] = field(default_factory=list)
    admitted: int = 0
    preempted: int = 0
    evicted: int = 0
    pending_changed: int = 0
    #: ``(ClusterQueue, seconds queued)`` of each admission, for metrics.
    waits: list[tuple[str, float]] = field(default_factory=list)


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds_since(value: Any, now: datetime) -> float:
    """Seconds from an RFC 3339 time to ``now``; unreadable: forever."""
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return (now - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds()
    except (TypeError, ValueError):
        return float("inf")


def _reserved(admission: Admission) -> dict[str, dict[str, int]]:
    """``{flavor: {resource: amount}}`` that an engine admission reserves."""
    reserved: dict[str, dict[str, int]] = {}
    for ps in admission.pod_set_assignments:
        for resource, flavor in ps.flavors.items():
            bucket = reserved.setdefault(flavor, {})
            bucket[resource] = bucket.get(resource, 0) + ps.resource_usage.get(resource, 0)
    return reserved


def _stream(row: WorkloadRow) -> str:
    return stream_name("Workload", row.namespace, row.name)


def _write(plan: Plan, row: WorkloadRow, change: lifecycle.Transition) -> None:
    data = row.state(change.status.to_json(), change.spec)
    plan.appends.append((_stream(row), row.version, change.event, data))
    plan.ledger += change.entries


def _admit(plan: Plan, row: WorkloadRow, decision: AdmissionDecision, now: datetime) -> None:
    borrowed: dict[str, dict[str, int]] = {}
    for (flavor, resource), amount in decision.borrowed.items():
        borrowed.setdefault(flavor, {})[resource] = amount
    change = lifecycle.admit(
        lifecycle.Subject.of(row),
        lifecycle.Status(row.status),
        admission_to_status(decision, now),
        borrowed=borrowed,
        with_preemption=bool(decision.preempted),
        now=now,
    )
    _write(plan, row, change)
    plan.admitted += 1
    queued = _timestamp(row.status.get("queuedAt"), row.created_at.timestamp())
    plan.waits.append((decision.cluster_queue, max(0.0, now.timestamp() - queued)))


def _cohort_path(path: str) -> list[str]:
    """``/root/mid/cq`` → ``["mid", "root"]``: cohorts from the ClusterQueue up."""
    parts = [p for p in path.split("/") if p]
    return list(reversed(parts[:-1]))


def _preempt(plan: Plan, row: WorkloadRow, preemption: Preemption, now: datetime) -> None:
    change = lifecycle.preempt(
        lifecycle.Subject.of(row),
        lifecycle.Status(row.status),
        reason=preemption.reason,
        message=preemption.message,
        preemptor=preemption.preemptor,
        preemptor_cluster_queue=preemption.preemptor_cluster_queue,
        cohort_path=_cohort_path(preemption.victim_path),
        now=now,
    )
    _write(plan, row, change)
    plan.preempted += 1


def _evict(plan: Plan, row: WorkloadRow, eviction: Eviction, now: datetime) -> None:
    """Pods-ready timeout (requeued with backoff, or deactivated past its
    limit) or a stopped queue draining."""
    requeue_state = None
    if eviction.requeue_state is not None:
        at = eviction.requeue_state.requeue_at
        requeue_state = {
            "count": eviction.requeue_state.count,
            "requeueAt": datetime.fromtimestamp(at, UTC).isoformat() if at is not None else None,
        }
    change = lifecycle.evict(
        lifecycle.Subject.of(row),
        lifecycle.Status(row.status),
        reason=eviction.reason,
        message=eviction.message,
        now=now,
        spec=row.spec,
        requeue_state=requeue_state,
        deactivate=eviction.deactivated,
    )
    _write(plan, row, change)
    plan.evicted += 1


#: A pending workload whose reason holds but whose words changed (Kueue's
#: "8 more needed" follows every admission and completion around it) is
#: rewritten at most this often (seconds).
PENDING_MESSAGE_REFRESH = 30.0


def _words(row: WorkloadRow, reason: PendingReason) -> str:
    """The reason's message as the workload's readers may see it: a StrictFIFO
    blocker of another namespace is not named (its owner's names are theirs)."""
    behind = reason.waiting_behind
    if behind is None or behind.startswith(f"{row.namespace}/"):
        return reason.message
    return reason.message.replace(behind, "a workload of another namespace")


def _pend(plan: Plan, row: WorkloadRow, reason: PendingReason, now: datetime) -> None:
    status = row.status
    message = _words(row, reason)
    same = status.get("pendingReasonCode") == reason.reason and (
        not reason.cluster_queue or status.get("clusterQueue") == reason.cluster_queue
    )
    if same and status.get("pendingReason") == message:
        return  # unchanged: no write, so an idle cycle writes nothing
    if same and _seconds_since(status.get("pendingReasonAt"), now) < PENDING_MESSAGE_REFRESH:
        # The same reason in other numbers: under churn every cycle changed
        # every pending gang's words, and wrote each an event (40,492 in one
        # overloaded bench run); the numbers are refreshed now and then.
        return
    new = dict(status)
    new.update(
        pendingReason=message,
        pendingReasonCode=reason.reason,
        pendingReasonAt=_rfc3339(now),
        conditions=lifecycle.set_condition(
            status.get("conditions") or (),
            "QuotaReserved",
            "False",
            reason.reason,
            message,
            now,
        ),
    )
    if reason.cluster_queue:
        new["clusterQueue"] = reason.cluster_queue
    plan.appends.append((_stream(row), row.version, "WorkloadPending", row.state(new)))
    plan.pending_changed += 1


def plan(loaded: Loaded, result: CycleResult, now: datetime) -> Plan:
    """The writes that apply ``result``: pure. Victims and evictions first,
    then admissions, then changed pending reasons; at most one event per
    workload (the engine never both evicts and admits one in a cycle)."""
    out = Plan()
    rows = loaded.workloads
    touched: set[str] = set()
    for preemption in result.preemptions:
        _preempt(out, rows[preemption.workload], preemption, now)
        touched.add(preemption.workload)
    for eviction in result.evictions:
        if eviction.workload not in touched:
            _evict(out, rows[eviction.workload], eviction, now)
            touched.add(eviction.workload)
    for decision in result.admissions:
        _admit(out, rows[decision.workload], decision, now)
        touched.add(decision.workload)
    for key, reason in result.pending.items():
        row = rows.get(key)
        if row is not None and key not in touched and row.status.get("state", PENDING) == PENDING:
            _pend(out, row, reason, now)
    return out


# --- the cycle ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CycleReport:
    result: CycleResult
    plan: Plan
    pending: int
    admitted_before: int
    seconds: float
    #: ``(ClusterQueue, flavor, resource) -> amount`` held after this cycle.
    usage: Mapping[tuple[str, str, str], int]


def cluster_queue_usage(snapshot: Snapshot, result: CycleResult) -> dict[tuple[str, str, str], int]:
    """What each ClusterQueue holds once ``result`` is applied, per flavor
    and resource (Kueue's ``cluster_queue_resource_usage``)."""
    gone = {p.workload for p in result.preemptions} | {e.workload for e in result.evictions}
    admissions = [a.admission for a in snapshot.admitted if a.workload.key not in gone]
    admissions += [d.admission for d in result.admissions]
    usage: dict[tuple[str, str, str], int] = {}
    for admission in admissions:
        for flavor, amounts in _reserved(admission).items():
            for resource, amount in amounts.items():
                key = (admission.cluster_queue, flavor, resource)
                usage[key] = usage.get(key, 0) + amount
    return usage


def reconcile_clusters(writes: Plan) -> list[str]:
    """The member clusters whose jobs this cycle's decisions change: where
    gangs were admitted, and where victims and evicted gangs were running."""
    clusters = set()
    for _, _, _, data in writes.appends:
        status = data.get("status") or {}
        for part in ("admission", "eviction"):
            cluster = (status.get(part) or {}).get("cluster")
            if cluster and status.get("state") in (ADMITTED, EVICTED):
                clusters.add(str(cluster))
    return sorted(clusters)


Guard = Callable[[SqlUnitOfWork], None]
AfterPlan = Callable[[SqlUnitOfWork, CycleResult], None]


class AdmissionCycle:
    """Load, decide, write. ``guard`` runs first in the commit transaction
    (the leader's fencing check); ``before_commit`` adds the caller's own
    writes to that transaction (persisted fair-sharing history)."""

    def __init__(
        self,
        engine: Engine,
        unit_of_work: Callable[[], SqlUnitOfWork],
        config: EngineConfig | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._engine = engine
        self._uow = unit_of_work
        self.config = config or EngineConfig()
        self._clock = clock
        self._cache = WorkloadCache()
        self._configuration = ConfigCache()

    def run(
        self,
        guard: Guard,
        usage: Mapping[str, LocalQueueUsage] | None = None,
        before_commit: AfterPlan | None = None,
    ) -> CycleReport:
        started = time.perf_counter()
        loaded = load(self._engine, self.config, usage or {}, self._cache, self._configuration)
        now = self._clock()
        # The engine allocates much and frees nothing until it returns: pause the
        # collector, which would rescan the snapshot over and over (service.engine).
        collecting = gc.isenabled()
        gc.disable()
        try:
            result = admission_cycle(loaded.snapshot, now)
        finally:
            if collecting:
                gc.enable()
        writes = plan(loaded, result, now)
        self.commit(writes, guard, result, before_commit, now)
        self._cache.written(writes.appends)
        return CycleReport(
            result=result,
            plan=writes,
            pending=len(loaded.snapshot.pending),
            admitted_before=len(loaded.snapshot.admitted),
            seconds=time.perf_counter() - started,
            usage=cluster_queue_usage(loaded.snapshot, result),
        )

    def commit(
        self,
        writes: Plan,
        guard: Guard,
        result: CycleResult,
        before_commit: AfterPlan | None,
        now: datetime,
    ) -> None:
        """One transaction: the guard, every event with its read-model row,
        the ledger entries. A workload changed since the snapshot (cancelled,
        say) fails its expected version and the whole cycle rolls back."""
        meta = EventMetadata(actor=ACTOR, occurred_at=now)
        with self._uow() as uow:
            guard(uow)
            rows = []
            for stream, version, kind, data in writes.appends:
                uow.events.append(stream, version, [NewEvent(uuid4(), kind, data, meta)])
                rows.append(upsert_params(resource_row(data, version + 1, now)))
            uow.events.defer(UPSERT_SQL, rows)
            if writes.ledger:
                uow.record(writes.ledger)
            if touched := reconcile_clusters(writes):
                uow.publish(
                    [OutboxMessage(uuid4(), RECONCILE_TOPIC, {"cluster": c}) for c in touched]
                )
            if before_commit is not None:
                before_commit(uow, result)
            uow.commit()
