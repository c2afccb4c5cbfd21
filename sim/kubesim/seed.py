"""What a fresh simulated cluster contains: system namespaces, Nodes from the fleet,
and optionally the fleet's Kueue objects (for runs without a reconciler).

Nodes come from :meth:`sim.fleet.Fleet.nodes` (the one fleet format); the Kueue
seed reads the same fleet file's sections, where an entry is either a full
object or the flattened ``name`` + spec-fields form described in
:mod:`sim.fleet`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from service.domain.inventory import Node
from sim.kubesim.quantity import resource_quantity

__all__ = [
    "SYSTEM_NAMESPACES",
    "kueue_objects",
    "namespace_objects",
    "node_object",
    "node_status",
    "volcano_objects",
]

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
KUEUE = "kueue.x-k8s.io/v1beta2"
KUBELET_VERSION = "v1.32.0"


def _quantities(amounts: Mapping[str, int]) -> dict[str, str]:
    quantities = {name: resource_quantity(name, amount) for name, amount in amounts.items()}
    quantities.setdefault("pods", "110")
    return quantities


def _address(name: str) -> str:
    digest = hashlib.sha256(name.encode()).digest()
    return f"10.{digest[0]}.{digest[1]}.{max(1, digest[2])}"


def node_object(node: Node) -> dict[str, Any]:
    labels = {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **dict(node.labels),
        "kubernetes.io/hostname": node.labels.get("kubernetes.io/hostname", node.name),
    }
    spec: dict[str, Any] = {}
    if node.taints:
        spec["taints"] = [
            {"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect}
            for t in node.taints
        ]
    if node.unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": spec,
    }


def node_status(node: Node, now: str, *, ready: bool = True) -> dict[str, Any]:
    capacity = _quantities(node.allocatable)
    return {
        "capacity": capacity,
        "allocatable": dict(capacity),
        "conditions": [ready_condition(ready, now)],
        "addresses": [
            {"type": "InternalIP", "address": _address(node.name)},
            {"type": "Hostname", "address": node.name},
        ],
        "nodeInfo": {
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "containerd://1.7.0",
            "osImage": "kubesim",
            "kernelVersion": "6.1.0",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def ready_condition(ready: bool, now: str) -> dict[str, Any]:
    if ready:
        reason, message, status = "KubeletReady", "kubelet is posting ready status", "True"
    else:
        reason, message, status = (
            "NodeStatusUnknown",
            "Kubelet stopped posting node status.",
            "Unknown",
        )
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def _split(
    entry: Mapping[str, Any], *, top_level: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, body) of a fleet entry, full or flattened."""
    if "metadata" in entry:
        metadata = dict(entry["metadata"])
        body = {k: v for k, v in entry.items() if k not in ("apiVersion", "kind", "metadata")}
        return metadata, body
    metadata = {"name": entry["name"]}
    if entry.get("labels"):
        metadata["labels"] = dict(entry["labels"])
    if entry.get("namespace"):
        metadata["namespace"] = entry["namespace"]
    rest = {k: v for k, v in entry.items() if k not in ("name", "labels", "namespace")}
    if top_level:
        return metadata, {k: v for k, v in rest.items() if k in top_level}
    return metadata, {"spec": rest}


def _topology_levels(body: dict[str, Any]) -> None:
    spec = body.get("spec") or {}
    spec["levels"] = [
        level if isinstance(level, Mapping) else {"nodeLabel": level}
        for level in spec.get("levels") or ()
    ]


def namespace_objects(data: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The Namespaces of a parsed fleet file."""
    for entry in data.get("namespaces") or ():
        metadata = {"name": entry["name"], "labels": dict(entry.get("labels") or {})}
        yield {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def volcano_objects() -> Iterator[dict[str, Any]]:
    """What a Volcano install creates: the ``default`` Queue (open, weight 1, no
    capability) that a PodGroup without ``queue`` goes to, and its namespace."""
    yield {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "volcano-system"}}
    yield {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "default"},
        "spec": {"weight": 1, "reclaimable": True},
    }


def kueue_objects(data: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Namespaces and Kueue objects of a parsed fleet file, in dependency order."""
    yield from namespace_objects(data)
    sections = (
        ("topologies", "Topology"),
        ("resourceFlavors", "ResourceFlavor"),
        ("cohorts", "Cohort"),
        ("workloadPriorityClasses", "WorkloadPriorityClass"),
        ("clusterQueues", "ClusterQueue"),
        ("localQueues", "LocalQueue"),
    )
    for section, kind in sections:
        for entry in data.get(section) or ():
            top = ("value", "description") if kind == "WorkloadPriorityClass" else ()
            metadata, body = _split(entry, top_level=top)
            if kind == "Topology":
                _topology_levels(body)
            yield {"apiVersion": KUEUE, "kind": kind, "metadata": metadata, **body}
