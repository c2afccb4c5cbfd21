"""The demo that standalone mode seeds, through the public API like any client.

Quotas are created when missing and otherwise left alone, so that a restart
keeps whatever was changed since. Stand-in member clusters are new processes
on every start (new ports, tokens and CA), so their Cluster objects are
created once and then updated — only those that carry our stand-in label, never
a real cluster that happens to share a name.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

STAND_IN_LABEL = "quartermaster.dev/stand-in"

#: Collection path per kind, in an order that creates what others refer to first.
_PATHS = {
    "Topology": "/v1/topologies",
    "ResourceFlavor": "/v1/resourceflavors",
    "Cohort": "/v1/cohorts",
    "WorkloadPriorityClass": "/v1/workloadpriorityclasses",
    "ClusterQueue": "/v1/clusterqueues",
    "LocalQueue": "/v1/namespaces/{namespace}/localqueues",
}
_ORDER = list(_PATHS)


@dataclass
class Seeded:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{len(names)} {what}"
            for what, names in (
                ("created", self.created),
                ("updated", self.updated),
                ("already there", self.existing),
                ("left alone", self.skipped),
                ("failed", self.failed),
            )
            if names
        ]
        return ", ".join(parts) or "nothing to do"


def load_manifests(path: Path) -> list[dict[str, Any]]:
    """Every document of a multi-document YAML file, in dependency order."""
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    unknown = [d.get("kind") for d in documents if d.get("kind") not in _PATHS]
    if unknown:
        raise ValueError(f"{path}: kinds standalone cannot seed: {unknown}")
    return sorted(documents, key=lambda d: _ORDER.index(d["kind"]))


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj['kind']}/{where}{meta.get('name')}"


def _problem(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("detail") or body.get("title") or response.text)
    except ValueError:
        return response.text


def seed_quotas(api: httpx.Client, manifests: Iterable[Mapping[str, Any]]) -> Seeded:
    """Create each object unless it exists."""
    result = Seeded()
    for obj in manifests:
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        response = api.post(_PATHS[obj["kind"]].format(namespace=namespace), json=obj)
        if response.status_code == 201:
            result.created.append(_name(obj))
        elif response.status_code == 409:
            result.existing.append(_name(obj))
        else:
            result.failed.append(f"{_name(obj)}: {response.status_code} {_problem(response)}")
    return result


@dataclass(frozen=True)
class StandIn:
    """One stand-in member cluster as its kubeconfig names it."""

    name: str
    server: str
    token: str
    ca_data: str | None
    labels: Mapping[str, str]


#: The kubeconfig cluster extension in which ``quartermaster sim cluster``
#: writes each cluster's fleet labels.
LABELS_EXTENSION = "quartermaster.dev/labels"


def _labels(cluster: Mapping[str, Any]) -> dict[str, str]:
    for extension in cluster.get("extensions") or ():
        if extension.get("name") == LABELS_EXTENSION:
            return {str(k): str(v) for k, v in (extension.get("extension") or {}).items()}
    return {}


def stand_ins(kubeconfig: Path) -> list[StandIn]:
    """The clusters of a kubeconfig written by ``quartermaster sim cluster``
    (one context per cluster), with the fleet's labels it wrote for each."""
    config = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    clusters = {c["name"]: c["cluster"] for c in config["clusters"]}
    users = {u["name"]: u["user"] for u in config["users"]}
    found = []
    for entry in config["contexts"]:
        context = entry["context"]
        cluster = clusters[context["cluster"]]
        ca = cluster.get("certificate-authority-data")
        found.append(
            StandIn(
                name=entry["name"],
                server=cluster["server"],
                token=users[context["user"]]["token"],
                ca_data=base64.b64decode(ca).decode() if ca else None,
                labels=_labels(cluster),
            )
        )
    return found


def _cluster_spec(cluster: StandIn) -> dict[str, Any]:
    spec: dict[str, Any] = {"server": cluster.server, "credentials": {"token": cluster.token}}
    if cluster.ca_data:
        spec["caData"] = cluster.ca_data
    return spec


def register_clusters(api: httpx.Client, clusters: Iterable[StandIn]) -> Seeded:
    """Create a Cluster per stand-in, or point the existing stand-in's object
    at this run's server and credentials."""
    result = Seeded()
    for cluster in clusters:
        name = f"Cluster/{cluster.name}"
        body = {
            "apiVersion": "quartermaster.dev/v1",
            "kind": "Cluster",
            "metadata": {
                "name": cluster.name,
                "labels": {**cluster.labels, STAND_IN_LABEL: "kubesim"},
            },
            "spec": _cluster_spec(cluster),
        }
        response = api.post("/v1/clusters", json=body)
        if response.status_code == 201:
            result.created.append(name)
            continue
        if response.status_code != 409:
            result.failed.append(f"{name}: {response.status_code} {_problem(response)}")
            continue
        current = api.get(f"/v1/clusters/{cluster.name}")
        labels = (current.json().get("metadata") or {}).get("labels") or {}
        if current.status_code != 200 or STAND_IN_LABEL not in labels:
            result.skipped.append(f"{name} (not a stand-in)")
            continue
        response = api.patch(
            f"/v1/clusters/{cluster.name}",
            json={"spec": _cluster_spec(cluster)},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if response.status_code == 200:
            result.updated.append(name)
        else:
            result.failed.append(f"{name}: {response.status_code} {_problem(response)}")
    return result
