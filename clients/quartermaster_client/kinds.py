"""The kinds the API serves: their plurals, scope and short names."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    namespaced: bool
    model: type[Resource]
    short: tuple[str, ...] = ()

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """``/v1/...`` for this kind; a namespaced kind without a namespace
        is the all-namespaces list."""
        base = (
            f"/v1/namespaces/{namespace}/{self.plural}"
            if self.namespaced and namespace
            else f"/v1/{self.plural}"
        )
        return f"{base}/{name}" if name else base


KINDS: tuple[Kind, ...] = (
    Kind("ResourceFlavor", "resourceflavors", False, ResourceFlavor, ("rf", "flavor", "flavors")),
    Kind("Topology", "topologies", False, Topology, ("topo",)),
    Kind("Cohort", "cohorts", False, Cohort, ()),
    Kind("ClusterQueue", "clusterqueues", False, ClusterQueue, ("cq", "cqs")),
    Kind("LocalQueue", "localqueues", True, LocalQueue, ("lq", "lqs", "queue", "queues")),
    Kind(
        "WorkloadPriorityClass",
        "workloadpriorityclasses",
        False,
        WorkloadPriorityClass,
        ("wpc", "priorityclass", "priorityclasses", "pc"),
    ),
    Kind("Cluster", "clusters", False, Cluster, ()),
    Kind("Workload", "workloads", True, Workload, ("wl", "wls")),
)
BY_KIND = {k.kind: k for k in KINDS}
_NAMES: dict[str, Kind] = {}
for _kind in KINDS:
    for _name in (_kind.kind.lower(), _kind.plural, *_kind.short):
        _NAMES[_name] = _kind

#: Kinds a platform admin applies; workloads are submitted instead.
ADMIN_KINDS = tuple(k for k in KINDS if k.kind != "Workload")
#: Order in which ``apply`` creates objects, so that references resolve.
APPLY_ORDER = (
    "Topology",
    "ResourceFlavor",
    "Cohort",
    "ClusterQueue",
    "LocalQueue",
    "WorkloadPriorityClass",
    "Cluster",
    "Workload",
)


def lookup(name: str) -> Kind:
    """A kind by any of its names: ``ClusterQueue``, ``clusterqueues``, ``cq``.

    Raises KeyError with the known names when there is no such kind."""
    found = _NAMES.get(name.lower()) or _NAMES.get(name.lower().split(".", 1)[0])
    if found is None:
        raise KeyError(
            f"unknown kind {name!r}; known: {', '.join(k.plural for k in KINDS)} "
            f"(short: {', '.join(s for k in KINDS for s in k.short[:1])})"
        )
    return found


def resolve(kind: str | Kind | type[Resource]) -> Kind:
    if isinstance(kind, Kind):
        return kind
    if isinstance(kind, type):
        return BY_KIND[kind.KIND]
    return lookup(kind)


__all__ = ["ADMIN_KINDS", "APPLY_ORDER", "BY_KIND", "KINDS", "Kind", "lookup", "resolve"]
