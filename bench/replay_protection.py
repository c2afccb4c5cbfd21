"""Issue 24's last part: protection and consolidation replayed on an ITP trace.

    nice -n 19 .venv/bin/python bench/replay_protection.py \\
        --traces-tarball /work/shared/traces/msft-itp-elasticflow/raw-traces.tar.gz \\
        --trace cluster02.csv --fleet sim/fleets/itp-cluster02-128.yaml \\
        --out bench/results/replay-protection-cluster02-128.json

``--trace`` is a CSV file, or with ``--traces-tarball`` the name of one inside
that tarball, extracted to a temporary directory removed after the run.

One process, one trace and fleet, every variant (``sim.replay``, a cycle at
most every 60 s, 8 GPUs a pod, jobs checkpointing every ~30 min, seed 0):

* ``before``: the engine before issue 24 — ClusterFirst packing, and blind to
  checkpoints (newest-first victims), though the jobs still restart from them;
* ``after``: the engine's defaults now (island-first packing, victims by
  seconds since checkpoint), protection and consolidation off;
* ``+consolidation``, ``+min-runtime`` (1,800 s on every ClusterQueue),
  ``+budget`` (1 protected preemption per ClusterQueue per hour): each switch
  alone on ``after``;
* ``all``: the three together; ``all+fair-sharing``: and fair sharing;
* ``+reservation``: ``after`` with a head-of-line reservation
  (``service.engine.reservation``) for gangs of 17 GPUs or more (the 32- and
  64-GPU classes); ``+spare-gangs``: ``after`` with victims ordered to spare
  gangs bigger than their preemptor (``EngineConfig.spare_island_gangs``);
  ``+protect-gangs``: such gangs are no victims of a smaller preemptor of
  another ClusterQueue (``preemption.protection.islandGangGraceSeconds`` of
  366 days on every ClusterQueue, more than any trace lasts);
  ``+reservation+spare``; ``+reservation+protect``: the reservation, sparing
  and protection; ``+protect-gangs-4h`` and ``+reservation+protect-4h``: the
  same with a grace of 4 h, after which the preemptor takes the gang;
* ``no-reclaim``: ``after`` on the fleet with ``reclaimWithinCohort: Never``
  on every ClusterQueue: teams still borrow, nothing is ever preempted, so
  what is left against best fit is Kueue's entry order (heads within nominal
  quota before borrowers) and the quota checks;
* ``best-fit``: the quota-free single-queue reference (sim/replay/baseline.py).

``--team-seed N`` assigns the trace's jobs to teams by another stable hash
(``sim.replay.trace.stable_team``), to judge the variants over several.

It writes the command, each variant's seconds and its whole RESULT, and
prints Markdown tables (delay with re-queues per variant, per size class and
per team against best-fit) on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.engine import (
    ConsolidationConfig,
    EngineConfig,
    FairSharingConfig,
    ReservationConfig,
)
from sim.fleet import Fleet, load_fleet
from sim.replay.baseline import best_fit_cycle
from sim.replay.loop import ReplayOptions, Simulator, single_queue_fleet
from sim.replay.trace import TraceJob, load_trace

CHECKPOINT_S, MIN_RUNTIME_S, BUDGET = 1800.0, 1800, (1, 3600)
VARIANTS = (
    "before",
    "after",
    "+consolidation",
    "+min-runtime",
    "+budget",
    "all",
    "all+fair-sharing",
    "+reservation",
    "+spare-gangs",
    "+protect-gangs",
    "+reservation+spare",
    "+reservation+protect",
    "+protect-gangs-4h",
    "+reservation+protect-4h",
    "no-reclaim",
    "best-fit",
)
#: ``islandGangGraceSeconds`` of ``+protect-gangs-4h``: a preemptor queued this long takes
#: the gang; of ``+protect-gangs``: the longest allowed, more than any trace's span.
PROTECT_LAPSE_S, FOR_EVER_S = 4 * 3600, 366 * 24 * 3600
#: The smallest gang (GPUs) a reservation is made for: the 32- and 64-GPU classes.
RESERVATION_MIN = 17


def options_of(name: str, team_seed: int = 0) -> ReplayOptions:
    base = ReplayOptions(
        label=name, checkpoint_interval=CHECKPOINT_S, checkpoint_seed=0, team_seed=team_seed
    )
    if name == "before":
        engine = EngineConfig(spread_packing="ClusterFirst")
        return replace(base, engine=engine, engine_sees_checkpoints=False)
    consolidation = name in ("+consolidation", "all", "all+fair-sharing")
    reservation = ReservationConfig(
        enable=name.startswith("+reservation"), min_accelerators=RESERVATION_MIN
    )
    engine = EngineConfig(
        consolidation=ConsolidationConfig(enable=consolidation),
        fair_sharing=FairSharingConfig(enable=name == "all+fair-sharing"),
        reservation=reservation,
        spare_island_gangs=name.startswith(("+spare-gangs", "+reservation+")),
    )
    grace = None
    if name.startswith(("+protect-gangs", "+reservation+protect")):
        grace = PROTECT_LAPSE_S if name.endswith("-4h") else FOR_EVER_S
    protected = name.startswith("all")
    return replace(
        base,
        engine=engine,
        min_runtime=MIN_RUNTIME_S if protected or name == "+min-runtime" else None,
        preemption_budget=BUDGET if protected or name == "+budget" else None,
        island_gang_grace=grace,
    )


def simulator(name: str, fleet_path: Path, trace: Path, team_seed: int = 0) -> Simulator:
    return simulator_of(name, load_fleet(fleet_path), load_trace(trace), team_seed)


def simulator_of(name: str, fleet: Fleet, jobs: list[TraceJob], team_seed: int = 0) -> Simulator:
    options = options_of(name, team_seed)
    if name == "no-reclaim":
        fleet = replace(
            fleet,
            cluster_queues=tuple(
                replace(cq, preemption=replace(cq.preemption, reclaim_within_cohort="Never"))
                for cq in fleet.cluster_queues
            ),
        )
    if name == "best-fit":
        return Simulator(single_queue_fleet(fleet), jobs, options, best_fit_cycle)
    return Simulator(fleet, jobs, options)


def _three(block: dict[str, float]) -> str:
    return " / ".join(f"{block[k]:,.0f}" for k in ("mean", "p95", "p99"))


def table(runs: dict[str, dict[str, Any]], seconds: dict[str, float]) -> str:
    lines = [
        "| variant | delay mean / p95 / p99 (s) | wait with re-queues mean / p95 / p99 (s) "
        "| preemptions (consolidation) | GPU-h destroyed | makespan (s) | island violations "
        "| replay (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        moves = r.get("preemptions_by_reason", {}).get("Consolidation", 0)
        lines.append(
            f"| {name} | {_three(r['delay_s'])} | {_three(r['wait_s'])} "
            f"| {r['preemptions']} ({moves}) | {r['lost_gpu_hours']:,.1f} "
            f"| {r['makespan_s']:,.0f} | {r['island_violations']} | {seconds[name]:,.0f} |"
        )
    return "\n".join(lines)


def against_best_fit(runs: dict[str, dict[str, Any]], group: str) -> str:
    """Mean / p95 / p99 delay per size class or team; a star marks worse than best fit."""
    reference = runs.get("best-fit")
    names = [n for n in runs if n != "best-fit"]
    keys = sorted(next(iter(runs.values()))[group])
    head = f"| {group} | best-fit | " + " | ".join(names) + " |"
    lines = [head, "|---" * (len(names) + 2) + "|"]
    for key in keys:
        cells = []
        ref = reference[group][key]["delay_s"] if reference else None
        for name in names:
            block = runs[name][group][key]["delay_s"]
            marks = [
                f"{block[k]:,.0f}{'*' if ref is not None and block[k] > ref[k] else ''}"
                for k in ("mean", "p95", "p99")
            ]
            cells.append(" / ".join(marks))
        lines.append(f"| {key} | {_three(ref) if ref else '—'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replay_parser(doc: str, variants: str) -> argparse.ArgumentParser:
    """The options this script and bench/replay_seeds.py share."""
    parser = argparse.ArgumentParser(description=doc.split("\n", maxsplit=1)[0])
    parser.add_argument("--trace", type=Path, required=True, help="a CSV, or a name in the tarball")
    parser.add_argument("--traces-tarball", type=Path, help="the ITP traces' .tar.gz")
    parser.add_argument("--fleet", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", default=variants, help="comma-separated")
    return parser


def variants_of(parser: argparse.ArgumentParser, text: str) -> list[str]:
    names = text.split(",")
    for name in names:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; the variants are {', '.join(VARIANTS)}")
    return names


def with_trace(args: argparse.Namespace, run: Callable[[Path], None]) -> None:
    """``run`` on ``--trace``: the file, or extracted from ``--traces-tarball``
    to a temporary directory removed afterwards."""
    if args.traces_tarball is None:
        run(args.trace)
        return
    with tempfile.TemporaryDirectory(prefix="qm-traces-") as scratch:
        with tarfile.open(args.traces_tarball) as tarball:
            tarball.extract(str(args.trace), scratch, filter="data")
        run(Path(scratch) / args.trace)


def main() -> None:
    parser = replay_parser(__doc__, ",".join(VARIANTS))
    parser.add_argument("--team-seed", type=int, default=0, help="salts the team assignment")
    args = parser.parse_args()
    variants_of(parser, args.variants)
    with_trace(args, lambda trace: run(args, trace))


def run(args: argparse.Namespace, trace: Path) -> None:
    """Replay every variant asked for on ``trace``; write and print the results."""
    started = time.monotonic()
    runs: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for name in args.variants.split(","):
        print(f"replaying {name} …", file=sys.stderr, flush=True)
        clock = time.monotonic()
        runs[name] = simulator(name, args.fleet, trace, args.team_seed).run()
        seconds[name] = round(time.monotonic() - clock, 1)
    result = {
        "command": " ".join(
            ["nice -n 19 .venv/bin/python", "bench/replay_protection.py", *sys.argv[1:]]
        ),
        "trace": str(args.trace),
        "fleet": str(args.fleet),
        "cycle_interval_s": ReplayOptions().cycle_interval,
        "gpus_per_pod": ReplayOptions().gpus_per_pod,
        "checkpoint_interval_s": CHECKPOINT_S,
        "team_seed": args.team_seed,
        "protect_lapse_s": PROTECT_LAPSE_S,
        "min_runtime_s": MIN_RUNTIME_S,
        "preemption_budget": list(BUDGET),
        "seconds": round(time.monotonic() - started, 1),
        "variant_seconds": seconds,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(runs, seconds), file=sys.stderr)
    print(against_best_fit(runs, "by_size"), file=sys.stderr)
    print(against_best_fit(runs, "by_team"), file=sys.stderr)


if __name__ == "__main__":
    main()
