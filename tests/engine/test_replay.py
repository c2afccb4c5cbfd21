"""The replay simulator: trace parsing, team hashing, the virtual-time loop and its metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sim.cli import app as sim_app
from sim.fleet import Fleet, fleet_from_mapping, load_fleet
from sim.replay import ReplayOptions, TraceJob, fifo_fleet, load_trace, replay, stable_team
from sim.replay.loop import fifo_options
from sim.replay.metrics import contended_jain, jain_index, percentile, weighted_max_min
from sim.replay.trace import TraceError

FLEETS = Path(__file__).resolve().parents[2] / "sim" / "fleets"


def small_fleet(islands: int = 2, nodes: int = 2, quotas: tuple[int, int] = (16, 16)) -> Fleet:
    """Two teams in one cohort on one cluster of ``islands`` x ``nodes`` x 8 GPUs."""
    queue = {
        "cohortName": "all",
        "namespaceSelector": {},
        "preemption": {"withinClusterQueue": "Never", "reclaimWithinCohort": "Any"},
    }
    return fleet_from_mapping(
        {
            "topologies": [{"name": "fabric", "levels": ["example.com/block"]}],
            "resourceFlavors": [{"name": "gpu", "topologyName": "fabric"}],
            "clusters": [
                {
                    "name": "c1",
                    "nodeGroups": [
                        {
                            "flavor": "gpu",
                            "islands": islands,
                            "nodesPerIsland": nodes,
                            "allocatable": {"nvidia.com/gpu": 8},
                        }
                    ],
                }
            ],
            "cohorts": [{"name": "all"}],
            "clusterQueues": [
                {
                    "name": team,
                    **queue,
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": "gpu",
                                    "resources": [{"name": "nvidia.com/gpu", "nominalQuota": q}],
                                }
                            ],
                        }
                    ],
                }
                for team, q in zip(("alpha", "beta"), quotas, strict=True)
            ],
            "localQueues": [
                {"namespace": "alpha", "name": "jobs", "clusterQueue": "alpha"},
                {"namespace": "beta", "name": "jobs", "clusterQueue": "beta"},
            ],
        }
    )


def job(name: str, at: float, duration: float, gpus: int, team: str | None = None) -> TraceJob:
    return TraceJob(name, at, duration, gpus, team=team)


def _stable_part(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("wall_s", "engine_s")}


# --- trace and team assignment -------------------------------------------------------------


def test_trace_is_read_in_submission_order(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,submission_time,duration,num_gpu,team,priority\n"
        "b,20,5,8,,\nA,10,7,1,beta,high\nc,15,1,16,alpha,3\n",
        encoding="utf-8",
    )
    jobs = load_trace(path)
    assert [j.job_id for j in jobs] == ["A", "c", "b"]
    assert jobs[0].team == "beta" and jobs[0].priority_class == "high"
    assert jobs[1].priority == 3 and jobs[2].team is None
    assert [j.job_id for j in load_trace(path, limit=2)] == ["A", "b"]


def test_trace_without_required_columns_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,duration,num_gpu\nx,1,1\n", encoding="utf-8")
    with pytest.raises(TraceError, match="submission_time"):
        load_trace(path)


def test_team_hash_is_stable_and_spreads_jobs() -> None:
    teams = ["team-c", "team-a", "team-b"]
    ids = [f"job-{i}" for i in range(3000)]
    first = [stable_team(i, teams) for i in ids]
    assert first == [stable_team(i, list(reversed(teams))) for i in ids]
    counts = {t: first.count(t) for t in teams}
    assert all(800 < c < 1200 for c in counts.values()), counts


# --- metrics -------------------------------------------------------------------------------


def test_metrics_helpers() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 95) == 5.0
    assert percentile([], 95) == 0.0
    share = weighted_max_min(100.0, {"a": 10.0, "b": 200.0, "c": 200.0}, {"a": 1, "b": 1, "c": 2})
    assert share["a"] == pytest.approx(10.0)
    assert share["c"] == pytest.approx(2 * share["b"])
    assert sum(share.values()) == pytest.approx(100.0)


def test_fairness_counts_only_contended_windows() -> None:
    weights = {"a": 1.0, "b": 1.0}
    # Both teams want 8 GPUs for the hour on a 8-GPU fleet; "a" gets them all.
    presence = [("a", 8, 0.0, 3600.0), ("b", 8, 0.0, 3600.0)]
    hog = [("a", 8, 0.0, 3600.0)]
    index, windows = contended_jain(hog, presence, weights, 8, 3600.0)
    assert windows == 1
    assert index == pytest.approx(0.5)
    shared = [("a", 4, 0.0, 3600.0), ("b", 4, 0.0, 3600.0)]
    assert contended_jain(shared, presence, weights, 8, 3600.0) == (pytest.approx(1.0), 1)
    # On a 16-GPU fleet nobody waits: no contended window, nothing to judge.
    assert contended_jain(hog, presence, weights, 16, 3600.0) == (1.0, 0)


# --- the loop ------------------------------------------------------------------------------


def test_a_job_waits_for_the_one_holding_the_gpus() -> None:
    fleet = small_fleet(islands=1, nodes=1, quotas=(8, 8))
    jobs = [job("first", 0, 1000, 8, "alpha"), job("second", 10, 500, 8, "alpha")]
    result = replay(fleet, jobs, ReplayOptions(cycle_interval=1))
    assert result["completed"] == 2
    # The second starts when the first ends (1000 s), 990 s after it was submitted.
    assert result["mean_wait_s"] == pytest.approx((0 + 990) / 2)
    assert result["makespan_s"] == pytest.approx(1500)
    assert result["gpu_utilization"] == pytest.approx(1.0)


def test_replay_is_deterministic_and_keeps_gangs_in_one_island() -> None:
    fleet = small_fleet(islands=3, nodes=2)
    jobs = [
        job(f"j{i}", at=i * 37.0, duration=600 + (i * 131) % 900, gpus=(1, 2, 4, 8, 16)[i % 5])
        for i in range(120)
    ]
    first = replay(fleet, jobs)
    second = replay(fleet, jobs)
    assert _stable_part(first) == _stable_part(second)
    assert first["completed"] == len(jobs) == first["admitted"]
    assert first["island_violations"] == 0
    assert first["capacity_violations"] == 0
    assert sum(first["team_gpu_hours"].values()) > 0
    for key in ("jobs", "makespan_s", "mean_wait_s", "p95_wait_s", "jain_fairness", "wall_s"):
        assert key in first


def test_a_team_reclaims_its_quota_from_a_borrower() -> None:
    fleet = small_fleet(islands=1, nodes=2, quotas=(8, 8))
    jobs = [
        job("greedy-1", 0, 10_000, 8, "alpha"),
        job("greedy-2", 0, 10_000, 8, "alpha"),
        job("owner", 100, 100, 8, "beta"),
    ]
    result = replay(fleet, jobs, ReplayOptions(cycle_interval=10))
    assert result["preemptions"] == 1
    assert result["lost_gpu_hours"] > 0
    assert result["completed"] == 3
    fifo = replay(fifo_fleet(fleet), jobs, fifo_options(ReplayOptions(cycle_interval=10)))
    assert fifo["preemptions"] == 0
    assert fifo["mean_wait_s"] > result["mean_wait_s"]


def test_fifo_baseline_blocks_behind_the_head_of_line() -> None:
    fleet = small_fleet(islands=1, nodes=2, quotas=(8, 8))
    jobs = [
        job("running", 0, 1000, 8, "alpha"),
        job("big", 10, 100, 16, "alpha"),
        job("small", 20, 100, 8, "beta"),
    ]
    ours = replay(fleet, jobs, ReplayOptions(cycle_interval=1))
    fifo = replay(fifo_fleet(fleet), jobs, fifo_options(ReplayOptions(cycle_interval=1)))
    assert ours["completed"] == fifo["completed"] == 3
    # Ours starts "small" at once beside the waiting gang; FIFO holds it until
    # "big" has run: 0 + 990 + 0 against 0 + 990 + 1080 seconds of waiting.
    assert ours["mean_wait_s"] == pytest.approx(990 / 3)
    assert fifo["mean_wait_s"] == pytest.approx((990 + 1080) / 3)


def test_jobs_that_can_never_fit_end_the_replay() -> None:
    fleet = small_fleet(islands=1, nodes=1, quotas=(8, 8))
    result = replay(fleet, [job("huge", 0, 10, 64, "alpha"), job("ok", 0, 10, 1, "beta")])
    assert result["completed"] == 1
    assert result["never_admitted"] == 1


# --- the command ---------------------------------------------------------------------------


def test_sim_replay_command_writes_result_with_baseline(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    lines = ["job_id,submission_time,duration,num_gpu"]
    lines += [f"job-{i},{i * 60},{300 + i * 7},{(1, 8, 16, 64)[i % 4]}" for i in range(40)]
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "result.json"
    fleet = FLEETS / "itp-cluster04.yaml"
    load_fleet(fleet)
    args = ["replay", "--trace", str(trace), "--fleet", str(fleet), "--out", str(out)]
    outcome = CliRunner().invoke(
        sim_app,
        [*args, "--baseline", "fifo"],
    )
    assert outcome.exit_code == 0, outcome.output
    result = json.loads(out.read_text(encoding="utf-8"))
    for data in (result, result["baseline"]):
        assert data["jobs"] == 40
        assert data["completed"] == 40
        assert data["island_violations"] == 0
        assert 0 < data["gpu_utilization"] <= 1
    assert result["baseline"]["scheduler"] == "fifo"
