"""Label and field selectors, in the string form of ``?labelSelector=`` / ``?fieldSelector=``
and the object form (``matchLabels`` / ``matchExpressions``) used by specs.

Grammar and semantics follow ``k8s.io/apimachinery/pkg/labels`` and ``…/fields``:
``!=`` and ``notin`` match objects that lack the key; a field selector may only
name the fields a resource declares selectable, else the request is a 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.kubesim.errors import bad_request

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "match_selector_object",
    "parse_field_selector",
    "parse_label_selector",
]

_SET_REQUIREMENT = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s+(in|notin)\s*\((.*)\)\s*$")
_OPERATOR = re.compile(r"^\s*([^\s!=<>(),]+)\s*(==|=|!=|>|<)\s*([^\s,]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s*$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return present
            case "!":
                return not present
            case "=" | "in":
                return present and value in self.values
            case "!=" | "notin":
                return not present or value not in self.values
            case ">" | "<":
                return present and _compare_int(value, self.values[0], self.operator)
        return False


def _compare_int(value: str | None, bound: str, operator: str) -> bool:
    try:
        left, right = int(value or ""), int(bound)
    except ValueError:
        return False
    return left > right if operator == ">" else left < right


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _parse_requirement(text: str) -> Requirement:
    if match := _SET_REQUIREMENT.match(text):
        values = tuple(v.strip() for v in match[4].split(",") if v.strip())
        return Requirement(match[2], match[3], values)
    if match := _OPERATOR.match(text):
        operator = "=" if match[2] == "==" else match[2]
        return Requirement(match[1], operator, (match[3],))
    if match := _EXISTS.match(text):
        return Requirement(match[2], "!" if match[1] else "exists")
    raise bad_request(f"unable to parse requirement: {text.strip()!r}")


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text:
        return LabelSelector()
    return LabelSelector(tuple(_parse_requirement(part) for part in _split_top_level(text)))


_EXPRESSION_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def match_selector_object(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Match a ``metav1.LabelSelector`` object; ``None`` matches nothing, ``{}`` everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        operator = _EXPRESSION_OPERATORS.get(expression.get("operator", ""))
        if operator is None:
            return False
        requirement = Requirement(
            expression["key"], operator, tuple(expression.get("values") or ())
        )
        if not requirement.matches(labels):
            return False
    return True


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    path: str
    value: str
    negate: bool


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(
        self, obj: Mapping[str, Any], getter: Callable[[Mapping[str, Any], str], str]
    ) -> bool:
        for requirement in self.requirements:
            equal = getter(obj, requirement.path) == requirement.value
            if equal == requirement.negate:
                return False
        return True

    def exact(self, path: str) -> str | None:
        """The value ``path`` must equal, if the selector pins it (used to narrow a watch)."""
        for requirement in self.requirements:
            if requirement.path == path and not requirement.negate:
                return requirement.value
        return None

    @property
    def empty(self) -> bool:
        return not self.requirements


def parse_field_selector(text: str | None, allowed: tuple[str, ...]) -> FieldSelector:
    if not text:
        return FieldSelector()
    requirements = []
    for part in _split_top_level(text):
        operator = next((op for op in ("!=", "==", "=") if op in part), None)
        if operator is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        path, _, value = part.partition(operator)
        negate = operator == "!="
        path = path.strip()
        if path not in allowed:
            raise bad_request(f"field label not supported: {path}")
        requirements.append(FieldRequirement(path, value.strip(), negate))
    return FieldSelector(tuple(requirements))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field, as the API server compares it (``""`` if absent)."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)
