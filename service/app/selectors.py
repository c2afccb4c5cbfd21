"""Kubernetes label and field selectors, compiled to SQL over the read model."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, func, not_, or_

from service.app.errors import Invalid
from service.projections.schema import resources

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"[A-Za-z0-9]?([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^)]*)\)$")
_EQ = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^(!?)({_KEY})$")


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[tuple[str, str, tuple[str, ...]], ...]

    @classmethod
    def parse(cls, selector: str) -> LabelSelector:
        requirements = []
        for part in _split(selector):
            if m := _SET.match(part):
                values = tuple(v.strip() for v in m.group(4).split(",") if v.strip())
                requirements.append((m.group(1), m.group(3), values))
            elif m := _EQ.match(part):
                op = "!=" if m.group(3) == "!=" else "="
                requirements.append((m.group(1), op, (m.group(4),)))
            elif m := _EXISTS.match(part):
                requirements.append((m.group(2), "!" if m.group(1) else "exists", ()))
            else:
                raise Invalid("bad label selector", [("labelSelector", f"cannot parse {part!r}")])
        return cls(tuple(requirements))

    def where(self, query: Select[Any], column: Any) -> Select[Any]:
        for key, op, values in self.requirements:
            has = column.has_key(key)
            value = column[key].astext
            condition: ColumnElement[bool]
            if op == "=":
                condition = value == values[0]
            elif op == "!=":
                condition = or_(not_(has), value != values[0])
            elif op == "in":
                condition = value.in_(values)
            elif op == "notin":
                condition = or_(not_(has), value.not_in(values))
            elif op == "exists":
                condition = has
            else:
                condition = not_(has)
            query = query.where(condition)
        return query


@dataclass(frozen=True)
class Matched:
    """A field matched by a condition of its own rather than one column."""

    condition: Callable[[str], ColumnElement[bool]]


FIELDS: dict[str, Any] = {
    "metadata.name": resources.c.name,
    "metadata.namespace": resources.c.namespace,
}
WORKLOAD_FIELDS: dict[str, Any] = {
    "spec.queueName": resources.c.spec["queueName"].astext,
    "spec.priorityClassName": resources.c.spec["priorityClassName"].astext,
    "status.state": resources.c.status["state"].astext,
    "status.clusterQueue": resources.c.status["clusterQueue"].astext,
    "status.admission.cluster": Matched(
        lambda value: or_(
            func.coalesce(resources.c.status["admission"]["cluster"].astext, "") == value,
            # A serving workload's units: any replica admitted to that cluster.
            resources.c.status.contains({"replicaAdmissions": [{"admission": {"cluster": value}}]}),
        )
    ),
}


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[tuple[Any, str, str], ...]

    @classmethod
    def parse(cls, selector: str, kind: str) -> FieldSelector:
        known = FIELDS | (WORKLOAD_FIELDS if kind == "Workload" else {})
        requirements = []
        for part in _split(selector):
            m = re.match(r"^([A-Za-z.]+)\s*(==|=|!=)\s*(.*)$", part)
            if not m:
                raise Invalid("bad field selector", [("fieldSelector", f"cannot parse {part!r}")])
            if m.group(1) not in known:
                raise Invalid(
                    "bad field selector",
                    [("fieldSelector", f"field {m.group(1)} is not supported: {sorted(known)}")],
                )
            requirements.append(
                (known[m.group(1)], "!=" if m.group(2) == "!=" else "=", m.group(3))
            )
        return cls(tuple(requirements))

    def where(self, query: Select[Any]) -> Select[Any]:
        for column, op, value in self.requirements:
            if isinstance(column, Matched):
                matched = column.condition(value)
                query = query.where(not_(matched) if op == "!=" else matched)
                continue
            query = query.where(column != value if op == "!=" else column == value)
        return query


__all__ = ["FieldSelector", "LabelSelector"]
