"""Invariants 1 to 4 of DESIGN.md, checked from outside while a fleet runs.

:class:`QuotaWatch` samples the central read models (one statement, so one
snapshot) as often as it can and checks at each sample, independently of the
engine's own arithmetic:

* per ClusterQueue, flavor and resource: usage ≤ nominal + borrowingLimit;
* per cohort: what the queues use beyond their guaranteed part (nominal -
  lendingLimit) fits in what they lend (lendingLimit, else nominal) — Kueue's
  quota tree for a flat cohort;
* per node: the pods placed there fit its allocatable less what others reserve;
* a pod set that asked for an island is placed in one island, its nodes in it.

And :func:`ledger_matches_events`: every admission, preemption and completion
event has its ledger entry, with reason and preemptor for a preemption.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from service.domain.quantity import canonical_amount, canonical_resources

HOLDING = ("Admitted", "Running", "Cancelling")


@dataclass(frozen=True)
class Quota:
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def guaranteed(self) -> int:
        return self.nominal - self.lending_limit if self.lending_limit is not None else 0

    @property
    def lendable(self) -> int:
        return self.lending_limit if self.lending_limit is not None else self.nominal


@dataclass
class Queues:
    """ClusterQueues' quotas ``{cq: {(flavor, resource): Quota}}`` and cohorts."""

    quotas: dict[str, dict[tuple[str, str], Quota]] = field(default_factory=dict)
    cohort: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def of(cls, manifests: Iterable[Mapping[str, Any]]) -> Queues:
        queues = cls()
        for obj in manifests:
            if obj.get("kind") != "ClusterQueue":
                continue
            name, spec = obj["metadata"]["name"], obj["spec"]
            queues.cohort[name] = spec.get("cohortName")
            table = queues.quotas.setdefault(name, {})
            for group in spec.get("resourceGroups") or ():
                for flavor in group["flavors"]:
                    for r in flavor["resources"]:
                        resource = r["name"]

                        def amount(key: str, r: Mapping[str, Any] = r, res: str = resource) -> Any:
                            value = r.get(key)
                            return None if value is None else canonical_amount(res, value)

                        table[(flavor["name"], resource)] = Quota(
                            amount("nominalQuota"), amount("borrowingLimit"), amount("lendingLimit")
                        )
        return queues


_HOLDING = sa.text(
    "SELECT namespace, name, status FROM resources WHERE kind = 'Workload' AND NOT deleted "
    "AND status->>'state' = ANY(:states)"
)
_INVENTORY = sa.text(
    "SELECT name, status FROM resources WHERE kind = 'Cluster' AND namespace = '' AND NOT deleted"
)


def _usage(admission: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    used: Counter[tuple[str, str]] = Counter()
    for ps in admission.get("podSetAssignments") or ():
        for resource, amount in canonical_resources(ps.get("resourceUsage") or {}).items():
            used[(ps["flavors"][resource], resource)] += amount
    return dict(used)


def check(
    queues: Queues,
    workloads: Iterable[tuple[str, str, Mapping[str, Any]]],
    clusters: Mapping[str, Mapping[str, Any]],
    island_required: Mapping[str, bool],
) -> list[str]:
    """Everything wrong with one snapshot: ``workloads`` holding quota as
    (namespace, name, status), ``clusters`` their status by name,
    ``island_required`` per workload key."""
    problems: list[str] = []
    used: dict[str, Counter[tuple[str, str]]] = {}
    placed: Counter[tuple[str, str, str]] = Counter()  # cluster, node, resource
    nodes: dict[tuple[str, str], Mapping[str, Any]] = {
        (cluster, n["name"]): n
        for cluster, status in clusters.items()
        for n in (status.get("inventory") or {}).get("nodes") or ()
    }
    for namespace, name, status in workloads:
        key = f"{namespace}/{name}"
        admission = status.get("admission") or {}
        if not admission:
            problems.append(f"{key} holds quota without an admission")
            continue
        counter = used.setdefault(str(admission["clusterQueue"]), Counter())
        counter.update(_usage(admission))
        cluster = str(admission["cluster"])
        for ps in admission.get("podSetAssignments") or ():
            count = int(ps["count"])
            per_pod = {
                r: a // count for r, a in canonical_resources(ps.get("resourceUsage") or {}).items()
            }
            islands = set()
            for spot in ps.get("placement") or ():
                node = nodes.get((cluster, spot["node"]))
                if node is None:
                    problems.append(f"{key} placed on unknown node {cluster}/{spot['node']}")
                    continue
                islands.add(node.get("island"))
                for resource, amount in per_pod.items():
                    placed[(cluster, spot["node"], resource)] += amount * int(spot["count"])
            if island_required.get(key) and len(islands) != 1:
                problems.append(
                    f"{key} pod set {ps['name']} straddles islands {sorted(map(str, islands))}"
                )
    for (cluster, node_name, resource), amount in placed.items():
        node = nodes[(cluster, node_name)]
        capacity = canonical_resources(node.get("allocatable") or {}).get(resource, 0)
        capacity -= canonical_resources(node.get("reserved") or {}).get(resource, 0)
        if amount > capacity:
            problems.append(f"{cluster}/{node_name}: {amount} {resource} placed, {capacity} free")
    problems += _quota_problems(queues, used)
    return problems


def _quota_problems(queues: Queues, used: Mapping[str, Counter[tuple[str, str]]]) -> list[str]:
    problems = []
    beyond: Counter[tuple[str | None, str, str]] = Counter()
    lendable: Counter[tuple[str | None, str, str]] = Counter()
    for cq, table in queues.quotas.items():
        cohort = queues.cohort.get(cq)
        for fr, quota in table.items():
            amount = used.get(cq, Counter())[fr]
            limit = quota.nominal + (
                quota.borrowing_limit if quota.borrowing_limit is not None else 10**30
            )
            if cohort is None:
                limit = quota.nominal
            if amount > limit:
                problems.append(f"{cq} uses {amount} {fr}, its limit is {limit}")
            beyond[(cohort, *fr)] += max(0, amount - quota.guaranteed)
            lendable[(cohort, *fr)] += quota.lendable
    for cq, counter in used.items():
        for fr in counter:
            if fr not in queues.quotas.get(cq, {}):
                problems.append(f"{cq} uses {counter[fr]} {fr} without quota for it")
    for key, amount in beyond.items():
        if key[0] is not None and amount > lendable[key]:
            problems.append(
                f"cohort {key[0]}: {amount} {key[1:]} used beyond guarantees, "
                f"{lendable[key]} lendable"
            )
    return problems


class QuotaWatch:
    """Samples the read models in a thread until closed; ``violations``
    holds what any sample found wrong (with the sample's number)."""

    def __init__(
        self, engine: sa.Engine, queues: Queues, island_required: Mapping[str, bool] | None = None
    ) -> None:
        self.engine = engine
        self.queues = queues
        self.island_required = dict(island_required or {})
        self.samples = 0
        self.peak: dict[str, int] = {}
        self.violations: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="quota-watch")

    def require_island(self, key: str) -> None:
        self.island_required[key] = True

    def __enter__(self) -> QuotaWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except sa.exc.SQLAlchemyError as error:  # the database restarting: next sample
                self.errors.append(type(error).__name__)
                self._stop.wait(0.5)
            self._stop.wait(0.02)

    def sample(self) -> None:
        options = {"isolation_level": "REPEATABLE READ"}
        with self.engine.connect().execution_options(**options) as conn, conn.begin():
            holding = conn.execute(_HOLDING, {"states": list(HOLDING)}).all()
            clusters = {r.name: r.status or {} for r in conn.execute(_INVENTORY)}
        self.samples += 1
        gpus: Counter[str] = Counter()
        for _, _, status in holding:
            admission = status.get("admission") or {}
            gpus[str(admission.get("clusterQueue"))] += sum(
                a for (_, r), a in _usage(admission).items() if r == "nvidia.com/gpu"
            )
        for cq, total in gpus.items():
            self.peak[cq] = max(self.peak.get(cq, 0), total)
        problems = check(self.queues, holding, clusters, self.island_required)
        self.violations += [f"sample {self.samples}: {p}" for p in problems]


# --- the ledger --------------------------------------------------------------------------------

_EVENTS = sa.text(
    "SELECT data->>'namespace' AS namespace, data->>'name' AS name, type FROM events "
    "WHERE type = ANY(:types) OR (type = 'WorkloadCancelled' "
    "AND data->'status'->>'state' = 'Cancelled' AND data->'status' ? 'finishedAt')"
)
_ENTRIES = sa.text("SELECT kind, body FROM ledger_entries WHERE kind = ANY(:kinds)")
#: Which ledger entry each decision event carries.
ENTRY_OF = {
    "WorkloadAdmitted": "workload.admitted",
    "WorkloadPreempted": "workload.preempted",
    "WorkloadFinished": "workload.finished",
    # Cancelling → Cancelled (a gang that held capacity): a "cancelled" finish.
    "WorkloadCancelled": "workload.finished",
}


def ledger_matches_events(engine: sa.Engine) -> tuple[list[str], Counter[str]]:
    """Problems (an event without its entry or the other way round, a
    preemption without reason or preemptor) and the count of each kind."""
    with engine.connect() as conn:
        events = Counter(
            (ENTRY_OF[r.type], f"{r.namespace}/{r.name}")
            for r in conn.execute(
                _EVENTS, {"types": [t for t in ENTRY_OF if t != "WorkloadCancelled"]}
            )
        )
        rows = conn.execute(_ENTRIES, {"kinds": sorted(set(ENTRY_OF.values()))}).all()
    entries = Counter((kind, f"{body['namespace']}/{body['workload']}") for kind, body in rows)
    problems = [
        f"{key}: {events[key]} events, {entries[key]} ledger entries"
        for key in sorted(set(events) | set(entries))
        if events[key] != entries[key]
    ]
    for kind, body in rows:
        if kind == "workload.preempted" and not (body.get("reason") and body.get("preemptor")):
            problems.append(f"preemption without reason or preemptor: {body}")
    return problems, Counter(kind for kind, _ in rows)
