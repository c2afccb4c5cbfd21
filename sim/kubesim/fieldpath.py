"""Field paths and sets: how ``metadata.managedFields`` names the fields of an
object, after structured-merge-diff's ``fieldpath`` package.

A field set is a set of paths; a path is a tuple of ``fieldsV1`` elements
(``f:spec``, ``k:{"name":"main"}``, ``v:"finalizer"``), ending in ``.`` when the
node itself (a map, or an item of an associative list) is the member. A
:class:`Shape` says how a node merges: list semantics come from the CRD schema
(``x-kubernetes-list-type`` / map keys / ``x-kubernetes-map-type``) or, for
built-in kinds, from the merge keys of :mod:`sim.kubesim.patch` (what
``k8s.io/api``'s OpenAPI says for those fields).
"""

from __future__ import annotations

import functools
import json
import marshal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.kubesim.patch import MERGE_KEYS, MERGE_SETS

Path = tuple[str, ...]
Flat = dict[Path, str]
SELF = "."
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


METADATA_SHAPE = Shape(kind="struct")


# -- flattening ----------------------------------------------------------------------------


def _encode(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def leaf(value: Any) -> str:
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


def item_element(item: Any, shape: Shape) -> str | None:
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


def flatten_into(value: Any, shape: Shape, path: Path, out: Flat) -> None:
    if isinstance(value, dict) and shape.kind != "atomic" and value:
        if shape.kind == "map":
            out[(*path, SELF)] = _EXISTS
        for name, child in value.items():
            flatten_into(child, shape.child(name), (*path, f"f:{name}"), out)
    elif isinstance(value, list) and shape.list_type in ("set", "map") and value:
        item_shape = shape.item()
        for item in value:
            element = item_element(item, shape)
            if element is None:
                out[path] = leaf(value)
                return
            if shape.list_type == "set" or not isinstance(item, dict):
                out[(*path, element)] = _EXISTS
                continue
            out[(*path, element, SELF)] = _EXISTS
            for name, child in item.items():
                flatten_into(child, item_shape.child(name), (*path, element, f"f:{name}"), out)
    else:
        out[path] = leaf(value)


ABSENT = object()


def diff(old: Any, new: Any, shape: Shape, path: Path, before: Flat, after: Flat) -> None:
    """Flatten ``old`` into ``before`` and ``new`` into ``after`` where they differ."""
    if old is new or old == new:
        return
    structs = isinstance(old, dict) and isinstance(new, dict) and shape.kind != "atomic"
    if structs and old and new:
        if shape.kind == "map":
            before[(*path, SELF)] = after[(*path, SELF)] = _EXISTS
        for name in old.keys() | new.keys():
            diff(
                old.get(name, ABSENT),
                new.get(name, ABSENT),
                shape.child(name),
                (*path, f"f:{name}"),
                before,
                after,
            )
        return
    if old is not ABSENT:
        flatten_into(old, shape, path, before)
    if new is not ABSENT:
        flatten_into(new, shape, path, after)


def metadata_subset(metadata: Mapping[str, Any]) -> dict[str, Any]:
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


def stored_fields(tree: Mapping[str, Any]) -> tuple[set[Path], frozenset[Path] | None]:
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
