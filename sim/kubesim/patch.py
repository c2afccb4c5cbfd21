"""The three client-side patch formats: JSON merge, JSON patch and strategic merge.

* ``application/merge-patch+json`` — RFC 7386: maps merge, ``null`` deletes,
  anything else replaces.
* ``application/json-patch+json`` — RFC 6902 operations with RFC 6901 pointers.
* ``application/strategic-merge-patch+json`` — built-in kinds only (a real API
  server answers 415 for custom resources): lists named in :data:`MERGE_KEYS`
  merge item by item on their patch merge key, ``finalizers`` merges as a set,
  and the ``$patch``, ``$setElementOrder`` and ``$deleteFromPrimitiveList``
  directives are honoured. Merge keys come from the ``patchMergeKey`` tags of
  ``k8s.io/api``.
"""

from __future__ import annotations

import json
from typing import Any

from sim.kubesim.errors import ApiError, bad_request
from sim.kubesim.store import clone

__all__ = ["MERGE_KEYS", "json_patch", "merge_patch", "strategic_merge_patch"]

#: List field name → patch merge key, for the built-in kinds we serve.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "volumes": "name",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "topologySpreadConstraints": "topologyKey",
    "ownerReferences": "uid",
    "conditions": "type",
    "addresses": "type",
}
#: Primitive lists with ``patchStrategy:"merge"``.
MERGE_SETS = frozenset({"finalizers"})


def _unprocessable(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (``target`` is not modified)."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    _merge_into(result, patch)
    return result


def _merge_into(result: dict[str, Any], patch: dict[str, Any]) -> None:
    """Merge ``patch`` into ``result`` in place (``result`` is already our own copy)."""
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            if not isinstance(current, dict):
                current = result[key] = {}
            _merge_into(current, value)
        else:
            result[key] = clone(value)


# -- RFC 6902 ------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _unprocessable(f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise _unprocessable(f"doc is missing path: {path!r}")
    return doc


def _index(container: list[Any], part: str, path: str, *, insert: bool) -> int:
    if insert and part == "-":
        return len(container)
    if not part.isdigit():
        raise _unprocessable(f"invalid array index {part!r} in {path!r}")
    index = int(part)
    if index > len(container) or (not insert and index == len(container)):
        raise _unprocessable(f"index out of range in {path!r}")
    return index


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, path, insert=True), value)
    else:
        raise _unprocessable(f"doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise _unprocessable("cannot remove the document root")
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, path, insert=False))
    raise _unprocessable(f"unable to remove nonexistent key: {last}: missing value")


def _apply_operation(doc: Any, operation: dict[str, Any]) -> Any:
    op, path = operation.get("op"), operation.get("path", "")
    match op:
        case "add":
            return _add(doc, path, clone(operation.get("value")))
        case "remove":
            _remove(doc, path)
            return doc
        case "replace":
            _remove(doc, path)
            return _add(doc, path, clone(operation.get("value")))
        case "move":
            value = _remove(doc, operation.get("from", ""))
            return _add(doc, path, value)
        case "copy":
            value = clone(_walk(doc, _pointer(operation.get("from", "")), path))
            return _add(doc, path, value)
        case "test":
            if _walk(doc, _pointer(path), path) != operation.get("value"):
                raise _unprocessable(f"testing value {path} failed: test failed")
            return doc
    raise bad_request(f"Unexpected kind: {op}")


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902; any failing operation rejects the whole patch."""
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = clone(target)
    for operation in operations:
        if not isinstance(operation, dict):
            raise bad_request("invalid JSON patch operation")
        doc = _apply_operation(doc, operation)
    return doc


# -- strategic merge -----------------------------------------------------------------------


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    return _merge_map(clone(target) if isinstance(target, dict) else {}, patch)


def _merge_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    if patch.get("$patch") == "replace":
        return {k: clone(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return {}
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    deletions = {
        k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$deleteFromPrimitiveList/")
    }
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            target[key] = _merge_map(target[key], value)
        elif isinstance(value, dict):
            target[key] = _merge_map({}, value)
        elif isinstance(value, list):
            target[key] = _merge_list(key, target.get(key), value)
        else:
            target[key] = value
    for key, values in deletions.items():
        if isinstance(target.get(key), list):
            target[key] = [v for v in target[key] if v not in values]
    for key, order in orders.items():
        if isinstance(target.get(key), list):
            target[key] = _reorder(key, target[key], order)
    return target


def _merge_list(name: str, live: Any, patch: list[Any]) -> list[Any]:
    current: list[Any] = live if isinstance(live, list) else []
    if name in MERGE_SETS:
        return current + [v for v in patch if v not in current]
    merge_key = MERGE_KEYS.get(name)
    if merge_key is None or any(not isinstance(item, dict) for item in patch):
        return [v for v in clone(patch) if not (isinstance(v, dict) and "$patch" in v)]
    if any(item.get("$patch") == "replace" for item in patch):
        return [clone(i) for i in patch if i.get("$patch") != "replace"]
    result = [clone(i) for i in current]
    for item in patch:
        key = item.get(merge_key)
        position = next(
            (i for i, existing in enumerate(result) if existing.get(merge_key) == key), None
        )
        if item.get("$patch") == "delete":
            if position is not None:
                result.pop(position)
        elif position is None:
            result.append(_merge_map({}, item))
        else:
            result[position] = _merge_map(result[position], item)
    return result


def _reorder(name: str, items: list[Any], order: list[Any]) -> list[Any]:
    merge_key = MERGE_KEYS.get(name)

    def identity(item: Any) -> str:
        value = item.get(merge_key) if merge_key and isinstance(item, dict) else item
        return json.dumps(value, sort_keys=True)

    wanted = [identity(o) for o in order]
    ranked = {key: index for index, key in enumerate(wanted)}
    return sorted(items, key=lambda item: ranked.get(identity(item), len(wanted)))
