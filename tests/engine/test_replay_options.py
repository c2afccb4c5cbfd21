"""``quartermaster sim replay``'s engine options: each reaches the engine, bad ones are named."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sim.cli import app as sim_app
from sim.replay.options import parse_resource_weights, parse_strategies

FLEET = Path(__file__).resolve().parents[2] / "sim" / "fleets" / "itp-cluster04.yaml"


def _trace(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("job_id,submission_time,duration,num_gpu,team\n" + "\n".join(rows) + "\n")
    return path


def _invoke(tmp_path: Path, trace: Path, *options: str) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "result.json"
    out.unlink(missing_ok=True)
    args = ["replay", "--trace", str(trace), "--fleet", str(FLEET), "--out", str(out), *options]
    outcome = CliRunner().invoke(sim_app, args)
    result = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    return outcome.exit_code, outcome.output, result


def test_every_engine_option_reaches_the_engine(tmp_path: Path) -> None:
    trace = _trace(tmp_path, ["a,0,100,1,team-a"])
    options = [
        "--fair-sharing",
        "--fair-sharing-strategies",
        "LessThanInitialShare",
        "--no-prioritize-non-borrowing",
        "--no-admission-fair-sharing",
        "--afs-half-life",
        "3600",
        "--afs-sampling-interval",
        "30",
        "--afs-resource-weight",
        "nvidia.com/gpu=2",
        "--afs-resource-weight",
        "cpu=0.5",
        "--max-heads-per-cluster-queue",
        "3",
        "--cycle-interval",
        "15",
        "--spread-packing",
        "ClusterFirst",
        "--consolidation",
        "--consolidation-any-victim-placement",
        "--reservation",
        "--reservation-min-accelerators",
        "32",
        "--reservation-min-wait",
        "3600",
        "--spare-island-gangs",
        "--island-gang-grace",
        "14400",
        "--team-seed",
        "3",
        "--min-runtime",
        "600",
        "--preemption-budget",
        "4/3600",
    ]
    code, output, result = _invoke(tmp_path, trace, *options)
    assert code == 0, output
    assert result["engine"] == {
        "fair_sharing": True,
        "fair_sharing_strategies": ["LessThanInitialShare"],
        "prioritize_non_borrowing": False,
        "admission_fair_sharing": False,
        "afs_half_life_s": 3600.0,
        "afs_sampling_interval_s": 30.0,
        "afs_resource_weights": {"cpu": 0.5, "nvidia.com/gpu": 2.0},
        "max_heads_per_cluster_queue": 3,
        "spread_packing": "ClusterFirst",
        "consolidation": True,
        "consolidation_victim_placement": "Any",
        "reservation": True,
        "reservation_min_accelerators": 32,
        "reservation_min_wait_s": 3600.0,
        "spare_island_gangs": True,
    }
    assert result["team_seed"] == 3
    assert result["cycle_interval_s"] == 15.0
    assert result["min_runtime_s"] == 600
    assert result["island_gang_grace_s"] == 14400
    assert result["preemption_budget"] == [4, 3600]
    # The recorded command runs the same configuration again.
    again = shlex.split(result["command"])
    assert again[-1] != "replay" and "replay" in again
    recorded = again[again.index("replay") :]
    out = tmp_path / "again.json"
    recorded[recorded.index("--out") + 1] = str(out)
    assert CliRunner().invoke(sim_app, recorded).exit_code == 0
    assert json.loads(out.read_text(encoding="utf-8"))["engine"] == result["engine"]


def test_defaults_are_the_engines_and_a_head_ceiling_changes_the_waits(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [f"j{i},0,1000,1,team-a" for i in range(3)])
    code, output, free = _invoke(tmp_path, trace, "--cycle-interval", "100")
    assert code == 0, output
    assert free["engine"]["admission_fair_sharing"] is True
    assert free["engine"]["fair_sharing"] is False
    assert free["engine"]["spread_packing"] == "IslandFirst"
    assert free["engine"]["consolidation"] is False
    assert free["engine"]["reservation"] is False
    assert free["engine"]["spare_island_gangs"] is False
    assert free["island_gang_grace_s"] is None and free["team_seed"] == 0
    assert free["min_runtime_s"] is None and free["preemption_budget"] is None
    assert free["wait_s"]["max"] == 0.0
    # One head of team-a's ClusterQueue a cycle: the jobs start 0, 100 and 200 s in.
    code, output, one = _invoke(
        tmp_path, trace, "--cycle-interval", "100", "--max-heads-per-cluster-queue", "1"
    )
    assert code == 0, output
    assert one["wait_s"] == {"mean": 100.0, "p50": 100.0, "p95": 200.0, "p99": 200.0, "max": 200.0}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--cycle-interval", "-1"], "--cycle-interval"),
        (["--cycle-interval", "nan"], "--cycle-interval"),
        (["--fair-sharing-strategies", "Fastest"], "--fair-sharing-strategies"),
        (["--fair-sharing-strategies", ","], "--fair-sharing-strategies"),
        (["--afs-half-life", "0"], "--afs-half-life"),
        (["--afs-sampling-interval", "-5"], "--afs-sampling-interval"),
        (["--afs-resource-weight", "nvidia.com/gpu"], "--afs-resource-weight"),
        (["--afs-resource-weight", "cpu=-1"], "--afs-resource-weight"),
        (["--max-heads-per-cluster-queue", "0"], "--max-heads-per-cluster-queue"),
        (["--gpus-per-pod", "0"], "--gpus-per-pod"),
        (["--baseline", "oracle"], "--baseline"),
        (["--baseline", "fifo", "--baseline", "fifo"], "--baseline"),
        (["--spread-packing", "Anywhere"], "--spread-packing"),
        (["--preemption-budget", "4"], "--preemption-budget"),
        (["--preemption-budget", "4/0"], "--preemption-budget"),
        (["--min-runtime", "-1"], "--min-runtime"),
        (["--reservation-min-accelerators", "0"], "--reservation-min-accelerators"),
        (["--reservation-min-wait", "-1"], "--reservation-min-wait"),
    ],
)
def test_a_bad_value_is_refused_naming_its_option(
    tmp_path: Path, options: list[str], named: str
) -> None:
    trace = _trace(tmp_path, ["a,0,100,1,team-a"])
    code, output, result = _invoke(tmp_path, trace, *options)
    assert code == 2
    assert f"Invalid value for '{named}'" in " ".join(output.split())
    assert result == {}


def test_option_parsers() -> None:
    assert parse_strategies("LessThanInitialShare, LessThanOrEqualToFinalShare") == (
        "LessThanInitialShare",
        "LessThanOrEqualToFinalShare",
    )
    with pytest.raises(ValueError, match="twice"):
        parse_strategies("LessThanInitialShare,LessThanInitialShare")
    assert parse_resource_weights(["b=1", "a=2.5", "b=3"]) == (("a", 2.5), ("b", 3.0))
    with pytest.raises(ValueError, match="not a number"):
        parse_resource_weights(["a=x"])
