"""Issue 24's goal judged over several team assignments of one ITP trace.

    nice -n 19 .venv/bin/python bench/replay_seeds.py \\
        --traces-tarball /work/shared/traces/msft-itp-elasticflow/raw-traces.tar.gz \\
        --trace cluster03.csv --fleet sim/fleets/itp-cluster03-192.yaml \\
        --seeds 0,1,2,3,4 --variants after,+protect-gangs-4h,best-fit \\
        --out bench/results/replay-seeds-cluster03-192.json

The ITP traces name no team: a job's team is a stable hash of its id
(``sim.replay.trace.stable_team``), so every replay of a trace shares one
assignment and its 6 to 17 gangs of 64 GPUs. ``--team-seed`` salts the hash;
this runs each variant of ``bench/replay_protection.py`` under each seed, in
one process, and counts for each the cells of the issue's goal — mean, p95 and
p99 delay of every size class and team — that are worse than best fit under
the same seed. A policy that meets the goal under one assignment and not under
the next has not met it. ``--quotas offered`` sets each team's nominal GPU
quota to its share of the trace's offered GPU-seconds under each seed,
instead of the fleet's (4:3:3:2 for teams whose loads the hash makes equal).

It writes the command and, per seed and variant, the overall, per-class and
per-team delays and the GPU-hours destroyed, and prints Markdown tables on
stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_protection import (
    CHECKPOINT_S,
    PROTECT_LAPSE_S,
    replay_parser,
    simulator_of,
    variants_of,
    with_trace,
)

from service.domain.quota import ClusterQueue
from sim.fleet import Fleet, load_fleet
from sim.replay.loop import GPU, nominal_gpus, team_cluster_queues
from sim.replay.trace import TraceJob, load_trace, stable_team

STATS = ("mean", "p95", "p99")
GROUPS = ("by_size", "by_team")


def offered_quotas(fleet: Fleet, jobs: list[TraceJob], seed: int) -> dict[str, int]:
    """Each team's GPU quota as its share of the trace's offered GPU-seconds
    under ``seed``, in whole GPUs summing to the fleet's nominal total (largest
    remainder): quotas an admin would size to each team's demand."""
    teams = sorted(team_cluster_queues(fleet))
    offered = dict.fromkeys(teams, 0.0)
    for job in jobs:
        team = job.team if job.team in offered else stable_team(job.job_id, teams, seed)
        offered[team] += job.num_gpu * job.duration
    total = sum(nominal_gpus(cq) for cq in fleet.cluster_queues)
    exact = {t: total * offered[t] / sum(offered.values()) for t in teams}
    quotas = {t: int(exact[t]) for t in teams}
    for team in sorted(teams, key=lambda t: exact[t] - quotas[t], reverse=True):
        if sum(quotas.values()) == total:
            break
        quotas[team] += 1
    return quotas


def with_quotas(fleet: Fleet, quotas: dict[str, int]) -> Fleet:
    """``fleet`` with each team's ClusterQueue's GPU quota set; each team needs a
    ClusterQueue of its own with one resource group of one flavor."""
    cq_of = team_cluster_queues(fleet)
    if len(set(cq_of.values())) != len(cq_of):
        raise SystemExit("--quotas offered needs a ClusterQueue per team")
    by_cq = {cq: quotas[team] for team, cq in cq_of.items()}
    queues = tuple(
        _with_gpus(cq, by_cq[cq.name]) if cq.name in by_cq else cq for cq in fleet.cluster_queues
    )
    return replace(fleet, cluster_queues=queues)


def _with_gpus(cq: ClusterQueue, gpus: int) -> ClusterQueue:
    if len(cq.resource_groups) != 1 or len(cq.resource_groups[0].flavors) != 1:
        raise SystemExit(f"--quotas offered needs one flavor in ClusterQueue {cq.name}")
    group = cq.resource_groups[0]
    flavor = group.flavors[0]
    gpu = replace(flavor.resources[GPU], nominal=gpus)
    flavor = replace(flavor, resources={**flavor.resources, GPU: gpu})
    return replace(cq, resource_groups=(replace(group, flavors=(flavor,)),))


def worse_cells(run: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """The goal's cells in which ``run`` delays more than ``reference``."""
    cells = []
    for group in GROUPS:
        for key in sorted(reference[group]):
            ours = run[group].get(key)
            ref = reference[group][key]["delay_s"]
            for stat in STATS:
                if ours is None or ours["delay_s"][stat] > ref[stat]:
                    cells.append(f"{key} {stat}")
    return cells


def digest(run: dict[str, Any]) -> dict[str, Any]:
    """What the tables need of one RESULT (the whole one is in replay_protection's files)."""
    return {
        "delay_s": run["delay_s"],
        "lost_gpu_hours": run["lost_gpu_hours"],
        "preemptions": run["preemptions"],
        "island_violations": run["island_violations"],
        "completed": run["completed"],
        **{
            group: {k: {"delay_s": v["delay_s"], "jobs": v["jobs"]} for k, v in run[group].items()}
            for group in GROUPS
        },
    }


def tables(seeds: list[int], names: list[str], runs: dict[str, dict[str, Any]]) -> str:
    """Cells worse than best fit per seed and variant, then each variant's overall delay."""
    others = [n for n in names if n != "best-fit"]
    total = sum(len(runs[str(seeds[0])]["best-fit"][g]) for g in GROUPS) * len(STATS)
    lines = [
        f"cells of the goal worse than best fit (of {total}):",
        "",
        "| team seed | " + " | ".join(others) + " |",
        "|---" * (len(others) + 1) + "|",
    ]
    for seed in seeds:
        per = runs[str(seed)]
        row = [str(len(worse_cells(per[n], per["best-fit"]))) for n in others]
        lines.append(f"| {seed} | " + " | ".join(row) + " |")
    lines += [
        "",
        "delay mean / p95 / p99 (s), GPU-h destroyed:",
        "",
        "| team seed | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for seed in seeds:
        per = runs[str(seed)]
        cells = [
            " / ".join(f"{per[n]['delay_s'][k]:,.0f}" for k in STATS)
            + f", {per[n]['lost_gpu_hours']:,.0f}"
            for n in names
        ]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = replay_parser(__doc__, "after,best-fit")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated team seeds")
    parser.add_argument(
        "--quotas",
        choices=("fleet", "offered"),
        default="fleet",
        help="the fleet's nominal quotas, or each team's share of the offered GPU-seconds",
    )
    args = parser.parse_args()
    names = variants_of(parser, args.variants)
    if "best-fit" not in names:
        parser.error("--variants must include best-fit, the reference of the goal")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r} is not comma-separated whole numbers")
    if any(s < 0 for s in seeds):
        parser.error("--seeds must be ≥ 0")
    with_trace(args, lambda trace: run(args, trace, seeds, names))


def run(args: argparse.Namespace, trace: Path, seeds: list[int], names: list[str]) -> None:
    started = time.monotonic()
    runs: dict[str, dict[str, Any]] = {}
    worse: dict[str, dict[str, list[str]]] = {}
    quotas: dict[str, dict[str, int]] = {}
    fleet, jobs = load_fleet(args.fleet), load_trace(trace)
    for index, seed in enumerate(seeds, start=1):
        seeded = fleet
        if args.quotas == "offered":
            quotas[str(seed)] = offered_quotas(fleet, jobs, seed)
            seeded = with_quotas(fleet, quotas[str(seed)])
        per: dict[str, Any] = {}
        for name in names:
            print(f"seed {seed} ({index}/{len(seeds)}): {name} …", file=sys.stderr, flush=True)
            per[name] = digest(simulator_of(name, seeded, jobs, seed).run())
        runs[str(seed)] = per
        worse[str(seed)] = {
            n: worse_cells(per[n], per["best-fit"]) for n in names if n != "best-fit"
        }
    result = {
        "command": " ".join(
            ["nice -n 19 .venv/bin/python", "bench/replay_seeds.py", *sys.argv[1:]]
        ),
        "trace": str(args.trace),
        "fleet": str(args.fleet),
        "checkpoint_interval_s": CHECKPOINT_S,
        "protect_lapse_s": PROTECT_LAPSE_S,
        "quotas": args.quotas,
        "offered_quotas": quotas,
        "seconds": round(time.monotonic() - started, 1),
        "worse_than_best_fit": worse,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(tables(seeds, names, runs), file=sys.stderr)


if __name__ == "__main__":
    main()
