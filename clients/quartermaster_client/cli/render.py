"""Output: kubectl-style plain tables, JSON and YAML."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from quartermaster_client.errors import QuartermasterError
from quartermaster_client.explain import QueueUsage, queue_usage, workload_gpus
from quartermaster_client.kinds import Kind
from quartermaster_client.models import (
    Cluster,
    ClusterQueue,
    Cohort,
    LocalQueue,
    Resource,
    ResourceFlavor,
    Topology,
    Workload,
    WorkloadPriorityClass,
)

Row = list[str]
OUTPUTS = ("table", "wide", "json", "yaml", "name")


def age(timestamp: str | None, now: datetime | None = None) -> str:
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    ]
    return "\n".join(lines)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)


def to_yaml(data: Any) -> str:
    if isinstance(data, list):
        return yaml.safe_dump_all(data, sort_keys=False).rstrip()
    return yaml.safe_dump(data, sort_keys=False).rstrip()


def as_list(kind: Kind, items: Sequence[Resource]) -> dict[str, Any]:
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": f"{kind.kind}List",
        "items": [i.to_dict() for i in items],
    }


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


# -- columns per kind --------------------------------------------------------------------


#: How many clusters or islands a row names before it counts the rest.
LISTED = 2


def _listed(values: Iterable[str], wide: bool) -> str:
    """Distinct ``values`` joined; past :data:`LISTED` of them the rest counted
    (``a,b,+4``), as kubectl shortens an Endpoints' addresses, unless ``wide``."""
    distinct = list(dict.fromkeys(values))
    if wide or len(distinct) <= LISTED:
        return ",".join(distinct) or "-"
    return ",".join([*distinct[:LISTED], f"+{len(distinct) - LISTED}"])


def _workload(w: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(w, Workload)
    admissions = w.status.admissions  # a serving workload's: one per replica
    row = [
        w.name,
        w.spec.queue_name,
        w.status.state,
        _listed((a.cluster for a in admissions if a.cluster), wide),
        _listed((i for a in admissions for i in a.islands), wide),
        str(workload_gpus(w)),
        age(w.metadata.creation_timestamp),
    ]
    extra: Row = []
    if wide:
        latest = w.status.conditions[-1] if w.status.conditions else None
        extra = [
            w.status.cluster_queue or "-",
            str(w.spec.priority or 0),
            ",".join(dict.fromkeys(f for a in admissions for f in a.flavors)) or "-",
            (latest.reason or "-") if latest else "-",
        ]
    return row, extra


def _cluster_queue(cq: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(cq, ClusterQueue)
    usage = context.usage(cq)
    row = [
        cq.name,
        cq.spec.cohort_name or "-",
        str(usage.pending) if usage else "-",
        str(usage.admitted) if usage else "-",
        f"{usage.used}/{usage.nominal}" if usage else "-",
        str(usage.borrowed) if usage else "-",
        age(cq.metadata.creation_timestamp),
    ]
    extra = (
        [
            cq.spec.workload_class or "-",
            cq.spec.queueing_strategy or "-",
            cq.spec.stop_policy or "-",
            ",".join(f for g in cq.spec.resource_groups for f in (x.name for x in g.flavors))
            or "-",
        ]
        if wide
        else []
    )
    return row, extra


def _local_queue(lq: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(lq, LocalQueue)
    row = [lq.name, lq.spec.cluster_queue, age(lq.metadata.creation_timestamp)]
    return row, [lq.spec.stop_policy or "None"] if wide else []


def _flavor(f: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(f, ResourceFlavor)
    taints = ",".join(f"{t.get('key')}:{t.get('effect')}" for t in f.spec.node_taints) or "-"
    row = [
        f.name,
        _labels(f.spec.node_labels),
        taints,
        f.spec.topology_name or "-",
        age(f.metadata.creation_timestamp),
    ]
    return row, []


def _topology(t: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(t, Topology)
    levels = " > ".join(level.node_label for level in t.spec.levels)
    return [t.name, levels, age(t.metadata.creation_timestamp)], []


def _cohort(c: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(c, Cohort)
    return [c.name, c.spec.parent_name or "-", age(c.metadata.creation_timestamp)], []


def _priority_class(p: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(p, WorkloadPriorityClass)
    return [p.name, str(p.value), p.description or "", age(p.metadata.creation_timestamp)], []


def _cluster(c: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    assert isinstance(c, Cluster)
    status = c.status
    health = status.get("health") or status.get("state") or "-"
    if isinstance(health, dict):
        health = health.get("state") or health.get("status") or "-"
    row = [
        c.name,
        c.spec.server or "-",
        c.backend or "-",
        "yes" if c.spec.cordoned else "no",
        str(health),
        age(c.metadata.creation_timestamp),
    ]
    return row, [_labels(c.metadata.labels)] if wide else []


def _runtime(r: Resource, wide: bool, context: Context) -> tuple[Row, Row]:
    """A training runtime: its replicated jobs and the ML policy's node count."""
    spec = getattr(r, "spec", {}) or {}
    jobs = ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    nodes = (spec.get("mlPolicy") or {}).get("numNodes")
    names = ",".join(str(j.get("name")) for j in jobs) or "-"
    return [
        r.name,
        names,
        str(nodes) if nodes is not None else "-",
        age(r.metadata.creation_timestamp),
    ], []


Columns = Callable[[Resource, bool, "Context"], tuple[Row, Row]]
COLUMNS: dict[str, tuple[list[str], list[str], Columns]] = {
    "Workload": (
        ["NAME", "QUEUE", "STATE", "CLUSTER", "ISLAND", "GPUS", "AGE"],
        ["CLUSTERQUEUE", "PRIORITY", "FLAVOR", "REASON"],
        _workload,
    ),
    "ClusterQueue": (
        ["NAME", "COHORT", "PENDING", "ADMITTED", "GPU(USED/NOMINAL)", "BORROWED", "AGE"],
        ["CLASS", "STRATEGY", "STOP", "FLAVORS"],
        _cluster_queue,
    ),
    "LocalQueue": (["NAME", "CLUSTERQUEUE", "AGE"], ["STOP"], _local_queue),
    "ResourceFlavor": (["NAME", "NODE-LABELS", "TAINTS", "TOPOLOGY", "AGE"], [], _flavor),
    "Topology": (["NAME", "LEVELS", "AGE"], [], _topology),
    "Cohort": (["NAME", "PARENT", "AGE"], [], _cohort),
    "WorkloadPriorityClass": (["NAME", "VALUE", "DESCRIPTION", "AGE"], [], _priority_class),
    "Cluster": (
        ["NAME", "SERVER", "BACKEND", "CORDONED", "HEALTH", "AGE"],
        ["LABELS"],
        _cluster,
    ),
    "TrainingRuntime": (["NAME", "REPLICATED-JOBS", "NODES", "AGE"], [], _runtime),
    "ClusterTrainingRuntime": (["NAME", "REPLICATED-JOBS", "NODES", "AGE"], [], _runtime),
}


class Context:
    """What some columns need beyond the object: the workloads, to count a
    ClusterQueue's pending and admitted gangs and its GPUs in use."""

    def __init__(self, workloads: Callable[[], list[Workload]] | None = None) -> None:
        self._load = workloads
        self._workloads: list[Workload] | None = None

    def usage(self, cq: ClusterQueue) -> QueueUsage | None:
        if self._workloads is None and self._load is not None:
            try:
                self._workloads = self._load()
            except QuartermasterError:  # a role that may not list every workload
                self._load = None
        if self._workloads is None:
            if cq.status.pending_workloads is None:
                return None
            return queue_usage(cq, [])
        return queue_usage(cq, self._workloads)


def render_table(
    kind: Kind, items: Sequence[Resource], wide: bool, namespaces: bool, context: Context
) -> str:
    header, wide_header, columns = COLUMNS[kind.kind]
    rows = []
    for item in items:
        row, extra = columns(item, wide, context)
        prefix = [item.metadata.namespace or ""] if namespaces else []
        rows.append([*prefix, *row, *(extra if wide else [])])
    full = (["NAMESPACE"] if namespaces else []) + header + (wide_header if wide else [])
    return table(full, rows)


__all__ = ["OUTPUTS", "Context", "age", "as_list", "render_table", "table", "to_json", "to_yaml"]
