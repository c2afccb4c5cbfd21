"""managedFields' fieldsV1 encoding is remembered per field set; what it
hands out is always a copy of its own."""

from __future__ import annotations

from sim.kubesim.fieldmanager import from_fields_v1, to_fields_v1

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
