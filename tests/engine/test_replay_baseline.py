"""The best-fit baseline of the replay: island first, gangs whole, FIFO with backfill."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from service.domain.inventory import Node
from service.domain.workload import (
    Admission,
    AdmittedWorkload,
    PodSet,
    PodSetAssignment,
    TopologyRequest,
    Workload,
)
from service.engine import EngineConfig, Snapshot
from sim.cli import app as sim_app
from sim.fleet import Fleet, fleet_from_mapping
from sim.replay import ReplayOptions, Simulator, TraceJob
from sim.replay.baseline import best_fit_cycle
from sim.replay.loop import fifo_options, single_queue_fleet

GPU = "nvidia.com/gpu"
FLEET = Path(__file__).resolve().parents[2] / "sim" / "fleets" / "itp-cluster04.yaml"


def _nodes() -> tuple[Node, ...]:
    """One cluster, islands i0 and i1 of two 8-GPU nodes each."""
    return tuple(
        Node(f"{island}-n{n}", "c1", "gpu", island, {GPU: 8})
        for island in ("i0", "i1")
        for n in range(2)
    )


def _job(name: str, gpus: int, at: float = 0.0, queued_at: float | None = None) -> Workload:
    pods, per_pod = (gpus // 8, 8) if gpus > 8 else (1, gpus)
    topology = TopologyRequest("required") if pods > 1 else None
    pod_set = PodSet("main", pods, {GPU: per_pod}, topology_request=topology)
    return Workload("team", name, "jobs", (pod_set,), creation_time=at, queued_at=queued_at)


def _holding(name: str, node: str, gpus: int) -> AdmittedWorkload:
    workload = _job(name, gpus)
    assignment = PodSetAssignment("main", 1, {GPU: "gpu"}, {GPU: gpus}, ((node, 1),), ())
    return AdmittedWorkload(workload, Admission("best-fit", "c1", (assignment,)))


def _placed(snapshot: Snapshot) -> dict[str, tuple[tuple[str, int], ...]]:
    result = best_fit_cycle(snapshot, 100.0)
    return {d.workload: d.admission.pod_set_assignments[0].placement for d in result.admissions}


def test_a_single_pod_goes_to_the_fullest_island_that_holds_it_not_the_fullest_node() -> None:
    # i0: n0 has 2 free, n1 8 (10 free); i1: both nodes 4 free (8 free).
    # The least-free node anywhere is i0-n0; island first picks i1, then its
    # least-free node (a tie, broken by name), and keeps i0's whole node.
    admitted = (
        _holding("a", "i0-n0", 6),
        _holding("b", "i1-n0", 4),
        _holding("c", "i1-n1", 4),
    )
    snapshot = Snapshot(
        cluster_queues=(), nodes=_nodes(), admitted=admitted, pending=(_job("x", 2),)
    )
    assert _placed(snapshot) == {"team/x": (("i1-n0", 1),)}


def test_a_gang_never_spans_islands_and_the_queue_backfills() -> None:
    # One whole node free in each island: 16 GPUs free, but no island holds
    # a 2 x 8 gang. The 8-GPU job behind it starts (backfill), in queue order
    # the re-queued job (queued at 50 s) after the one submitted at 10 s.
    admitted = (_holding("a", "i0-n0", 8), _holding("b", "i1-n1", 8))
    pending = (
        _job("late", 8, at=0.0, queued_at=50.0),
        _job("gang", 16, at=5.0),
        _job("early", 8, at=10.0),
    )
    snapshot = Snapshot(cluster_queues=(), nodes=_nodes(), admitted=admitted, pending=pending)
    result = best_fit_cycle(snapshot, 100.0)
    assert [d.workload for d in result.admissions] == ["team/early", "team/late"]
    assert {d.admission.pod_set_assignments[0].islands for d in result.admissions} == {
        ("i0",),
        ("i1",),
    }


def test_a_gang_lands_whole_in_the_fullest_island_that_holds_it() -> None:
    nodes = _nodes() + tuple(Node(f"i2-n{n}", "c1", "gpu", "i2", {GPU: 8}) for n in range(2))
    admitted = (_holding("a", "i1-n0", 1),)
    snapshot = Snapshot(cluster_queues=(), nodes=nodes, admitted=admitted, pending=(_job("g", 8),))
    assert _placed(snapshot) == {"team/g": (("i1-n1", 1),)}
    snapshot = Snapshot(cluster_queues=(), nodes=nodes, admitted=admitted, pending=(_job("g", 16),))
    assert _placed(snapshot) == {"team/g": (("i0-n0", 1), ("i0-n1", 1))}


def test_sim_replay_runs_every_baseline_beside_the_engine(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    lines = ["job_id,submission_time,duration,num_gpu"]
    lines += [f"job-{i},{i * 30},{600 + i * 17},{(1, 8, 16, 64, 1, 2)[i % 6]}" for i in range(60)]
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "result.json"
    args = ["replay", "--trace", str(trace), "--fleet", str(FLEET), "--out", str(out)]
    args += ["--baseline", "best-fit", "--baseline", "single-queue", "--baseline", "fifo"]
    outcome = CliRunner().invoke(sim_app, args)
    assert outcome.exit_code == 0, outcome.output
    result = json.loads(out.read_text(encoding="utf-8"))
    assert list(result["baselines"]) == ["best-fit", "single-queue", "fifo"]
    assert result["baseline"] == result["baselines"]["best-fit"]
    for name, data in result["baselines"].items():
        assert data["scheduler"] == name
        assert data["completed"] == 60
        assert data["island_violations"] == data["capacity_violations"] == 0
        assert data["preemptions"] == 0


def _two_cluster_fleet() -> Fleet:
    """Two clusters of two and three islands of four 8-GPU nodes, one team per queue."""
    groups = {"a": 2, "b": 3}
    return fleet_from_mapping(
        {
            "topologies": [{"name": "fabric", "levels": ["example.com/block"]}],
            "resourceFlavors": [{"name": "gpu", "topologyName": "fabric"}],
            "clusters": [
                {
                    "name": name,
                    "nodeGroups": [
                        {
                            "flavor": "gpu",
                            "islands": islands,
                            "nodesPerIsland": 4,
                            "allocatable": {GPU: 8},
                        }
                    ],
                }
                for name, islands in groups.items()
            ],
            "clusterQueues": [
                {
                    "name": team,
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": [GPU],
                            "flavors": [
                                {"name": "gpu", "resources": [{"name": GPU, "nominalQuota": 80}]}
                            ],
                        }
                    ],
                }
                for team in ("alpha", "beta")
            ],
            "localQueues": [
                {"namespace": team, "name": "jobs", "clusterQueue": team}
                for team in ("alpha", "beta")
            ],
        }
    )


def _random_trace(seed: int, count: int) -> list[TraceJob]:
    rng = random.Random(seed)
    sizes = (1, 1, 1, 1, 2, 4, 8, 8, 16, 32)
    at = 0.0
    jobs = []
    for i in range(count):
        at += rng.expovariate(1 / 120)
        jobs.append(TraceJob(f"j{i}", round(at), rng.randint(60, 7200), rng.choice(sizes)))
    return jobs


@pytest.mark.parametrize("seed", [1, 2])
def test_the_engine_on_one_queue_decides_as_the_best_fit_baseline(seed: int) -> None:
    # Island-first packing (and equally free nodes filled by name) is the
    # baseline's placement; on one BestEffortFIFO queue without quotas every
    # job starts at the same time under both. With the placement before
    # (ClusterFirst) the starts differ.
    fleet, jobs = single_queue_fleet(_two_cluster_fleet()), _random_trace(seed, 200)

    def starts(options: ReplayOptions, policy: Any = None) -> dict[str, float]:
        simulator = Simulator(fleet, jobs, options, policy)
        simulator.run()
        return simulator.stats.first_admission

    engine = fifo_options(ReplayOptions(cycle_interval=30))
    baseline = starts(ReplayOptions(cycle_interval=30), best_fit_cycle)
    assert len(baseline) == len(jobs)
    assert starts(engine) == baseline
    before = replace(engine, engine=EngineConfig(spread_packing="ClusterFirst"))
    before = fifo_options(before)
    assert starts(before) != baseline
