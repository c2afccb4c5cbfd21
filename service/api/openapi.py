"""The OpenAPI document: request and response schemas of every kind.

Bodies are read by hand (JSON or YAML), so the schemas are declared here:
each kind's object model goes into ``components.schemas`` and the routes
refer to it.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, create_model
from pydantic.json_schema import models_json_schema

from service.app.kinds import KINDS, Kind
from service.app.schemas import ObjectMeta, Strict
from service.app.workloads import CLASS_ANNOTATION, JOB_KINDS

REF = "#/components/schemas/{model}"


def _object_model(kind: Kind) -> type[BaseModel]:
    fields: dict[str, Any] = {
        "apiVersion": (
            Literal["quartermaster.dev/v1", "kueue.x-k8s.io/v1beta2"],
            "quartermaster.dev/v1",
        ),
        "kind": (Literal[kind.kind], kind.kind),
        "metadata": (ObjectMeta, ...),
    }
    if kind.flat:
        for name, info in kind.spec.model_fields.items():
            fields[name] = (info.annotation, info)
    else:
        fields["spec"] = (kind.spec, ...)
    return create_model(kind.kind, __base__=Strict, **fields)


MODELS = {kind.kind: _object_model(kind) for kind in KINDS.values()}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


_JOB_MANIFEST = (
    "A job manifest as is: batch/v1 Job, JobSet, PyTorchJob, MPIJob, RayJob, RayCluster, "
    "apps/v1 Deployment or StatefulSet, LeaderWorkerSet, or a Volcano Job "
    "(batch.volcano.sh/v1alpha1, a pod set per task), read against its CRD or "
    "Kubernetes' schema, its pod sets derived as Kueue's integration for the kind derives "
    "them. Its class is inference for Deployment, StatefulSet and LeaderWorkerSet and "
    f"training for the others unless its annotation {CLASS_ANNOTATION} says otherwise. "
    "The serving kinds are held pending (KindNotRunnable) until members can run them; "
    "a TrainJob becomes the JobSet its registered TrainingRuntime or "
    "ClusterTrainingRuntime describes (docs/workload-kinds.md)."
)


def body_schema(kind: Kind, patch: bool = False, submission: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = _ref(kind.kind)
    if patch:
        schema = {"type": "object", "description": f"An RFC 7386 merge patch of a {kind.kind}"}
    if submission:
        schema = {
            "oneOf": [
                _ref(kind.kind),
                {
                    "type": "object",
                    "description": _JOB_MANIFEST,
                    "required": ["apiVersion", "kind", "metadata", "spec"],
                    "properties": {
                        "kind": {"enum": [k for k in JOB_KINDS if k != "TrainJob"]},
                        "apiVersion": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {"type": "object"},
                    },
                },
            ]
        }
    media = "application/merge-patch+json" if patch else "application/json"
    content = {media: {"schema": schema}}
    if not patch:
        content["application/yaml"] = {"schema": schema}
    return {"requestBody": {"required": True, "content": content}}


_STORED = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {
            "type": "object",
            "required": ["name", "uid", "resourceVersion"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "uid": {"type": "string"},
                "resourceVersion": {"type": "string"},
                "generation": {"type": "integer"},
                "creationTimestamp": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {"type": "object"},
        "status": {"type": "object"},
    },
}


def object_schema(kind: Kind) -> dict[str, Any]:
    return {
        "description": f"The stored {kind.kind}",
        "content": {"application/json": {"schema": _STORED}},
    }


def list_schema(kind: Kind) -> dict[str, Any]:
    return {
        "description": f"A page of {kind.plural}",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["items", "metadata"],
                    "properties": {
                        "items": {"type": "array", "items": _STORED},
                        "metadata": {"type": "object"},
                    },
                }
            }
        },
    }


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        document = get_openapi(title=app.title, version=app.version, routes=app.routes)
        _, definitions = models_json_schema(
            [(model, "validation") for model in MODELS.values()], ref_template=REF
        )
        components = document.setdefault("components", {}).setdefault("schemas", {})
        components.update(definitions.get("$defs", {}))
        problem = {
            "type": "object",
            "required": ["type", "title", "status", "detail"],
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                "errors": {"type": "array", "items": {"type": "object"}},
            },
        }
        components["Problem"] = problem
        _document_problems(document)
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]


_ERRORS = {
    "400": "Malformed body",
    "401": "No or unknown bearer token",
    "403": "The caller's role does not allow this",
    "404": "Not found",
    "405": "Method not allowed",
    "409": "Conflict: exists, stale resourceVersion, in use, or idempotency key in flight",
    "413": "Body too large",
    "415": "Unsupported media type",
    "422": "Invalid: every field at fault is listed",
    "429": "Rate limited: see Retry-After",
    "503": "Unavailable: the database cannot be reached, or a setting it needs is missing",
}


def _document_problems(document: dict[str, Any]) -> None:
    """Every operation may answer with a problem+json error."""
    body = {"application/problem+json": {"schema": {"$ref": REF.format(model="Problem")}}}
    for path, operations in document.get("paths", {}).items():
        public = path in ("/healthz", "/readyz", "/metrics")
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for status, description in _ERRORS.items():
                if public and status != "405":
                    continue
                responses[status] = {"description": description, "content": body}
            if path == "/readyz":
                responses["503"] = {"description": "Not ready", "content": body}
    document.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
    document.get("components", {}).get("schemas", {}).pop("ValidationError", None)
