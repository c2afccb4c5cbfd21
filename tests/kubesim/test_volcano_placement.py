"""Where a gang fits (``sim.kubesim.controllers.volcano.placement``), on plain data:
all or nothing, the tightest tier-1 domain, and how HyperNodes select their nodes."""

from __future__ import annotations

from typing import Any

from sim.kubesim.controllers.volcano.placement import NodeRoom, domains, place_gang

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"


def _node(name: str, island: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"example.com/fabric-block": island}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _pod(name: str, gpus: int = 8) -> Obj:
    requests = {"requests": {GPU: str(gpus)}}
    return {"metadata": {"name": name}, "spec": {"containers": [{"resources": requests}]}}


def _rooms(free_gpus: dict[str, int]) -> list[NodeRoom]:
    """Nodes ``<island>-n<k>`` with the given free GPUs each."""
    return [
        NodeRoom(_node(name, name.rsplit("-", 1)[0]), {GPU: gpus, "pods": 110})
        for name, gpus in free_gpus.items()
    ]


def test_a_gang_that_does_not_fit_whole_places_nothing_and_changes_nothing() -> None:
    rooms = _rooms({"a-n0": 8, "a-n1": 8, "a-n2": 8})
    before = [dict(room.free) for room in rooms]
    placement = place_gang([_pod(f"p{i}") for i in range(4)], rooms, None)
    assert not placement.complete
    assert placement.bound == {}
    assert placement.reasons["Insufficient nvidia.com/gpu"] == len(rooms)
    assert [room.free for room in rooms] == before

    three = place_gang([_pod(f"p{i}") for i in range(3)], rooms, None)
    assert three.complete
    assert sorted(three.bound.values()) == sorted(room.name for room in rooms)


def test_the_tightest_tier_one_domain_is_chosen_and_a_gang_never_spans_two() -> None:
    rooms = _rooms({"a-n0": 8, "a-n1": 8, "a-n2": 8, "b-n0": 8, "b-n1": 8})
    islands = domains([], [room.node for room in rooms], ["example.com/fabric-block"])
    assert {d.name: len(d.nodes) for d in islands} == {"a": 3, "b": 2}

    pair = place_gang([_pod("p0"), _pod("p1")], rooms, islands)
    assert pair.domain == "b"  # fits both; b leaves no GPU idle
    assert sorted(pair.bound.values()) == ["b-n0", "b-n1"]

    four = place_gang([_pod(f"p{i}") for i in range(4)], rooms, islands)
    assert not four.complete  # five free nodes, but no island has four


def test_hypernodes_select_nodes_by_exact_name_regex_and_labels() -> None:
    nodes = [_node(name, name[0]) for name in ("a-n0", "a-n1", "b-n0", "b-n1")]
    hypernodes = [
        {
            "metadata": {"name": "exact"},
            "spec": {"tier": 1, "members": [{"selector": {"exactMatch": {"name": "a-n0"}}}]},
        },
        {
            "metadata": {"name": "regex"},
            "spec": {"tier": 1, "members": [{"selector": {"regexMatch": {"pattern": ".*-n1"}}}]},
        },
        {
            "metadata": {"name": "labels"},
            "spec": {
                "tier": 1,
                "members": [
                    {
                        "type": "Node",
                        "selector": {
                            "labelMatch": {"matchLabels": {"example.com/fabric-block": "b"}}
                        },
                    }
                ],
            },
        },
        {"metadata": {"name": "spine"}, "spec": {"tier": 2, "members": []}},
    ]
    found = {d.name: sorted(d.nodes) for d in domains(hypernodes, nodes, ["ignored"])}
    assert found == {"exact": ["a-n0"], "regex": ["a-n1", "b-n1"], "labels": ["b-n0", "b-n1"]}
