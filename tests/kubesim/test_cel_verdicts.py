"""CEL rules of a CRD schema: a rule that does not name ``oldSelf`` is
evaluated once per value it held for, one naming it once per pair of value
and old value it held for; a rule that fails is evaluated (and refused)
every time."""

from __future__ import annotations

from typing import Any

import pytest

from sim.kubesim import schema
from sim.kubesim.schema import SchemaValidator

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "quota": {"type": "integer"},
                "limit": {"type": "integer"},
            },
            "x-kubernetes-validations": [
                {"rule": "self.quota <= self.limit", "message": "quota past the limit"},
                {"rule": "self.limit >= oldSelf.limit", "message": "the limit may only grow"},
            ],
        }
    },
}


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = schema._evaluate

    def counting(rule: str, activation: dict[str, Any]) -> str | None:
        seen.append(rule)
        return real(rule, activation)

    monkeypatch.setattr(schema, "_evaluate", counting)
    monkeypatch.setattr(schema, "_VERDICTS", {})
    return seen


def _obj(quota: int, limit: int) -> dict[str, Any]:
    return {"apiVersion": "x/v1", "kind": "X", "spec": {"quota": quota, "limit": limit}}


def test_a_rule_that_held_for_a_value_is_not_evaluated_again(evaluations: list[str]) -> None:
    validator = SchemaValidator(SCHEMA)
    assert validator.validate(_obj(1, 4), None) == []
    assert validator.validate(_obj(1, 4), None) == []
    assert evaluations == ["self.quota <= self.limit"]
    assert validator.validate(_obj(2, 4), None) == []  # another value: evaluated
    assert evaluations.count("self.quota <= self.limit") == 2


def test_a_failing_rule_is_refused_every_time(evaluations: list[str]) -> None:
    validator = SchemaValidator(SCHEMA)
    for _ in range(2):
        (cause,) = validator.validate(_obj(5, 4), None)
        assert "quota past the limit" in cause.message
    assert evaluations == ["self.quota <= self.limit"] * 2


def test_a_transition_rule_is_evaluated_against_each_old_value(evaluations: list[str]) -> None:
    validator = SchemaValidator(SCHEMA)
    assert validator.validate(_obj(1, 4), _obj(1, 4)) == []
    (cause,) = validator.validate(_obj(1, 4), _obj(1, 8))
    assert "the limit may only grow" in cause.message
    assert evaluations.count("self.limit >= oldSelf.limit") == 2


def test_a_transition_rule_that_held_for_a_pair_is_not_evaluated_again(
    evaluations: list[str],
) -> None:
    validator = SchemaValidator(SCHEMA)
    for _ in range(3):
        assert validator.validate(_obj(1, 8), _obj(1, 4)) == []
    assert evaluations.count("self.limit >= oldSelf.limit") == 1
    assert validator.validate(_obj(1, 8), _obj(1, 8)) == []  # another old value
    assert validator.validate(_obj(1, 4), _obj(1, 4)) == []  # another value
    assert evaluations.count("self.limit >= oldSelf.limit") == 3
    for _ in range(2):
        (cause,) = validator.validate(_obj(1, 4), _obj(1, 8))
        assert "the limit may only grow" in cause.message
    assert evaluations.count("self.limit >= oldSelf.limit") == 5
