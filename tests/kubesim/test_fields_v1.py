"""managedFields' fieldsV1 encoding is remembered per field set; what it
hands out is always a copy of its own."""

from __future__ import annotations

import json
from typing import Any

from sim.kubesim.fieldmanager import Shape, _item_element, _leaf, from_fields_v1, to_fields_v1

PATHS = {
    ("f:metadata", "f:labels", "f:app"),
    ("f:spec", "f:replicas"),
    ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"main"}', "f:image"),
}


def test_fields_v1_round_trips() -> None:
    tree = to_fields_v1(PATHS)
    assert tree["f:spec"]["f:replicas"] == {}
    assert from_fields_v1(tree) == PATHS
    assert from_fields_v1({"f:a": {"f:b": {}}}, ("f:root",)) == {("f:root", "f:a", "f:b")}


def test_encodings_handed_out_are_copies() -> None:
    first = to_fields_v1(PATHS)
    first["f:spec"]["f:replicas"]["f:mutated"] = {}
    first.pop("f:metadata")
    second = to_fields_v1(set(PATHS))
    assert second == to_fields_v1(sorted(PATHS)) and "f:metadata" in second
    assert second["f:spec"]["f:replicas"] == {}


def test_decodings_handed_out_are_copies() -> None:
    tree = to_fields_v1(PATHS)
    first = from_fields_v1(tree)
    first.add(("f:spec", "f:other"))
    assert from_fields_v1(tree) == PATHS


def _tree(paths: set[tuple[str, ...]]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    return tree


def test_a_remembered_encoding_equals_a_fresh_one() -> None:
    assert to_fields_v1(PATHS) == _tree(PATHS)
    assert to_fields_v1(PATHS) == _tree(PATHS)  # the second, from the cache
    assert list(to_fields_v1(PATHS)) == sorted(_tree(PATHS))


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


LEAVES = [0, 1, -7, 2**70, 1.0, 0.5, True, False, None, "1", "true", "", [1, "a"], {"b": 1}]


def test_leaves_compare_as_their_json_does() -> None:
    for value in LEAVES:
        expected = "\x00" + value if isinstance(value, str) else _json(value)
        assert _leaf(value) == expected, value
    assert len({_leaf(v) for v in LEAVES}) == len(LEAVES)


def test_list_elements_are_their_json_whether_remembered_or_not() -> None:
    keyed = Shape(list_type="map", list_keys=("protocol", "containerPort"))
    items: list[Any] = [
        {"containerPort": 80, "protocol": "TCP"},
        {"containerPort": 80, "protocol": "TCP", "name": "web"},
        {"containerPort": True, "protocol": "TCP"},
        {"containerPort": 80.0, "protocol": "TCP"},
        {"containerPort": "é", "protocol": None},
        {"containerPort": {"nested": 1}},
    ]
    for item in items * 2:
        keys = {k: item[k] for k in ("containerPort", "protocol") if k in item}
        assert _item_element(item, keyed) == "k:" + _json(keys)
    as_set = Shape(list_type="set")
    for value in ["a", "é", 1, True, None] * 2:
        assert _item_element(value, as_set) == "v:" + _json(value)
