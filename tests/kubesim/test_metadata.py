"""ValidateObjectMeta's label and annotation checks: the same verdicts every time
(the verdict per key and value is remembered)."""

from __future__ import annotations

import pytest

from sim.kubesim.builtin import validate_metadata

GOOD_KEYS = ["app", "example.com/gpu", "a.b-c_d", "x" * 63, "k8s.io/" + "y" * 63]
BAD_KEYS = ["", "-app", "app-", "Example.com/x", "example.com/", "/app", "x" * 64, "a/b/c"]
GOOD_VALUES = ["", "v1", "a.b-c_d", "z" * 63]
BAD_VALUES = ["-v", "v-", "a b", "z" * 64, "é"]


def _causes(labels: dict[str, object], annotations: dict[str, object]) -> list[tuple[str, str]]:
    obj = {"metadata": {"name": "ok", "labels": labels, "annotations": annotations}}
    return [(c.field, c.message) for c in validate_metadata(obj)]


@pytest.mark.parametrize("attempt", [1, 2])
def test_label_and_annotation_keys_and_values(attempt: int) -> None:
    assert _causes({k: "v" for k in GOOD_KEYS}, {k: "x y" for k in GOOD_KEYS}) == []
    assert _causes({f"app{i}": v for i, v in enumerate(GOOD_VALUES)}, {}) == []
    for key in BAD_KEYS:
        assert [f for f, _ in _causes({key: "v"}, {})] == ["metadata.labels"], key
        assert [f for f, _ in _causes({}, {key: "v"})] == ["metadata.annotations"], key
    for value in BAD_VALUES:
        assert [f for f, _ in _causes({"app": value}, {})] == ["metadata.labels[app]"], value
    assert [f for f, _ in _causes({"app": 1}, {"note": 2})] == [
        "metadata.labels[app]",
        "metadata.annotations",
    ]
