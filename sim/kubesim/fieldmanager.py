"""Field ownership: ``metadata.managedFields`` and server-side apply.

A field set is a set of paths; a path is a tuple of ``fieldsV1`` elements
(``f:spec``, ``k:{"name":"main"}``, ``v:"finalizer"``), ending in ``.`` when the
node itself (a map, or an item of an associative list) is the member. That is
the structured-merge-diff model behind the real API server, reduced to what
clients can observe:

* a non-apply write makes its manager own every field it changed and takes
  those fields away from everyone else (updates never conflict);
* an apply merges the applied configuration into the live object, conflicts
  (409, one cause per field) where it would change a field another manager
  owns unless ``force=true`` (which takes ownership), and removes fields the
  applier owned before, no longer applies, and nobody else owns.

List semantics come from the CRD schema (``x-kubernetes-list-type`` / map keys /
``x-kubernetes-map-type``) or, for built-in kinds, from the merge keys of
:mod:`sim.kubesim.patch` (what ``k8s.io/api``'s OpenAPI says for those fields).
"""

from __future__ import annotations

import functools
import json
import marshal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.kubesim.errors import ApiError
from sim.kubesim.patch import MERGE_KEYS, MERGE_SETS
from sim.kubesim.store import clone

__all__ = ["FieldManager", "Shape", "builtin_shape", "schema_shape"]

Path = tuple[str, ...]
Flat = dict[Path, str]
_SELF = "."
_EXISTS = "<exists>"

#: Root ``metadata`` fields that take part in ownership; the rest belong to the server.
_OWNED_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")


@dataclass(frozen=True, slots=True)
class Shape:
    """How a node merges: ``struct`` / ``map`` / ``atomic`` for objects, list type for arrays."""

    kind: str = "map"  # struct | map | atomic | scalar
    list_type: str = "atomic"  # atomic | set | map
    list_keys: tuple[str, ...] = ()
    schema: Mapping[str, Any] | None = None
    field_name: str = ""

    def child(self, name: str) -> Shape:
        if self.schema is None:
            return builtin_shape(name)
        properties = self.schema.get("properties") or {}
        if name in properties:
            return schema_shape(properties[name], name)
        additional = self.schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            return schema_shape(additional, name)
        return Shape(kind="map", field_name=name)

    def item(self) -> Shape:
        if self.schema is None:
            return Shape(kind="struct")
        items = self.schema.get("items")
        return schema_shape(items, "") if isinstance(items, Mapping) else Shape()


@functools.cache
def builtin_shape(name: str) -> Shape:
    if name in MERGE_SETS:
        return Shape(list_type="set", field_name=name)
    if name in MERGE_KEYS:
        keys = ("containerPort", "protocol") if name == "ports" else (MERGE_KEYS[name],)
        return Shape(list_type="map", list_keys=keys, field_name=name)
    if name in ("labels", "annotations", "nodeSelector", "data", "limits", "requests"):
        return Shape(kind="map", field_name=name)
    if name in ("selector", "labelSelector", "namespaceSelector"):
        return Shape(kind="atomic", field_name=name)
    return Shape(kind="struct", field_name=name)


#: Shapes by (id of schema node, field name); the node is kept so that its id stays unique.
_SCHEMA_SHAPES: dict[tuple[int, str], tuple[Mapping[str, Any], Shape]] = {}


def schema_shape(schema: Mapping[str, Any], name: str) -> Shape:
    """The shape of one schema node (cached: schemas are read once and never change)."""
    key = (id(schema), name)
    hit = _SCHEMA_SHAPES.get(key)
    if hit is not None and hit[0] is schema:
        return hit[1]
    shape = _schema_shape(schema, name)
    _SCHEMA_SHAPES[key] = (schema, shape)
    return shape


def _schema_shape(schema: Mapping[str, Any], name: str) -> Shape:
    list_type = schema.get("x-kubernetes-list-type", "atomic")
    keys = tuple(schema.get("x-kubernetes-list-map-keys") or ())
    if schema.get("x-kubernetes-map-type") == "atomic":
        kind = "atomic"
    elif schema.get("properties"):
        kind = "struct"
    elif schema.get("type") == "object":
        kind = "map"
    else:
        kind = "scalar"
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
        return Shape(kind="map", field_name=name)
    return Shape(kind, list_type, keys, schema, name)


_METADATA_SHAPE = Shape(kind="struct")


# -- flattening ----------------------------------------------------------------------------


def _encode(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _leaf(value: Any) -> str:
    """A leaf's value in a flat form: only ever compared, so strings skip JSON encoding
    (the NUL prefix keeps ``"1"`` apart from ``1``, which encodes as ``1``); the other
    common scalars take their JSON text without the encoder."""
    kind = type(value)
    if kind is str:
        return "\x00" + str(value)
    if kind is int:
        return str(value)
    if value is None:
        return "null"
    if not value and (kind is dict or kind is list):
        return "{}" if kind is dict else "[]"
    if kind is bool:
        return "true" if value else "false"
    return _encode(value)


def _item_element(item: Any, shape: Shape) -> str | None:
    if shape.list_type == "set":
        if type(item) is str:
            return _set_element(item)
        return "v:" + _encode(item)
    if shape.list_type == "map" and isinstance(item, dict):
        pairs = tuple((k, item[k]) for k in sorted(shape.list_keys) if k in item)
        if all(type(v) in (str, int) for _, v in pairs):
            return _key_element(pairs)
        return "k:" + _encode(dict(pairs))
    return None


@functools.lru_cache(maxsize=4096)
def _set_element(item: str) -> str:
    return "v:" + _encode(item)


@functools.lru_cache(maxsize=4096)
def _key_element(pairs: tuple[tuple[str, str | int], ...]) -> str:
    """An associative list item's element (its keys' values are few: remembered)."""
    return "k:" + _encode(dict(pairs))


def _flatten(value: Any, shape: Shape, path: Path, out: Flat) -> None:
    if isinstance(value, dict) and shape.kind != "atomic" and value:
        if shape.kind == "map":
            out[(*path, _SELF)] = _EXISTS
        for name, child in value.items():
            _flatten(child, shape.child(name), (*path, f"f:{name}"), out)
    elif isinstance(value, list) and shape.list_type in ("set", "map") and value:
        item_shape = shape.item()
        for item in value:
            element = _item_element(item, shape)
            if element is None:
                out[path] = _leaf(value)
                return
            if shape.list_type == "set" or not isinstance(item, dict):
                out[(*path, element)] = _EXISTS
                continue
            out[(*path, element, _SELF)] = _EXISTS
            for name, child in item.items():
                _flatten(child, item_shape.child(name), (*path, element, f"f:{name}"), out)
    else:
        out[path] = _leaf(value)


_ABSENT = object()


def _diff(old: Any, new: Any, shape: Shape, path: Path, before: Flat, after: Flat) -> None:
    """Flatten ``old`` into ``before`` and ``new`` into ``after`` where they differ."""
    if old is new or old == new:
        return
    structs = isinstance(old, dict) and isinstance(new, dict) and shape.kind != "atomic"
    if structs and old and new:
        if shape.kind == "map":
            before[(*path, _SELF)] = after[(*path, _SELF)] = _EXISTS
        for name in old.keys() | new.keys():
            _diff(
                old.get(name, _ABSENT),
                new.get(name, _ABSENT),
                shape.child(name),
                (*path, f"f:{name}"),
                before,
                after,
            )
        return
    if old is not _ABSENT:
        _flatten(old, shape, path, before)
    if new is not _ABSENT:
        _flatten(new, shape, path, after)


def _metadata_subset(metadata: Mapping[str, Any]) -> dict[str, Any]:
    return {k: metadata[k] for k in _OWNED_METADATA if k in metadata}


# -- fieldsV1 encoding ---------------------------------------------------------------------


# Every write re-encodes every manager's field set into its managedFields
# entry and decodes the old object's entries back: most of what a write of
# a Job cost. Objects of one kind written by one manager carry the same few
# field sets, so both directions are remembered (copies are handed out: two
# objects never share a mutable part). An entry whose fields a write leaves
# as they were keeps its tree: the new version of the object shares it with
# the old one, which is safe because stored objects are never mutated in
# place (every write works on a copy of its own, see sim/kubesim/store.py).


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = marshal.loads(_encoded(frozenset(paths)))
    return tree


@functools.lru_cache(maxsize=2048)
def _encoded(paths: frozenset[Path]) -> bytes:
    """The tree of ``paths``, marshalled: each call unmarshals a copy of its own (format 2,
    which never shares a node between two places, so no part of one copy aliases another)."""
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    return marshal.dumps(tree, 2)


def from_fields_v1(tree: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    if prefix:
        return _decode(tree, prefix)
    try:
        key = marshal.dumps(dict(tree), 2)
    except ValueError:  # not plain JSON data: not remembered
        return _decode(tree, prefix)
    return set(_decoded(key))


@functools.lru_cache(maxsize=2048)
def _decoded(key: bytes) -> frozenset[Path]:
    return frozenset(_decode(marshal.loads(key), ()))


def _stored_fields(tree: Mapping[str, Any]) -> tuple[set[Path], frozenset[Path] | None]:
    """The field set of a stored entry's tree, and that set again (frozen) where the tree
    is exactly what :func:`to_fields_v1` makes of it (same nodes, same order): only such
    a tree may stand for its fields unchanged."""
    try:
        key = marshal.dumps(dict(tree), 2)
    except ValueError:  # not plain JSON data: not remembered
        return _decode(tree, ()), None
    fields = _decoded(key)
    return set(fields), fields if _encoded(fields) == key else None


def _decode(tree: Mapping[str, Any], prefix: Path) -> set[Path]:
    paths: set[Path] = set()
    for element, child in tree.items():
        path = (*prefix, element)
        if child:
            paths |= _decode(child, path)
        else:
            paths.add(path)
    return paths


# -- structural merge / removal ------------------------------------------------------------


def _merge(live: Any, applied: Any, shape: Shape) -> Any:
    if isinstance(live, dict) and isinstance(applied, dict) and shape.kind != "atomic":
        result = dict(live)
        for name, value in applied.items():
            if value is None:
                continue
            child = shape.child(name)
            result[name] = _merge(live[name], value, child) if name in live else clone(value)
        return result
    if isinstance(live, list) and isinstance(applied, list) and shape.list_type in ("set", "map"):
        return _merge_list(live, applied, shape)
    return clone(applied)


def _merge_list(live: list[Any], applied: list[Any], shape: Shape) -> list[Any]:
    result = list(live)
    positions = {_item_element(item, shape): i for i, item in enumerate(result)}
    item_shape = shape.item()
    for item in applied:
        element = _item_element(item, shape)
        if element in positions:
            index = positions[element]
            result[index] = _merge(result[index], item, item_shape)
        else:
            positions[element] = len(result)
            result.append(clone(item))
    return result


def _find_child(node: Any, element: str, shape: Shape) -> tuple[Any, Shape] | None:
    if element.startswith("f:") and isinstance(node, dict):
        name = element[2:]
        return (node[name], shape.child(name)) if name in node else None
    if isinstance(node, list):
        for item in node:
            if _item_element(item, shape) == element:
                return item, shape.item()
    return None


def _remove_path(obj: dict[str, Any], path: Path, root: Shape) -> None:
    """Delete the node at ``path`` (``…, "."`` deletes the node that owns the dot)."""
    if path and path[-1] == _SELF:
        path = path[:-1]
    if not path:
        return
    node: Any = obj
    shape = root
    for element in path[:-1]:
        found = _find_child(node, element, shape)
        if found is None:
            return
        node, shape = found
    last = path[-1]
    if last.startswith("f:") and isinstance(node, dict):
        node.pop(last[2:], None)
    elif isinstance(node, list):
        node[:] = [item for item in node if _item_element(item, shape) != last]


# -- the manager ---------------------------------------------------------------------------


@dataclass(slots=True)
class Entry:
    manager: str
    operation: str
    subresource: str
    api_version: str
    time: str
    fields: set[Path]
    #: The stored tree this entry was read from, while it is the encoding of ``kept_fields``.
    kept: dict[str, Any] | None = None
    kept_fields: frozenset[Path] | None = None

    def fields_v1(self) -> dict[str, Any]:
        kept, kept_fields = self.kept, self.kept_fields
        if kept is not None and kept_fields is not None and kept_fields == self.fields:
            return kept
        return to_fields_v1(self.fields)

    def as_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields_v1(),
        }
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


def _entries(obj: Mapping[str, Any]) -> list[Entry]:
    entries = []
    for raw in obj.get("metadata", {}).get("managedFields") or ():
        tree = raw.get("fieldsV1") or {}
        fields, canonical = _stored_fields(tree)
        entries.append(
            Entry(
                manager=raw.get("manager", ""),
                operation=raw.get("operation", "Update"),
                subresource=raw.get("subresource", ""),
                api_version=raw.get("apiVersion", ""),
                time=raw.get("time", ""),
                fields=fields,
                kept=tree if canonical is not None else None,
                kept_fields=canonical,
            )
        )
    return entries


class FieldManager:
    """Computes ``managedFields`` for one resource version's shape."""

    def __init__(self, root: Shape, has_status: bool) -> None:
        self.root = root
        self.has_status = has_status

    def flatten(self, obj: Mapping[str, Any] | None, subresource: str) -> Flat:
        out: Flat = {}
        if obj is None:
            return out
        for name, value in obj.items():
            if name in ("apiVersion", "kind"):
                continue
            if name == "metadata":
                if subresource != "status":
                    meta = _metadata_subset(value)
                    if meta:
                        _flatten(meta, _METADATA_SHAPE, ("f:metadata",), out)
                continue
            if self._excluded(name, subresource):
                continue
            _flatten(value, self.root.child(name), (f"f:{name}",), out)
        return out

    def _flatten_differences(
        self, old: Mapping[str, Any] | None, new: Mapping[str, Any], subresource: str
    ) -> tuple[Flat, Flat]:
        """Flat forms of ``old`` and ``new`` restricted to the subtrees that differ.

        Equal subtrees flatten to equal entries, which never count as changed: skipping
        them (one C-level ``==`` each) keeps an update's cost in the size of its change.
        """
        if old is None:
            return {}, self.flatten(new, subresource)
        before: Flat = {}
        after: Flat = {}
        for name in old.keys() | new.keys():
            if name in ("apiVersion", "kind"):
                continue
            if name == "metadata":
                if subresource != "status":
                    _diff(
                        _metadata_subset(old.get("metadata") or {}),
                        _metadata_subset(new.get("metadata") or {}),
                        _METADATA_SHAPE,
                        ("f:metadata",),
                        before,
                        after,
                    )
                continue
            if self._excluded(name, subresource):
                continue
            _diff(
                old.get(name, _ABSENT),
                new.get(name, _ABSENT),
                self.root.child(name),
                (f"f:{name}",),
                before,
                after,
            )
        return before, after

    def _excluded(self, name: str, subresource: str) -> bool:
        if subresource == "status":
            return name != "status"
        return self.has_status and name == "status"

    def record_update(
        self,
        *,
        old: Mapping[str, Any] | None,
        new: dict[str, Any],
        manager: str,
        subresource: str,
        api_version: str,
        now: str,
    ) -> None:
        """Set ``new``'s managedFields after a non-apply write by ``manager``."""
        entries = _entries(old) if old is not None else []
        before, after = self._flatten_differences(old, new, subresource)
        changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
        for entry in entries:
            if entry.subresource == subresource:
                entry.fields -= changed
        owned = {p for p in changed if p in after}
        mine = _find(entries, manager, "Update", subresource)
        if owned:
            if mine is None:
                mine = Entry(manager, "Update", subresource, api_version, now, set())
                entries.append(mine)
            mine.fields |= owned
            mine.time, mine.api_version = now, api_version
        self._store(new, entries)

    def apply(
        self,
        *,
        live: Mapping[str, Any] | None,
        applied: dict[str, Any],
        manager: str,
        subresource: str,
        api_version: str,
        now: str,
        force: bool,
        owned: bool = False,
    ) -> dict[str, Any]:
        """The object after ``manager`` applies ``applied`` to ``live`` (409 on conflicts).

        ``owned``: the caller hands ``applied`` over (a copy of its own that it no longer
        uses), so that a creation can store it as it is rather than a copy of it.
        """
        applied_flat = self.flatten(applied, subresource)
        if live is None:
            result = applied if owned else clone(applied)
            self._store(
                result, [Entry(manager, "Apply", subresource, api_version, now, set(applied_flat))]
            )
            return result
        entries = _entries(live)
        merged = self._merge(live, applied, subresource)
        mine = _find(entries, manager, "Apply", subresource)
        others = [e for e in entries if e is not mine and e.subresource == subresource]
        if mine is not None:
            self._remove_dropped(merged, mine.fields - applied_flat.keys(), others)
        # Only the subtrees where live and merged differ can hold changed or removed fields.
        live_flat, merged_flat = self._flatten_differences(live, merged, subresource)
        changed = {p for p in applied_flat if live_flat.get(p) != merged_flat.get(p)}
        conflicts = [(e, sorted(e.fields & changed)) for e in others if e.fields & changed]
        if conflicts and not force:
            raise _conflict_error(conflicts, api_version)
        for entry, paths in conflicts:
            entry.fields -= set(paths)
        removed = {p for p in live_flat if p not in merged_flat}
        for entry in others:
            entry.fields -= removed
        if mine is None:
            mine = Entry(manager, "Apply", subresource, api_version, now, set())
            entries.append(mine)
        mine.fields = set(applied_flat)
        mine.time, mine.api_version = now, api_version
        self._store(merged, entries)
        return merged

    def _merge(
        self, live: Mapping[str, Any], applied: dict[str, Any], subresource: str
    ) -> dict[str, Any]:
        result = clone(dict(live))
        for name, value in applied.items():
            if name in ("apiVersion", "kind") or self._excluded(name, subresource):
                continue
            if name == "metadata":
                meta = result.setdefault("metadata", {})
                for key, item in _metadata_subset(value).items():
                    shape = builtin_shape(key)
                    meta[key] = _merge(meta[key], item, shape) if key in meta else clone(item)
                continue
            child = self.root.child(name)
            result[name] = _merge(result[name], value, child) if name in result else clone(value)
        return result

    def _remove_dropped(self, obj: dict[str, Any], dropped: set[Path], others: list[Entry]) -> None:
        owned_by_others: set[Path] = set().union(*(e.fields for e in others)) if others else set()
        for path in sorted(dropped, key=len, reverse=True):
            if path in owned_by_others:
                continue
            prefix = path[:-1] if path[-1] == _SELF else path
            if path[-1] == _SELF and any(p[: len(prefix)] == prefix for p in owned_by_others):
                continue
            if path[0] == "f:metadata":
                _remove_path(obj.get("metadata", {}), path[1:], _METADATA_SHAPE)
            else:
                _remove_path(obj, path, self.root)

    @staticmethod
    def _store(obj: dict[str, Any], entries: list[Entry]) -> None:
        kept = [e.as_dict() for e in entries if e.fields]
        metadata = obj.setdefault("metadata", {})
        if kept:
            metadata["managedFields"] = kept
        else:
            metadata.pop("managedFields", None)


def _find(entries: list[Entry], manager: str, operation: str, subresource: str) -> Entry | None:
    for entry in entries:
        if (entry.manager, entry.operation, entry.subresource) == (manager, operation, subresource):
            return entry
    return None


def _render_path(path: Path) -> str:
    text = ""
    for element in path:
        if element == _SELF:
            continue
        if element.startswith("f:"):
            text += "." + element[2:]
        elif element.startswith("k:"):
            pairs = json.loads(element[2:]).items()
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in pairs) + "]"
        elif element.startswith("v:"):
            text += f"[={element[2:]}]"
    return text


def _describe_manager(entry: Entry) -> str:
    """As the API server prints a manager in conflicts: Update managers carry version and time."""
    text = json.dumps(entry.manager)
    if entry.subresource:
        text += f" with subresource {json.dumps(entry.subresource)}"
    if entry.operation == "Update":
        text += f" using {entry.api_version}" + (f" at {entry.time}" if entry.time else "")
    return text


def _conflict_error(conflicts: list[tuple[Entry, list[Path]]], api_version: str) -> ApiError:
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {_describe_manager(entry)}: {_render_path(path)}",
            "field": _render_path(path),
        }
        for entry, paths in conflicts
        for path in paths
    ]
    if len(causes) == 1:
        summary = causes[0]["message"]
    else:
        lines = []
        for entry, paths in sorted(conflicts, key=lambda c: c[0].manager):
            lines.append(f"conflicts with {_describe_manager(entry)}:")
            lines.extend(f"- {_render_path(p)}" for p in paths)
        summary = "\n".join(lines)
    noun = "conflict" if len(causes) == 1 else "conflicts"
    return ApiError(
        409, "Conflict", f"Apply failed with {len(causes)} {noun}: {summary}", {"causes": causes}
    )
