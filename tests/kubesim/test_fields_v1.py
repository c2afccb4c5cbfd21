"""managedFields' fieldsV1 encoding is remembered per field set; what it
hands out is always a copy of its own."""

from __future__ import annotations

import json
from typing import Any

from sim.kubesim.api import APPLY_PATCH, MERGE_PATCH, Context
from sim.kubesim.cluster import ClusterOptions, SimCluster
from sim.kubesim.fieldpath import Shape, from_fields_v1, item_element, leaf, to_fields_v1

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


LEAVES = [0, 1, -7, 2**70, 1.0, 0.5, True, False, None, "1", "true", "", [1, "a"], {"b": 1}, {}, []]


def test_leaves_compare_as_their_json_does() -> None:
    for value in LEAVES:
        expected = "\x00" + value if isinstance(value, str) else _json(value)
        assert leaf(value) == expected, value
    assert len({leaf(v) for v in LEAVES}) == len(LEAVES)


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
        assert item_element(item, keyed) == "k:" + _json(keys)
    as_set = Shape(list_type="set")
    for value in ["a", "é", 1, True, None] * 2:
        assert item_element(value, as_set) == "v:" + _json(value)


def _job(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "owned", "labels": labels},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "b:1"}]}
            },
        },
    }


def _entry(obj: dict[str, Any], manager: str) -> dict[str, Any]:
    entries = [e for e in obj["metadata"]["managedFields"] if e["manager"] == manager]
    assert len(entries) == 1
    return entries[0]


def _fresh(tree: dict[str, Any]) -> dict[str, Any]:
    return _tree(_paths(tree))


def _paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for element, child in tree.items():
        out |= _paths(child, (*prefix, element)) if child else {(*prefix, element)}
    return out


def _kubelet_reports_active(core: Any, jobs: Any) -> dict[str, Any]:
    """A status-only merge patch of Job ``default/owned`` by another manager."""
    patched: dict[str, Any] = core.patch(
        jobs,
        "default",
        "owned",
        MERGE_PATCH,
        {"status": {"active": 1}},
        Context(manager="kubelet"),
        subresource="status",
    )
    return patched


def test_entries_a_write_leaves_alone_keep_their_tree_and_changed_ones_are_re_encoded() -> None:
    cluster = SimCluster(ClusterOptions(name="owned", controllers=False))
    core, jobs = cluster.core, cluster.core.resource("batch", "v1", "jobs")
    applied = core.patch(
        jobs, "default", "owned", APPLY_PATCH, _job({"a": "1", "b": "1"}), Context(manager="qm")
    )
    tree = _entry(applied, "qm")["fieldsV1"]
    patched = _kubelet_reports_active(core, jobs)
    kept = _entry(patched, "qm")["fieldsV1"]
    assert kept == _fresh(kept) and list(kept) == sorted(kept)
    assert kept == tree
    labelled = core.patch(
        jobs,
        "default",
        "owned",
        MERGE_PATCH,
        {"metadata": {"labels": {"a": "2"}}},
        Context(manager="other"),
    )
    taken = _entry(labelled, "qm")["fieldsV1"]
    assert "f:a" not in taken["f:metadata"]["f:labels"]
    assert taken == _fresh(taken) and _entry(labelled, "other")["fieldsV1"] == {
        "f:metadata": {"f:labels": {"f:a": {}}}
    }
    assert "f:a" in tree["f:metadata"]["f:labels"], "the old version's tree changed"


def test_a_tree_not_in_our_order_is_written_in_our_order_by_the_next_write() -> None:
    cluster = SimCluster(ClusterOptions(name="order", controllers=False))
    core, jobs = cluster.core, cluster.core.resource("batch", "v1", "jobs")
    body = _job({"a": "1"})
    reversed_tree = {"f:spec": {"f:suspend": {}}, "f:metadata": {"f:labels": {"f:a": {}}}}
    body["metadata"]["managedFields"] = [
        {
            "manager": "import",
            "operation": "Update",
            "apiVersion": "batch/v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": reversed_tree,
        }
    ]
    created = core.create(jobs, "default", body, Context(manager="import"))
    assert list(_entry(created, "import")["fieldsV1"]) == ["f:spec", "f:metadata"]
    patched = _kubelet_reports_active(core, jobs)
    assert list(_entry(patched, "import")["fieldsV1"]) == ["f:metadata", "f:spec"]
