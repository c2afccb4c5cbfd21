from collections import Counter
from pathlib import Path

import pytest

from service.domain.inventory import HOSTNAME_LABEL
from sim.fleet import FleetError, load_fleet

DEMO = Path(__file__).resolve().parents[2] / "sim" / "fleets" / "demo.yaml"


def test_demo_fleet_expands_to_deterministic_nodes() -> None:
    fleet = load_fleet(DEMO)
    nodes = list(fleet.nodes())
    assert [n.name for n in nodes] == [n.name for n in load_fleet(str(DEMO)).nodes()]
    assert len({n.name for n in nodes}) == len(nodes) == 8 + 4 + 6 + 8 + 6 + 4
    gpus = Counter()
    for node in nodes:
        gpus[node.flavor] += node.allocatable["nvidia.com/gpu"]
    assert gpus == {"h100": 112, "a100": 176}
    first = nodes[0]
    assert first.name == "east-1-h100-i0-n0"
    assert first.island == "east-1-h100-i0"
    assert first.labels == {
        "example.com/gpu": "h100",
        "example.com/fabric-block": "east-1-h100-i0",
        HOSTNAME_LABEL: "east-1-h100-i0-n0",
    }
    assert first.allocatable == {"cpu": 96_000, "memory": 2**40, "nvidia.com/gpu": 8}
    assert [t.key for t in first.taints] == ["example.com/gpu"]
    a100 = next(n for n in nodes if n.flavor == "a100")
    assert a100.taints == ()


def test_demo_fleet_queues_and_classes() -> None:
    fleet = load_fleet(DEMO)
    queues = {cq.name: cq for cq in fleet.cluster_queues}
    assert set(queues) == {"vision", "language", "serving"}
    assert queues["serving"].workload_class == "inference"
    assert queues["language"].fair_weight_milli == 2000
    assert queues["language"].queueing_strategy == "StrictFIFO"
    gpu = queues["vision"].resource_groups[0].flavors[0].resources["nvidia.com/gpu"]
    assert (gpu.nominal, gpu.borrowing_limit, gpu.lending_limit) == (48, 32, 16)
    assert queues["vision"].preemption.borrow_within_cohort.max_priority_threshold == 100
    assert {p.name: p.value for p in fleet.priority_classes}["critical"] == 1000
    assert fleet.namespaces["vision"] == {"team": "vision"}
    assert {lq.key for lq in fleet.local_queues} >= {"vision/default", "serving/default"}


def test_island_numbering_continues_across_groups_and_racks_fill_middle_levels() -> None:
    fleet = load_fleet(
        """
topologies:
  - {name: t, levels: [block, rack, kubernetes.io/hostname]}
resourceFlavors:
  - {name: gpu, topologyName: t}
clusters:
  - name: c
    nodeGroups:
      - {flavor: gpu, islands: 1, nodesPerIsland: 4, racksPerIsland: 2,
         allocatable: {nvidia.com/gpu: 8}}
      - {flavor: gpu, islands: 1, nodesPerIsland: 2, allocatable: {nvidia.com/gpu: 4}}
"""
    )
    nodes = list(fleet.nodes())
    assert [n.name for n in nodes][-2:] == ["c-gpu-i1-n0", "c-gpu-i1-n1"]
    assert [n.labels["rack"] for n in nodes[:4]] == ["c-gpu-i0-r0"] * 2 + ["c-gpu-i0-r1"] * 2
    assert nodes[-1].allocatable == {"nvidia.com/gpu": 4}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "clusters: [{name: c, nodeGroups: [{flavor: x, nodesPerIsland: 1, allocatable: {}}]}]",
            "unknown flavor",
        ),
        ("resourceFlavors: [{name: f, topologyName: nope}]", "unknown topology"),
        ("clusterQueues: [{name: q, queueingStrategy: LIFO}]", "queueingStrategy"),
        ("localQueues: [{name: l, namespace: n, clusterQueue: missing}]", "unknown cluster queue"),
        ("- just a list", "mapping"),
    ],
)
def test_bad_fleets_are_rejected_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        load_fleet(text)
