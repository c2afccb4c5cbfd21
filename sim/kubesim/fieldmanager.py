"""Field ownership: ``metadata.managedFields`` and server-side apply, over the
field sets of :mod:`sim.kubesim.fieldpath`. The structured-merge-diff model
behind the real API server, reduced to what clients can observe:

* a non-apply write makes its manager own every field it changed and takes
  those fields away from everyone else (updates never conflict);
* an apply merges the applied configuration into the live object, conflicts
  (409, one cause per field) where it would change a field another manager
  owns unless ``force=true`` (which takes ownership), and removes fields the
  applier owned before, no longer applies, and nobody else owns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.kubesim.errors import ApiError
from sim.kubesim.fieldpath import (
    ABSENT,
    METADATA_SHAPE,
    SELF,
    Flat,
    Path,
    Shape,
    builtin_shape,
    diff,
    flatten_into,
    item_element,
    metadata_subset,
    schema_shape,
    stored_fields,
    to_fields_v1,
)
from sim.kubesim.store import clone

__all__ = ["FieldManager", "Shape", "builtin_shape", "schema_shape"]


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
    positions = {item_element(item, shape): i for i, item in enumerate(result)}
    item_shape = shape.item()
    for item in applied:
        element = item_element(item, shape)
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
            if item_element(item, shape) == element:
                return item, shape.item()
    return None


def _remove_path(obj: dict[str, Any], path: Path, root: Shape) -> None:
    """Delete the node at ``path`` (``…, "."`` deletes the node that owns the dot)."""
    if path and path[-1] == SELF:
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
        node[:] = [item for item in node if item_element(item, shape) != last]


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
        fields, canonical = stored_fields(tree)
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
                    meta = metadata_subset(value)
                    if meta:
                        flatten_into(meta, METADATA_SHAPE, ("f:metadata",), out)
                continue
            if self._excluded(name, subresource):
                continue
            flatten_into(value, self.root.child(name), (f"f:{name}",), out)
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
                    diff(
                        metadata_subset(old.get("metadata") or {}),
                        metadata_subset(new.get("metadata") or {}),
                        METADATA_SHAPE,
                        ("f:metadata",),
                        before,
                        after,
                    )
                continue
            if self._excluded(name, subresource):
                continue
            diff(
                old.get(name, ABSENT),
                new.get(name, ABSENT),
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
                for key, item in metadata_subset(value).items():
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
            prefix = path[:-1] if path[-1] == SELF else path
            if path[-1] == SELF and any(p[: len(prefix)] == prefix for p in owned_by_others):
                continue
            if path[0] == "f:metadata":
                _remove_path(obj.get("metadata", {}), path[1:], METADATA_SHAPE)
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
        if element == SELF:
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
