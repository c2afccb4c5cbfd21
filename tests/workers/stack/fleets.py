"""Fleets, queues and gangs as manifests: what tests submit and apply."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.workers.stack.names import GPU, ISLAND

#: The label each fleet cluster of :func:`fleet_yaml` carries: its backend.
BACKEND_LABEL = "example.com/backend"


def fleet_yaml(
    clusters: Mapping[str, tuple[int, int]],
    flavor: str = "h100",
    backends: Mapping[str, str] | None = None,
) -> str:
    """A fleet of 8-GPU nodes: ``{cluster: (islands, nodes per island)}``;
    ``backends``: a cluster's ``kueue`` (the default) or ``volcano``, also
    its label ``example.com/backend``."""
    backends = backends or {}
    groups = "".join(
        f"""  - name: {name}
    backend: {backends.get(name, "kueue")}
    labels: {{{BACKEND_LABEL}: {backends.get(name, "kueue")}}}
    nodeGroups:
      - flavor: {flavor}
        islands: {islands}
        nodesPerIsland: {nodes}
        allocatable: {{cpu: 96, memory: 1Ti, {GPU}: 8}}
"""
        for name, (islands, nodes) in clusters.items()
    )
    return f"""topologies:
  - name: fabric
    levels:
      - nodeLabel: {ISLAND}
      - nodeLabel: kubernetes.io/hostname
resourceFlavors:
  - name: {flavor}
    nodeLabels: {{example.com/gpu: {flavor}}}
    topologyName: fabric
clusters:
{groups}"""


def manifest(kind: str, name: str, spec: Mapping[str, Any], namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": kind,
        "metadata": meta,
        "spec": dict(spec),
    }


def team_queue(
    name: str,
    gpus: int,
    *,
    cohort: str = "research",
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    preemption: Mapping[str, Any] | None = None,
    flavor: str = "h100",
) -> dict[str, Any]:
    """A team's ClusterQueue: ``gpus`` GPUs of ``flavor`` (cpu and memory in
    proportion, never the limit), in ``cohort``."""
    gpu: dict[str, Any] = {"name": GPU, "nominalQuota": gpus}
    if borrowing_limit is not None:
        gpu["borrowingLimit"] = borrowing_limit
    if lending_limit is not None:
        gpu["lendingLimit"] = lending_limit
    return manifest(
        "ClusterQueue",
        name,
        {
            "cohortName": cohort,
            "namespaceSelector": {},
            "preemption": dict(preemption or {}),
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": 12 * gpus},
                                {"name": "memory", "nominalQuota": f"{128 * gpus}Gi"},
                                gpu,
                            ],
                        }
                    ],
                }
            ],
        },
    )


def base_manifests(flavor: str = "h100") -> list[dict[str, Any]]:
    return [
        manifest(
            "Topology",
            "fabric",
            {"levels": [{"nodeLabel": ISLAND}, {"nodeLabel": "kubernetes.io/hostname"}]},
        ),
        manifest(
            "ResourceFlavor",
            flavor,
            {"nodeLabels": {"example.com/gpu": flavor}, "topologyName": "fabric"},
        ),
        manifest("Cohort", "research", {}),
    ]


def local_queue(namespace: str, cluster_queue: str, name: str = "train") -> dict[str, Any]:
    return manifest("LocalQueue", name, {"clusterQueue": cluster_queue}, namespace)


def pod_template(requests: Mapping[str, Any], duration: str | None = None) -> dict[str, Any]:
    """A training pod that passes the security floor (image by digest, its own
    service account, a runtime class), asking for ``requests``; the stand-in's
    kubelet runs it ``duration`` of simulated time (its default without)."""
    template: dict[str, Any] = {
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "trainer",
            "runtimeClassName": "nvidia",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "image": "registry.example/train@sha256:" + "a" * 64,
                    "resources": {"requests": dict(requests)},
                }
            ],
        }
    }
    if duration is not None:
        template["metadata"] = {"annotations": {"quartermaster.dev/sim-duration": duration}}
    return template


def gang(
    name: str,
    gpus: int,
    seconds: float,
    *,
    queue: str = "train",
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A training gang of ``gpus`` GPUs (pods of at most 8), running
    ``seconds`` of simulated time; more than one pod asks for one island."""
    per_pod = min(gpus, 8)
    if gpus > 8 and gpus % 8:
        raise ValueError("a gang of more than 8 GPUs has whole nodes")
    count = max(1, gpus // 8)
    pod_set: dict[str, Any] = {
        "name": "workers",
        "count": count,
        "template": pod_template(
            {"cpu": str(per_pod), "memory": f"{8 * per_pod}Gi", GPU: per_pod}, f"{seconds:g}s"
        ),
    }
    if count > 1:
        pod_set["topologyRequest"] = {"required": ISLAND}
    spec: dict[str, Any] = {"queueName": queue, "podSets": [pod_set]}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": spec,
    }


def write_fleet(
    path: Path, clusters: Mapping[str, tuple[int, int]], backends: Mapping[str, str] | None = None
) -> Path:
    path.write_text(fleet_yaml(clusters, backends=backends))
    yaml.safe_load(path.read_text())  # well-formed
    return path
