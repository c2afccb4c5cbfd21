"""Structural-schema handling of custom resources: pruning, defaulting, validation, CEL.

This is what ``apiextensions-apiserver`` does with a CRD's ``openAPIV3Schema`` on
every write, in the same order: drop (or, with ``fieldValidation=Strict``,
reject) unknown fields, apply ``default`` values, then validate types, formats,
bounds, enums, patterns, list types and the ``x-kubernetes-validations`` CEL
rules (evaluated by ``celpy``, a real CEL implementation). Transition rules
(those naming ``oldSelf``) run only where an old value correlates, as upstream:
object properties and ``x-kubernetes-list-type: map`` items by key. Error
wording follows ``k8s.io/apimachinery/pkg/util/validation/field``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import celpy
import orjson
from celpy.adapter import json_to_cel

from sim.kubesim.errors import Cause

__all__ = ["SchemaValidator", "cel_compile_error", "cel_program"]

Schema = Mapping[str, Any]

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_TYPE_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}

_cel_env = celpy.Environment()


@functools.cache
def _cel_program(rule: str) -> Any:
    return _cel_env.program(_cel_env.compile(rule))


def cel_program(expression: str) -> Any:
    """``expression`` compiled once per process (raises on a syntax error)."""
    return _cel_program(expression)


def cel_compile_error(expression: str) -> str | None:
    """Why ``expression`` does not compile, or ``None``."""
    try:
        _cel_program(expression)
    except Exception as error:
        return " ".join(str(error).split()) or type(error).__name__
    return None


def _type_name(value: Any) -> str:
    if isinstance(value, float):
        return "number"
    return _TYPE_NAMES.get(type(value), "null" if value is None else type(value).__name__)


def _show(value: Any) -> str:
    """A value as Go's ``%#v``-ish rendering in field errors: strings quoted, others bare."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (dict, list)):
        return json.dumps(_type_name(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _is_type(value: Any, schema: Schema) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    expected = schema.get("type")
    match expected:
        case None:
            return True
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "boolean":
            return isinstance(value, bool)
        case "integer":
            return (isinstance(value, int) and not isinstance(value, bool)) or (
                isinstance(value, float) and value.is_integer()
            )
        case "number":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _list_keys(schema: Schema) -> tuple[str, ...] | None:
    if schema.get("x-kubernetes-list-type") == "map":
        return tuple(schema.get("x-kubernetes-list-map-keys") or ())
    return None


def _item_key(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...] | None:
    if not isinstance(item, dict):
        return None
    return tuple(json.dumps(item.get(k), sort_keys=True) for k in keys)


class SchemaValidator:
    """Prunes, defaults and validates objects of one CRD version."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema

    # -- pruning ---------------------------------------------------------------------------

    def prune(self, obj: dict[str, Any]) -> list[str]:
        """Remove unknown fields below the root (not ``metadata``); return their paths."""
        unknown: list[str] = []
        for name in list(obj):
            if name in ("apiVersion", "kind", "metadata"):
                continue
            sub = (self.schema.get("properties") or {}).get(name)
            if sub is None:
                if not self.schema.get("x-kubernetes-preserve-unknown-fields"):
                    unknown.append(name)
                    del obj[name]
                continue
            obj[name] = self._prune(obj[name], sub, name, unknown)
            if obj[name] is _DROP:
                del obj[name]
        return unknown

    def _prune(self, value: Any, schema: Schema, path: str, unknown: list[str]) -> Any:
        if value is None:
            return None if schema.get("nullable") else _DROP
        if isinstance(value, dict) and schema.get("type", "object") == "object":
            self._prune_object(value, schema, path, unknown)
        elif isinstance(value, list) and "items" in schema:
            for index, item in enumerate(value):
                pruned = self._prune(item, schema["items"], f"{path}[{index}]", unknown)
                value[index] = None if pruned is _DROP else pruned
        return value

    def _prune_object(
        self, value: dict[str, Any], schema: Schema, path: str, unknown: list[str]
    ) -> None:
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        for name in list(value):
            if properties is not None and name in properties:
                sub = properties[name]
            elif isinstance(additional, Mapping):
                sub = additional
            elif preserve or additional is True:
                continue
            else:
                unknown.append(_join(path, name))
                del value[name]
                continue
            pruned = self._prune(value[name], sub, _join(path, name), unknown)
            if pruned is _DROP:
                del value[name]
            else:
                value[name] = pruned

    # -- defaulting ------------------------------------------------------------------------

    def apply_defaults(self, obj: dict[str, Any]) -> None:
        for name, sub in (self.schema.get("properties") or {}).items():
            if name in ("apiVersion", "kind", "metadata"):
                continue
            if name not in obj and "default" in sub:
                obj[name] = json.loads(json.dumps(sub["default"]))
            if name in obj:
                self._default(obj[name], sub)

    def _default(self, value: Any, schema: Schema) -> None:
        if isinstance(value, dict):
            properties = schema.get("properties")
            if properties:
                for name, sub in properties.items():
                    if name not in value and "default" in sub:
                        value[name] = json.loads(json.dumps(sub["default"]))
                    if name in value:
                        self._default(value[name], sub)
            additional = schema.get("additionalProperties")
            if isinstance(additional, Mapping):
                for item in value.values():
                    self._default(item, additional)
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            for item in value:
                self._default(item, schema["items"])

    # -- validation ------------------------------------------------------------------------

    def validate(self, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[Cause]:
        causes: list[Cause] = []
        root = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        old_root = (
            {k: v for k, v in old.items() if k not in ("apiVersion", "kind", "metadata")}
            if old is not None
            else None
        )
        for name, sub in (self.schema.get("properties") or {}).items():
            if name in root and name not in ("apiVersion", "kind", "metadata"):
                old_value = old_root.get(name, _MISSING) if old_root is not None else _MISSING
                self._check(root[name], sub, name, old_value, causes)
        for name in self.schema.get("required") or ():
            if name not in obj:
                causes.append(Cause("FieldValueRequired", "Required value", name))
        self._rules(obj, self.schema, "", old if old is not None else _MISSING, causes)
        return causes

    def _check(self, value: Any, schema: Schema, path: str, old: Any, causes: list[Cause]) -> None:
        if value is None:
            if not schema.get("nullable"):
                causes.append(
                    Cause(
                        "FieldValueTypeInvalid",
                        f'Invalid value: "null": {path} in body must be of type '
                        f'{schema.get("type", "object")}: "null"',
                        path,
                    )
                )
            return
        if not _is_type(value, schema):
            expected = schema.get("type")
            causes.append(
                Cause(
                    "FieldValueTypeInvalid",
                    f"Invalid value: {_show(_type_name(value))}: {path} in body must be of type "
                    f"{expected}: {_show(_type_name(value))}",
                    path,
                )
            )
            return
        self._check_scalar(value, schema, path, causes)
        if isinstance(value, dict):
            self._check_object(value, schema, path, old, causes)
        elif isinstance(value, list):
            self._check_array(value, schema, path, old, causes)
        self._rules(value, schema, path, old, causes)

    def _check_scalar(self, value: Any, schema: Schema, path: str, causes: list[Cause]) -> None:
        enum = schema.get("enum")
        if enum is not None and value not in enum:
            supported = ", ".join(_show(v) for v in enum)
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f"Unsupported value: {_show(value)}: supported values: {supported}",
                    path,
                )
            )
        if isinstance(value, str):
            self._check_string(value, schema, path, causes)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            self._check_number(value, schema, path, causes)

    def _check_string(self, value: str, schema: Schema, path: str, causes: list[Cause]) -> None:
        pattern = schema.get("pattern")
        if pattern and not _regex(pattern).search(value):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_show(value)}: {path} in body should match '{pattern}'",
                    path,
                )
            )
        max_length = schema.get("maxLength")
        if max_length is not None and len(value) > max_length:
            causes.append(
                Cause(
                    "FieldValueTooLong", f"Too long: may not be more than {max_length} bytes", path
                )
            )
        min_length = schema.get("minLength")
        if min_length is not None and len(value) < min_length:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_show(value)}: {path} in body should be at least "
                    f"{min_length} chars long",
                    path,
                )
            )
        if schema.get("format") == "date-time" and not _is_datetime(value):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_show(value)}: {path} in body must be of type date-time: "
                    f"{_show(value)}",
                    path,
                )
            )

    def _check_number(self, value: float, schema: Schema, path: str, causes: list[Cause]) -> None:
        bounds = {"int32": _INT32, "int64": _INT64}.get(schema.get("format", ""))
        if bounds and not bounds[0] <= value <= bounds[1]:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {value}: out of {schema['format']} range",
                    path,
                )
            )
        minimum, maximum = schema.get("minimum"), schema.get("maximum")
        if minimum is not None and (
            value < minimum or (schema.get("exclusiveMinimum") and value == minimum)
        ):
            relation = (
                "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
            )
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_show(value)}: {path} in body should be {relation} {minimum}",
                    path,
                )
            )
        if maximum is not None and (
            value > maximum or (schema.get("exclusiveMaximum") and value == maximum)
        ):
            relation = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_show(value)}: {path} in body should be {relation} {maximum}",
                    path,
                )
            )

    def _check_object(
        self, value: dict[str, Any], schema: Schema, path: str, old: Any, causes: list[Cause]
    ) -> None:
        old_map = old if isinstance(old, dict) else {}
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            if name in value:
                self._check(
                    value[name], sub, _join(path, name), old_map.get(name, _MISSING), causes
                )
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for name, item in value.items():
                if name not in properties:
                    self._check(
                        item, additional, f"{path}[{name}]", old_map.get(name, _MISSING), causes
                    )
        for name in schema.get("required") or ():
            if name not in value:
                causes.append(Cause("FieldValueRequired", "Required value", _join(path, name)))
        max_properties = schema.get("maxProperties")
        if max_properties is not None and len(value) > max_properties:
            causes.append(
                Cause(
                    "FieldValueTooMany",
                    f"Too many: {len(value)}: must have at most {max_properties} items",
                    path,
                )
            )
        min_properties = schema.get("minProperties")
        if min_properties is not None and len(value) < min_properties:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {len(value)}: {path} in body should have at least "
                    f"{min_properties} properties",
                    path,
                )
            )

    def _check_array(
        self, value: list[Any], schema: Schema, path: str, old: Any, causes: list[Cause]
    ) -> None:
        max_items, min_items = schema.get("maxItems"), schema.get("minItems")
        if max_items is not None and len(value) > max_items:
            causes.append(
                Cause(
                    "FieldValueTooMany",
                    f"Too many: {len(value)}: must have at most {max_items} items",
                    path,
                )
            )
        if min_items is not None and len(value) < min_items:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {len(value)}: {path} in body should have at least "
                    f"{min_items} items",
                    path,
                )
            )
        self._check_list_type(value, schema, path, causes)
        items = schema.get("items")
        if not isinstance(items, Mapping):
            return
        keys = _list_keys(schema)
        old_items: dict[Any, Any] = {}
        if keys and isinstance(old, list):
            old_items = {_item_key(item, keys): item for item in old}
        for index, item in enumerate(value):
            old_item = old_items.get(_item_key(item, keys), _MISSING) if keys else _MISSING
            self._check(item, items, f"{path}[{index}]", old_item, causes)

    def _check_list_type(
        self, value: list[Any], schema: Schema, path: str, causes: list[Cause]
    ) -> None:
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            seen: set[str] = set()
            for index, item in enumerate(value):
                encoded = json.dumps(item, sort_keys=True)
                if encoded in seen:
                    causes.append(
                        Cause(
                            "FieldValueDuplicate",
                            f"Duplicate value: {_show(item)}",
                            f"{path}[{index}]",
                        )
                    )
                seen.add(encoded)
        keys = _list_keys(schema)
        if keys:
            seen_keys: set[Any] = set()
            for index, item in enumerate(value):
                key = _item_key(item, keys)
                if key in seen_keys:
                    shown = {k: item.get(k) for k in keys} if isinstance(item, dict) else item
                    causes.append(
                        Cause(
                            "FieldValueDuplicate",
                            f"Duplicate value: {json.dumps(shown)}",
                            f"{path}[{index}]",
                        )
                    )
                seen_keys.add(key)

    # -- CEL -------------------------------------------------------------------------------

    def _rules(self, value: Any, schema: Schema, path: str, old: Any, causes: list[Cause]) -> None:
        rules = schema.get("x-kubernetes-validations")
        if not rules:
            return
        cel_self: Any = None
        cel_old = None
        encoded = _encoded(value)
        pair: bytes | None = None  # value and old value, once a transition rule asks
        pair_known = False
        for rule in rules:
            text = rule["rule"]
            transition = "oldSelf" in text
            if transition and old is _MISSING and not rule.get("optionalOldSelf"):
                continue
            if not transition:
                key = None if encoded is None else (text, encoded)
            else:
                if not pair_known:
                    pair, pair_known = _encoded_pair(encoded, old), True
                key = None if pair is None else (text, pair)
            if key is not None and _VERDICTS.get(key, _MISSING) is None:
                continue  # held for this very value before
            if cel_self is None:
                cel_self = json_to_cel(value)
            activation = {"self": cel_self}
            if transition:
                if cel_old is None:
                    cel_old = json_to_cel(old)
                activation["oldSelf"] = cel_old
            failure = _evaluate(text, activation)
            if failure is None:
                if key is not None:
                    _remember(key)
                continue
            causes.append(_rule_cause(rule, activation, value, path, failure))


#: ``(rule, value as sorted JSON)`` of rules without ``oldSelf`` that held:
#: such a rule's verdict depends on the value alone, and the interpreter
#: (celpy) took most of a Kueue object's write (a ClusterQueue, rewritten
#: with every quota change, evaluates dozens of rules on mostly unchanged
#: parts). A transition rule's verdict depends on the value and the old one
#: alone (its activation holds nothing else): remembered by both, NUL apart
#: (JSON text never holds a raw NUL). Bounded: emptied when full.
_VERDICTS: dict[tuple[str, bytes], None] = {}
_VERDICTS_MAX = 16384


def _encoded(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON as orjson writes it: evaluated every time
        return None


def _encoded_pair(encoded: bytes | None, old: Any) -> bytes | None:
    """The key part of a transition rule: value and old value (``None``: not remembered,
    as when there is no old value, which ``optionalOldSelf`` rules are evaluated without)."""
    if encoded is None or old is _MISSING:
        return None
    encoded_old = _encoded(old)
    return None if encoded_old is None else encoded + b"\x00" + encoded_old


def _remember(key: tuple[str, bytes]) -> None:
    if len(_VERDICTS) >= _VERDICTS_MAX:
        _VERDICTS.clear()
    _VERDICTS[key] = None


_MISSING: Any = object()
_DROP: Any = object()


def _evaluate(rule: str, activation: dict[str, Any]) -> str | None:
    """``None`` when the rule holds; else why not (``""`` for plain false)."""
    try:
        result = _cel_program(rule).evaluate(activation)
    except Exception as error:
        return f"evaluation error: {error}"
    if isinstance(result, Exception):
        return f"evaluation error: {result}"
    return None if bool(result) is True else ""


def _rule_cause(
    rule: Mapping[str, Any], activation: dict[str, Any], value: Any, path: str, failure: str
) -> Cause:
    message = rule.get("message") or f"failed rule: {rule['rule']}"
    if rule.get("messageExpression"):
        try:
            rendered = _cel_program(rule["messageExpression"]).evaluate(activation)
            if isinstance(rendered, str) and rendered.strip():
                message = str(rendered)
        except Exception:
            pass
    if failure:
        message = f"{message}: {failure}"
    field = path
    if rule.get("fieldPath"):
        field = path + rule["fieldPath"] if path else rule["fieldPath"].lstrip(".")
    reason = rule.get("reason") or "FieldValueInvalid"
    match reason:
        case "FieldValueRequired":
            text = f"Required value: {message}"
        case "FieldValueForbidden":
            text = f"Forbidden: {message}"
        case "FieldValueDuplicate":
            text = f"Duplicate value: {message}"
        case _:
            text = f"Invalid value: {_show(value)}: {message}"
    return Cause(reason, text, field or "<nil>")


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _is_datetime(value: str) -> bool:
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True
