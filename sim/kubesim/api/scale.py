"""The ``scale`` subresource: an ``autoscaling/v1`` Scale read from, and written into,
the object's replicas (``spec.replicas`` of the apps/v1 kinds; the paths a CRD's
``subresources.scale`` names, e.g. LeaderWorkerSet's).

As kube-apiserver's: a read answers the Scale (``spec.replicas``, ``status.replicas``
and ``status.selector`` as a selector string); an update or patch of the Scale writes
only the object's replicas, so a scale never touches the rest of its spec, and a
``resourceVersion`` in the Scale is a precondition on the object's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sim.kubesim import errors
from sim.kubesim.api.context import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Context,
    Resource,
)
from sim.kubesim.api.metadata import MODIFIED
from sim.kubesim.errors import Cause
from sim.kubesim.patch import json_patch, merge_patch, strategic_merge_patch
from sim.kubesim.resources import ScalePaths
from sim.kubesim.store import clone

if TYPE_CHECKING:
    from sim.kubesim.api.core import ApiCore

__all__ = ["patch_scale", "read_scale", "selector_string", "update_scale"]

Obj = dict[str, Any]
_OPERATORS = {"In": "in", "NotIn": "notin"}


def _path(text: str) -> list[str]:
    return [part for part in text.strip(".").split(".") if part]


def _read(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in _path(path):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _write(obj: Obj, path: str, value: Any) -> None:
    *parents, last = _path(path)
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value


def selector_string(selector: Mapping[str, Any] | None) -> str:
    """A LabelSelector as ``metav1.FormatLabelSelector`` writes it (``a=b,c in (d,e)``)."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression.get("key", ""), expression.get("operator", "")
        values = ",".join(sorted(expression.get("values") or ()))
        if operator in _OPERATORS:
            parts.append(f"{key} {_OPERATORS[operator]} ({values})")
        elif operator == "Exists":
            parts.append(key)
        elif operator == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def _paths(resource: Resource) -> ScalePaths:
    if resource.rtype.scale is None:
        raise errors.not_served()
    return resource.rtype.scale


def scale_of(resource: Resource, obj: Obj) -> Obj:
    paths = _paths(resource)
    metadata = obj["metadata"]
    status: Obj = {"replicas": int(_read(obj, paths.status_replicas) or 0)}
    if paths.label_selector is not None:
        selector = _read(obj, paths.label_selector)
        text = selector if isinstance(selector, str) else selector_string(selector)
        if text:
            status["selector"] = text
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            key: metadata[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in metadata
        },
        "spec": {"replicas": int(_read(obj, paths.spec_replicas) or 0)},
        "status": status,
    }


def read_scale(core: ApiCore, resource: Resource, namespace: str, name: str) -> Obj:
    return scale_of(resource, core.get(resource, namespace, name))


def update_scale(
    core: ApiCore, resource: Resource, namespace: str, name: str, body: Obj, ctx: Context
) -> Obj:
    """Write the Scale's ``spec.replicas`` into the object (``resourceVersion``, when
    given, must be the object's: a stale scale is a conflict)."""
    paths = _paths(resource)
    old = core.get(resource, namespace, name)
    if body.get("kind") not in (None, "Scale"):
        raise errors.bad_request(f"the body is a {body.get('kind')}, not a Scale")
    requested = (body.get("metadata") or {}).get("resourceVersion")
    if requested and requested != old["metadata"]["resourceVersion"]:
        raise errors.conflict(resource.plural, resource.group, name, MODIFIED)
    replicas = (body.get("spec") or {}).get("replicas", 0)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise errors.invalid(
            "Scale",
            "autoscaling",
            name,
            [
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {replicas!r}: must be greater than or equal to 0",
                    "spec.replicas",
                )
            ],
        )
    new = clone(old)
    _write(new, paths.spec_replicas, replicas)
    new.pop("status", None)
    written = core.update(resource, namespace, name, new, ctx)
    return scale_of(resource, written)


def patch_scale(
    core: ApiCore,
    resource: Resource,
    namespace: str,
    name: str,
    content_type: str,
    body: Any,
    ctx: Context,
) -> Obj:
    """A patch of the Scale (merge, strategic or JSON), then written as an update."""
    current = read_scale(core, resource, namespace, name)
    if content_type == MERGE_PATCH:
        patched = merge_patch(current, body)
    elif content_type == STRATEGIC_PATCH:
        patched = strategic_merge_patch(current, body)
    elif content_type == JSON_PATCH:
        patched = json_patch(current, body)
    else:
        raise errors.unsupported_media_type(
            content_type, [JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH]
        )
    if not isinstance(patched, dict):
        raise errors.bad_request("the patched object is not a JSON object")
    return update_scale(core, resource, namespace, name, patched, ctx)
