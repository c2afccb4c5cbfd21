"""The fleet file: member clusters, their GPU nodes by flavor and fabric island, and queues.

A fleet file is YAML with Kueue-shaped (``v1beta2``) sections, each a list whose entries
are either full objects (``metadata``/``spec``) or flattened (``name`` + spec fields):
``topologies`` (``name``, ``levels``: node-label keys widest first, each a string or
``{nodeLabel: …}``; the first level is the fabric island, e.g.
``example.com/fabric-block`` > ``kubernetes.io/hostname``), ``resourceFlavors``
(``name``, ``nodeLabels``, ``nodeTaints``, ``tolerations``, ``topologyName``),
``clusters`` (``name``, ``labels``, optional ``healthy`` / ``cordoned``, optional
``backend``: ``kueue`` (the default) or ``volcano``, which admission objects the
member's stand-in serves and runs, and ``nodeGroups``: ``flavor``, ``islands``: N,
``nodesPerIsland``: M, ``allocatable`` per node such as ``{cpu: 96, memory: 1Ti,
nvidia.com/gpu: 8}``, optional extra ``labels`` and ``taints``, and ``racksPerIsland``
to fill levels between the island and the hostname), and the optional ``cohorts``,
``clusterQueues``, ``localQueues`` (with ``namespace``), ``workloadPriorityClasses``
(``name``, ``value``) and ``namespaces`` (``name``, ``labels``, for
``namespaceSelector``). Quantities are Kubernetes quantities (``"500m"``, ``1Ti``),
stored as integers in canonical units (cpu in milli-cores, the rest in units). A
ClusterQueue without ``namespaceSelector`` admits no namespace, exactly as in Kueue;
write ``namespaceSelector: {}`` for all. :meth:`Fleet.nodes` expands the node groups
deterministically: node ``{cluster}-{flavor}-i{island}-n{k}`` carries its flavor's
``nodeLabels`` and ``nodeTaints``, the group's extra labels and taints,
``kubernetes.io/hostname`` = its name, and one label per topology level (island level
value ``{cluster}-{flavor}-i{island}``). Islands of several groups of one flavor in one
cluster are numbered on from the previous group. See ``sim/fleets/demo.yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from service.domain.inventory import HOSTNAME_LABEL, Cluster, Node
from service.domain.manifests import (
    ManifestError,
    cluster_queue_from_manifest,
    cohort_from_manifest,
    local_queue_from_manifest,
    priority_class_from_manifest,
    resource_flavor_from_manifest,
    taint_from_manifest,
    topology_from_manifest,
)
from service.domain.quantity import canonical_resources
from service.domain.quota import (
    ClusterQueue,
    Cohort,
    LocalQueue,
    ResourceFlavor,
    Taint,
    Topology,
    WorkloadPriorityClass,
)

__all__ = ["BACKENDS", "Fleet", "FleetError", "NodeGroup", "fleet_from_mapping", "load_fleet"]

#: A member's admission backend: which objects it serves and the centre reconciles to.
BACKENDS = ("kueue", "volcano")


class FleetError(ValueError):
    """The fleet file is malformed or refers to something it does not define."""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """``islands`` times ``nodes_per_island`` identical nodes of one flavor."""

    flavor: str
    islands: int
    nodes_per_island: int
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    racks_per_island: int = 1


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    cluster: Cluster
    node_groups: tuple[NodeGroup, ...]
    backend: str = "kueue"


@dataclass(frozen=True, slots=True)
class Fleet:
    topologies: tuple[Topology, ...] = ()
    resource_flavors: tuple[ResourceFlavor, ...] = ()
    clusters: tuple[ClusterSpec, ...] = ()
    cohorts: tuple[Cohort, ...] = ()
    cluster_queues: tuple[ClusterQueue, ...] = ()
    local_queues: tuple[LocalQueue, ...] = ()
    priority_classes: tuple[WorkloadPriorityClass, ...] = ()
    #: Namespace name → labels, for ClusterQueue ``namespaceSelector``.
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def cluster_objects(self) -> tuple[Cluster, ...]:
        return tuple(spec.cluster for spec in self.clusters)

    def backend(self, cluster: str) -> str:
        """The admission backend of ``cluster`` (``kueue`` for a cluster not in the fleet)."""
        for spec in self.clusters:
            if spec.cluster.name == cluster:
                return spec.backend
        return "kueue"

    def flavor(self, name: str) -> ResourceFlavor:
        for flavor in self.resource_flavors:
            if flavor.name == name:
                return flavor
        raise KeyError(name)

    def topology(self, name: str) -> Topology:
        for topology in self.topologies:
            if topology.name == name:
                return topology
        raise KeyError(name)

    def nodes(self, cluster: str | None = None) -> Iterator[Node]:
        """Every node of the fleet (or of one cluster), in a stable order."""
        for spec in self.clusters:
            if cluster is not None and spec.cluster.name != cluster:
                continue
            next_island: dict[str, int] = {}
            for group in spec.node_groups:
                first = next_island.get(group.flavor, 0)
                next_island[group.flavor] = first + group.islands
                yield from self._group_nodes(spec.cluster.name, group, first)

    def _group_nodes(self, cluster: str, group: NodeGroup, first_island: int) -> Iterator[Node]:
        flavor = self.flavor(group.flavor)
        levels = self.topology(flavor.topology_name).levels if flavor.topology_name else ()
        racks = max(1, group.racks_per_island)
        for island_index in range(first_island, first_island + group.islands):
            island = f"{cluster}-{flavor.name}-i{island_index}"
            for k in range(group.nodes_per_island):
                name = f"{island}-n{k}"
                rack = f"{island}-r{k * racks // group.nodes_per_island}"
                labels = {**flavor.node_labels, **group.labels}
                for depth, level in enumerate(levels):
                    if level == HOSTNAME_LABEL:
                        continue
                    labels[level] = island if depth == 0 else rack
                labels[HOSTNAME_LABEL] = name
                yield Node(
                    name=name,
                    cluster=cluster,
                    flavor=flavor.name,
                    island=island,
                    allocatable=dict(group.allocatable),
                    labels=labels,
                    taints=flavor.node_taints + group.taints,
                )


def _section(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise FleetError(f"{key}: expected a list")
    return value


def _node_group(obj: Mapping[str, Any]) -> NodeGroup:
    try:
        return NodeGroup(
            flavor=str(obj["flavor"]),
            islands=int(obj.get("islands", 1)),
            nodes_per_island=int(obj["nodesPerIsland"]),
            allocatable=canonical_resources(obj["allocatable"]),
            labels={str(k): str(v) for k, v in (obj.get("labels") or {}).items()},
            taints=tuple(taint_from_manifest(t) for t in obj.get("taints") or ()),
            racks_per_island=int(obj.get("racksPerIsland", 1)),
        )
    except KeyError as missing:
        raise FleetError(f"node group {dict(obj)!r}: missing {missing}") from None


def _cluster(obj: Mapping[str, Any]) -> ClusterSpec:
    metadata = obj.get("metadata") or {}
    name = metadata.get("name") or obj.get("name")
    if not name:
        raise FleetError(f"cluster without a name: {dict(obj)!r}")
    spec = obj.get("spec") or obj
    labels = metadata.get("labels") or obj.get("labels") or {}
    cluster = Cluster(
        name=str(name),
        labels={str(k): str(v) for k, v in labels.items()},
        healthy=bool(spec.get("healthy", True)),
        cordoned=bool(spec.get("cordoned", False)),
    )
    backend = str(spec.get("backend", "kueue"))
    if backend not in BACKENDS:
        raise FleetError(f"cluster {name}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    return ClusterSpec(
        cluster=cluster,
        node_groups=tuple(_node_group(g) for g in spec.get("nodeGroups") or ()),
        backend=backend,
    )


def _check_references(fleet: Fleet) -> None:
    flavors = {f.name for f in fleet.resource_flavors}
    topologies = {t.name for t in fleet.topologies}
    for flavor in fleet.resource_flavors:
        if flavor.topology_name and flavor.topology_name not in topologies:
            raise FleetError(f"flavor {flavor.name}: unknown topology {flavor.topology_name}")
    for spec in fleet.clusters:
        for group in spec.node_groups:
            if group.flavor not in flavors:
                raise FleetError(f"cluster {spec.cluster.name}: unknown flavor {group.flavor}")
    names = [spec.cluster.name for spec in fleet.clusters]
    if len(names) != len(set(names)):
        raise FleetError("cluster names must be unique")
    queues = {cq.name for cq in fleet.cluster_queues}
    for lq in fleet.local_queues:
        if lq.cluster_queue not in queues:
            raise FleetError(f"local queue {lq.key}: unknown cluster queue {lq.cluster_queue}")


def fleet_from_mapping(data: Mapping[str, Any]) -> Fleet:
    """Build a :class:`Fleet` from parsed YAML."""
    try:
        fleet = Fleet(
            topologies=tuple(topology_from_manifest(t) for t in _section(data, "topologies")),
            resource_flavors=tuple(
                resource_flavor_from_manifest(f) for f in _section(data, "resourceFlavors")
            ),
            clusters=tuple(_cluster(c) for c in _section(data, "clusters")),
            cohorts=tuple(cohort_from_manifest(c) for c in _section(data, "cohorts")),
            cluster_queues=tuple(
                cluster_queue_from_manifest(q) for q in _section(data, "clusterQueues")
            ),
            local_queues=tuple(local_queue_from_manifest(q) for q in _section(data, "localQueues")),
            priority_classes=tuple(
                priority_class_from_manifest(p) for p in _section(data, "workloadPriorityClasses")
            ),
            namespaces={
                str(ns["name"]): {str(k): str(v) for k, v in (ns.get("labels") or {}).items()}
                for ns in _section(data, "namespaces")
            },
        )
    except ManifestError as error:
        raise FleetError(str(error)) from error
    _check_references(fleet)
    return fleet


def load_fleet(path_or_text: str | os.PathLike[str]) -> Fleet:
    """Load a fleet from a file path or from YAML text."""
    if isinstance(path_or_text, os.PathLike) or (
        "\n" not in path_or_text and os.path.exists(path_or_text)
    ):
        text = Path(path_or_text).read_text(encoding="utf-8")
    else:
        text = str(path_or_text)
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise FleetError("a fleet file is a YAML mapping")
    return fleet_from_mapping(data)
