"""Manifests checked against Kubernetes' own OpenAPI schemas, as an API
server with strict field validation checks them: types exact (a string is
not a boolean) and unknown fields refused by name.

The schemas are the JSON-schema form of the Kubernetes OpenAPI that the
``kubernetes-validate`` package ships (its ``*-local-strict`` set, where
every object forbids unknown properties); ``jsonschema-rs`` validates, a
compiled validator per kind kept for the process.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Mapping
from typing import Any

import jsonschema_rs

#: The Kubernetes minor whose schemas are read: what members run today.
KUBERNETES_VERSION = "1.34.0"
_SCHEMAS = f"v{KUBERNETES_VERSION}-local-strict"
_SCHEMA_FILES = {"PodTemplateSpec": "podtemplatespec-v1.json", "Job": "job-batch-v1.json"}
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


def schema_problems(kind: str, manifest: Mapping[str, Any], prefix: str = "") -> list[Problem]:
    """What Kubernetes' schema for ``kind`` (``PodTemplateSpec`` or ``Job``)
    refuses in ``manifest``, each at its JSON path under ``prefix``."""
    found: list[Problem] = []
    for error in _validator(kind).iter_errors(manifest):
        found.extend(_problems(error, prefix))
        if len(found) >= MAX_PROBLEMS:
            break
    return found[:MAX_PROBLEMS]
