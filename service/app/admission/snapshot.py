"""Read models to the engine's snapshot: the cycle's, read in one REPEATABLE
READ transaction, and the fleet as configured that the submit path judges
never-fitting gangs on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine

from service.app.admission.caches import ConfigCache, WorkloadCache
from service.app.admission.repository import WorkloadRow, budgeted_preemptions
from service.app.lifecycle import PENDING
from service.domain.jobs import MEMBER_JOB_KINDS, kind_not_runnable
from service.domain.workload import AdmittedWorkload, Workload
from service.engine import (
    EngineConfig,
    LocalQueueUsage,
    PendingReason,
    PreemptionBudgetState,
    Snapshot,
)
from service.engine.protection import budgets_from_history

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Loaded:
    snapshot: Snapshot
    workloads: Mapping[str, WorkloadRow]
    held: Mapping[str, PendingReason] = field(default_factory=dict)
    """Pending workloads left out of the snapshot, with why: a job of a kind
    the workers cannot apply to a member yet is never admitted."""


#: Kueue has no such reason: its integrations run what they admit.
NOT_RUNNABLE = "KindNotRunnable"


def _held(row: WorkloadRow, kind: str) -> PendingReason:
    runnable = ", ".join(MEMBER_JOB_KINDS)
    return PendingReason(
        workload=row.key,
        reason=NOT_RUNNABLE,
        message=(
            f"A {kind} is accepted but cannot run on member clusters yet "
            f"(the workers apply {runnable}); it waits and holds no quota"
        ),
        cluster_queue=row.status.get("clusterQueue"),
    )


def load(
    engine: Engine,
    config: EngineConfig,
    usage: Mapping[str, LocalQueueUsage],
    cache: WorkloadCache | None = None,
    configuration: ConfigCache | None = None,
    budgets: Mapping[str, PreemptionBudgetState] | None = None,
) -> Loaded:
    """One consistent snapshot (a REPEATABLE READ transaction) of everything
    the engine needs. ``budgets`` ``None``: the preemption budgets are derived
    from the ledger's budgeted preemptions (``service.engine.protection``)."""
    cache = cache or WorkloadCache()
    configuration = configuration or ConfigCache()
    options = {"isolation_level": "REPEATABLE READ"}
    with engine.connect().execution_options(**options) as conn, conn.begin():
        by_kind = configuration.refresh(conn)
        entries = cache.refresh(conn)
        if budgets is None:
            budgets = budgets_from_history(
                by_kind.get("ClusterQueue", []), budgeted_preemptions(conn)
            )
    clusters, nodes = [], []
    for cluster, its_nodes in by_kind.get("Cluster", ()):
        clusters.append(cluster)
        nodes += its_nodes
    pending: list[Workload] = []
    admitted: list[AdmittedWorkload] = []
    workloads: dict[str, WorkloadRow] = {}
    held: dict[str, PendingReason] = {}
    for entry in entries:
        workloads[entry.row.key] = entry.row
        if entry.units is not None:
            # A serving workload: its units, the admitted and the missing ones.
            admitted += entry.units.admitted
            pending += entry.units.pending
        elif entry.admitted is not None:
            admitted.append(entry.admitted)
        elif entry.row.status.get("state", PENDING) == PENDING:
            kind = kind_not_runnable(entry.row.spec)
            if kind is None:
                pending.append(entry.workload)
            else:
                held[entry.row.key] = _held(entry.row, kind)
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
        preemption_budgets=budgets,
    )
    return Loaded(snapshot, workloads, held)


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
