"""Manifests checked against Kubernetes' own OpenAPI schemas, as an API
server with strict field validation checks them: types exact (a string is
not a boolean) and unknown fields refused by name.

Built-in kinds use the JSON-schema form of the Kubernetes OpenAPI that the
``kubernetes-validate`` package ships (its ``*-local-strict`` set, where
every object forbids unknown properties); custom kinds the
``openAPIV3Schema`` of their CRDs (``crds/``), read as a structural schema
is: unknown fields refused, a null taken as absent (the API server prunes
it). ``jsonschema-rs`` validates, a compiled validator per kind per process.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Mapping
from typing import Any

import jsonschema_rs

from service.yamlcache import yaml_documents

#: The Kubernetes minor whose schemas are read: what members run today.
KUBERNETES_VERSION = "1.34.0"
_SCHEMAS = f"v{KUBERNETES_VERSION}-local-strict"
_SCHEMA_FILES = {
    "PodTemplateSpec": "podtemplatespec-v1.json",
    "ObjectMeta": "objectmeta-meta-v1.json",
    "Job": "job-batch-v1.json",
    "Deployment": "deployment-apps-v1.json",
    "StatefulSet": "statefulset-apps-v1.json",
}
#: The built-in job kinds, checked whole against Kubernetes' own schema.
BUILT_IN_KINDS = frozenset({"Job", "Deployment", "StatefulSet"})
#: (apiVersion, kind) → the CRD file that defines it.
CRDS = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_mpijobs.yaml",
    ("ray.io/v1", "RayJob"): "ray.io_rayjobs.yaml",
    ("ray.io/v1", "RayCluster"): "ray.io_rayclusters.yaml",
    (
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
    ): "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    (
        "trainer.kubeflow.org/v1alpha1",
        "TrainingRuntime",
    ): "trainer.kubeflow.org_trainingruntimes.yaml",
    (
        "trainer.kubeflow.org/v1alpha1",
        "ClusterTrainingRuntime",
    ): "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ("batch.volcano.sh/v1alpha1", "Job"): "batch.volcano.sh_jobs.yaml",
}
_DROPPED = frozenset({"description", "default", "example", "externalDocs", "nullable", "format"})
#: Problems reported per manifest at most: the first ones say enough.
MAX_PROBLEMS = 20

Problem = tuple[str, str]


def _read(name: str) -> Any:
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / _SCHEMAS
    return json.loads((folder / name).read_text())


@functools.cache
def _definitions() -> Any:
    return _read("_definitions.json")


@functools.cache
def _validator(kind: str) -> Any:
    return jsonschema_rs.validator_for(
        _read(_SCHEMA_FILES[kind]), retriever=lambda _uri: _definitions()
    )


def _structural(node: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as JSON Schema with the API server's
    strict reading: objects with properties refuse others unless they keep
    unknown fields, every type admits null, int-or-string is either."""
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    if node.get("x-kubernetes-int-or-string"):
        return {"type": ["integer", "string", "null"]}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or key.startswith("x-kubernetes-"):
            continue
        if key == "properties":
            out[key] = {name: _structural(schema) for name, schema in value.items()}
        else:
            out[key] = _structural(value)
    if isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    keeps_unknown = node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in node and "additionalProperties" not in node and not keeps_unknown:
        out["additionalProperties"] = False
    return out


def _crd_schema(api_version: str, kind: str) -> Any:
    folder = importlib.resources.files("service.app") / "crds"
    with importlib.resources.as_file(folder / CRDS[(api_version, kind)]) as path:
        (crd,) = yaml_documents(path)
    version = api_version.rsplit("/", 1)[1]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = _structural(served["schema"]["openAPIV3Schema"])
    # The root's metadata is Kubernetes' ObjectMeta, checked on its own.
    schema["properties"].pop("metadata", None)
    schema["additionalProperties"] = True
    return schema


@functools.cache
def _crd_validator(api_version: str, kind: str) -> Any:
    return jsonschema_rs.validator_for(_crd_schema(api_version, kind))


def _path(prefix: str, parts: list[str | int]) -> str:
    path = prefix
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _problems(error: Any, prefix: str) -> list[Problem]:
    path = _path(prefix, list(error.instance_path))
    unexpected = getattr(error.kind, "unexpected", None)
    if unexpected:
        return [(_path(path, [str(name)]), "unknown field") for name in unexpected]
    return [(path, str(error.message))]


def _collect(validator: Any, manifest: Any, prefix: str) -> list[Problem]:
    found: list[Problem] = []
    for error in validator.iter_errors(manifest):
        found.extend(_problems(error, prefix))
        if len(found) >= MAX_PROBLEMS:
            break
    return found[:MAX_PROBLEMS]


def schema_problems(kind: str, manifest: Mapping[str, Any], prefix: str = "") -> list[Problem]:
    """What Kubernetes' schema for ``kind`` (``PodTemplateSpec``,
    ``ObjectMeta`` or a built-in kind) refuses in ``manifest``, each at its JSON path
    under ``prefix``."""
    return _collect(_validator(kind), manifest, prefix)


def custom_problems(manifest: Mapping[str, Any], prefix: str = "") -> list[Problem]:
    """What the CRD of a custom job kind refuses in ``manifest`` (its
    metadata read as ObjectMeta); nothing for a kind with no CRD here."""
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    if key not in CRDS:
        return []
    root = prefix.rstrip(".")
    found = _collect(_crd_validator(*key), manifest, root)
    metadata = manifest.get("metadata")
    if metadata is not None:
        found += _collect(_validator("ObjectMeta"), metadata, f"{prefix}metadata")
    return found[:MAX_PROBLEMS]
