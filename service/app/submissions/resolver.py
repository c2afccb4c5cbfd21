"""What a submission names, resolved: its LocalQueue, ClusterQueue and
priority class, and the rules the ClusterQueue asks of it (workload class,
covered resources, security policy, refusal of what can never be admitted)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Row

from service.app.admission import WorkloadRow, workload_from_row
from service.app.errors import Invalid, PolicyRefused, UnknownReference
from service.app.references import exists
from service.app.schemas import SecurityPolicy, WorkloadClass, dump
from service.app.submissions.repository import named_by
from service.app.submissions.values import Fleet, Target, Unsatisfiable
from service.app.workloads import (
    TopologyRequest,
    WorkloadObject,
    WorkloadSpec,
    class_field,
    security_violations,
    total_requests,
    volcano_island,
)
from service.engine import Snapshot
from service.engine.feasibility import Verdict, never_fits_in


@dataclass(frozen=True)
class _QueueRules:
    """What a ClusterQueue asks of every submission, read from its spec once
    per unit of work rather than once per submission."""

    served: WorkloadClass
    covered: frozenset[str]
    policy: SecurityPolicy
    refuse_unsatisfiable: bool

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> _QueueRules:
        covered = {r for g in spec.get("resourceGroups", []) for r in g["coveredResources"]}
        return cls(
            served=spec.get("workloadClass", "training"),
            covered=frozenset(covered | {"pods"}),
            policy=SecurityPolicy.model_validate(spec.get("securityPolicy", {})),
            refuse_unsatisfiable=spec.get("unsatisfiable", "Hold") == "Refuse",
        )


class Resolver:
    """Resolves queues, ClusterQueues and priority classes once per request
    and namespace."""

    def __init__(self, conn: Connection, namespace: str, fleet: Fleet | None = None) -> None:
        self._conn = conn
        self._namespace = namespace
        self._fleet = fleet
        self._queues: dict[str, Row[Any] | None] = {}
        self._cqs: dict[str, Row[Any] | None] = {}
        self._classes: dict[str, Row[Any] | None] = {}
        self._rules: dict[str, _QueueRules] = {}
        self._islands: dict[str, set[str]] = {}

    def _one(
        self, cache: dict[str, Row[Any] | None], kind: str, ns: str, name: str
    ) -> Row[Any] | None:
        # No lock: every submission would otherwise take a share lock on the
        # same LocalQueue and ClusterQueue rows, and Postgres turns concurrent
        # share locks into MultiXacts, which serialise busy queues. A queue
        # deleted at the same moment leaves a workload the admission cycle
        # reports as waiting for its LocalQueue, as Kueue does.
        if name not in cache:
            cache[name] = exists(self._conn, kind, ns, [name], lock=False).get(name)
        return cache[name]

    def prefetch(self, workloads: Sequence[WorkloadObject]) -> dict[str, Row[Any]]:
        """One query for every LocalQueue, ClusterQueue and priority class the
        workloads name, and the workloads' own rows (tombstones included)."""
        queues = sorted({w.spec.queueName for w in workloads})
        classes = sorted({w.spec.priorityClassName for w in workloads if w.spec.priorityClassName})
        names = sorted({w.metadata.name for w in workloads})
        found: dict[str, dict[str, Row[Any]]] = {}
        for row in named_by(self._conn, self._namespace, queues, classes, names):
            found.setdefault(row.kind, {})[row.name] = row
        for name in queues:
            self._queues[name] = found.get("LocalQueue", {}).get(name)
        for name, row in found.get("ClusterQueue", {}).items():
            self._cqs[name] = row
        for name in classes:
            self._classes[name] = found.get("WorkloadPriorityClass", {}).get(name)
        return found.get("Workload", {})

    def resolve(self, workload: WorkloadObject) -> Target:
        spec = workload.spec
        queue = self._one(self._queues, "LocalQueue", self._namespace, spec.queueName)
        if queue is None:
            raise UnknownReference(
                f"LocalQueue {spec.queueName} not found in namespace {self._namespace}",
                [("spec.queueName", f"LocalQueue {spec.queueName} not found")],
            )
        cq_name = queue.spec["clusterQueue"]
        cq = self._one(self._cqs, "ClusterQueue", "", cq_name)
        if cq is None:
            raise UnknownReference(
                f"LocalQueue {spec.queueName} points to ClusterQueue {cq_name}, "
                "which does not exist",
                [("spec.queueName", f"ClusterQueue {cq_name} not found")],
            )
        priority = 0
        if spec.priorityClassName:
            wpc = self._one(self._classes, "WorkloadPriorityClass", "", spec.priorityClassName)
            if wpc is None:
                raise UnknownReference(
                    f"WorkloadPriorityClass {spec.priorityClassName} not found",
                    [("spec.priorityClassName", f"{spec.priorityClassName} not found")],
                )
            priority = int(wpc.spec["value"])
        rules = self._rules.get(cq_name)
        if rules is None:
            rules = self._rules[cq_name] = _QueueRules.of(cq.spec)
        if (mode := volcano_island(spec.job)) is not None:
            self._one_island(spec, mode, cq_name, cq.spec)
        if spec.workloadClass != rules.served:
            where = class_field(spec)
            if where is None:  # not chosen: the queue's
                spec.workloadClass = rules.served
            else:
                raise Invalid(
                    f"ClusterQueue {cq_name} serves {rules.served} workloads, "
                    f"not {spec.workloadClass}",
                    [(where, f"must be {rules.served} for queue {spec.queueName}")],
                )
        requests = total_requests(spec)
        missing = sorted(set(requests) - rules.covered)
        if missing:
            raise Invalid(
                f"ClusterQueue {cq_name} has no quota for {', '.join(missing)}",
                [
                    ("spec.podSets", f"resource {r} is not covered by ClusterQueue {cq_name}")
                    for r in missing
                ],
            )
        violations = security_violations(spec, rules.policy)
        if violations:
            raise PolicyRefused(
                f"the workload breaks {len(violations)} rule(s) of "
                f"ClusterQueue {cq_name}'s security policy",
                violations,
            )
        if rules.refuse_unsatisfiable and self._fleet is not None:
            found = verdict_of(self._fleet(), self._namespace, workload, cq_name)
            if found is not None:
                raise Unsatisfiable(
                    f"ClusterQueue {cq_name} refuses a workload that can never be "
                    f"admitted: {found.message}",
                    [("spec.podSets", found.message)],
                )
        return Target(cq_name, priority, requests)

    def _island_levels(self, cq_name: str, cq_spec: Mapping[str, Any]) -> set[str]:
        """The island levels (each topology's first) of the ClusterQueue's flavors."""
        if cq_name not in self._islands:
            flavors = [f["name"] for g in cq_spec.get("resourceGroups", []) for f in g["flavors"]]
            rows = exists(self._conn, "ResourceFlavor", "", flavors, lock=False).values()
            names = [str(r.spec["topologyName"]) for r in rows if r.spec.get("topologyName")]
            topologies = exists(self._conn, "Topology", "", names, lock=False).values()
            self._islands[cq_name] = {str(t.spec["levels"][0]["nodeLabel"]) for t in topologies}
        return self._islands[cq_name]

    def _one_island(
        self, spec: WorkloadSpec, mode: str, cq_name: str, cq_spec: Mapping[str, Any]
    ) -> None:
        """A Volcano Job's ``networkTopology`` at tier 1: its whole gang in one
        island, the level its ClusterQueue's flavors name as their island
        (refused when they name none or several; a soft one is then dropped);
        pod sets that ask for a topology themselves keep theirs."""
        levels = self._island_levels(cq_name, cq_spec)
        if len(levels) != 1 and mode == "preferred":
            return  # best effort: nothing to prefer
        if len(levels) != 1:
            found = ", ".join(sorted(levels)) or "none"
            raise Invalid(
                f"ClusterQueue {cq_name}'s flavors name {len(levels)} island levels ({found}): "
                "a Volcano Job's tier-1 network topology needs exactly one",
                [(JOB_TOPOLOGY, f"no single island level in ClusterQueue {cq_name} ({found})")],
            )
        (level,) = levels
        for pod_set in spec.podSets:
            if pod_set.topologyRequest is None:
                pod_set.topologyRequest = TopologyRequest.model_validate(
                    {mode: level, "podSetGroupName": "gang"}
                    if mode == "required"
                    else {mode: level}
                )


#: Where a stored Volcano Job says which tier its gang keeps to.
JOB_TOPOLOGY = "spec.job.spec.networkTopology"


def verdict_of(
    fleet: Snapshot, namespace: str, workload: WorkloadObject | Mapping[str, Any], cq: str
) -> Verdict | None:
    """Whether the workload (its model, or its stored spec) can never be admitted to ``cq``."""
    if isinstance(workload, WorkloadObject):
        name, spec = workload.metadata.name, dump(workload.spec)
    else:
        name, spec = str(workload["metadata"]["name"]), dict(workload["spec"])
    row = WorkloadRow(namespace, name, "", 0, 1, {}, {}, spec, {}, datetime.now(UTC))
    try:
        domain = workload_from_row(row)
    except (ValueError, KeyError, TypeError):  # stored by an older version of the service
        return None
    return never_fits_in(fleet, domain, cq)
