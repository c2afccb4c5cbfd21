"""Scheduling quality on a trace: the engine before and after island-first packing, and best fit.

    .venv/bin/python bench/replay_quality.py --trace /tmp/traces/cluster04.csv \\
        --fleet sim/fleets/itp-cluster04-576.yaml \\
        --out bench/results/replay-quality-cluster04-576.json

One run, one process, every variant replayed on the same trace and fleet
(``sim.replay``, a cycle at most every 60 s, 8 GPUs a pod):

* ``teams-before`` / ``teams-after``: the fleet as configured (a ClusterQueue
  per team in one cohort, borrowing and reclaiming), with
  ``spread_packing = ClusterFirst`` (the placement before issue 24) and
  ``IslandFirst`` (after);
* ``single-before`` / ``single-after``: the engine on one BestEffortFIFO
  ClusterQueue whose quota is the fleet, admission fair sharing off
  (``single_queue_fleet``), before and after;
* ``best-fit``: the quota-free reference policy of ``sim/replay/baseline.py``.

It writes one JSON object — the command, the inputs and each variant's whole
RESULT (``sim/replay/metrics.py``) — and prints a Markdown table of the honest
figures (delay and wait with re-queues) on stderr.
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

from service.engine import EngineConfig
from sim.fleet import load_fleet
from sim.replay.baseline import best_fit_cycle
from sim.replay.loop import ReplayOptions, Simulator, fifo_options, single_queue_fleet
from sim.replay.trace import load_trace

VARIANTS = ("teams-before", "teams-after", "single-before", "single-after", "best-fit")


def simulator(name: str, fleet_path: Path, trace: Path) -> Simulator:
    fleet = load_fleet(fleet_path)
    jobs = load_trace(trace)
    packing = "ClusterFirst" if name.endswith("-before") else "IslandFirst"
    options = ReplayOptions(engine=EngineConfig(spread_packing=packing), label=name)
    if name.startswith("teams-"):
        return Simulator(fleet, jobs, options)
    if name.startswith("single-"):
        return Simulator(
            single_queue_fleet(fleet), jobs, replace(fifo_options(options), label=name)
        )
    return Simulator(single_queue_fleet(fleet), jobs, options, best_fit_cycle)


def _row(name: str, result: dict[str, Any]) -> str:
    def three(block: dict[str, float]) -> str:
        return " / ".join(f"{block[k]:,.0f}" for k in ("mean", "p95", "p99"))

    return (
        f"| {name} | {three(result['delay_s'])} | {three(result['wait_s'])} "
        f"| {result['mean_wait_s']:,.0f} "
        f"| {result['preemptions']} ({result['lost_gpu_hours']:,.1f}) "
        f"| {result['goodput_utilization']} | {result['makespan_s']:,.0f} "
        f"| {result['island_violations']} |"
    )


def table(runs: dict[str, dict[str, Any]]) -> str:
    head = (
        "| variant | delay mean / p95 / p99 (s) | wait with re-queues mean / p95 / p99 (s) "
        "| first wait mean (s) | preemptions (GPU-h lost) | goodput | makespan (s) "
        "| island violations |\n|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *(_row(name, result) for name, result in runs.items())])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--fleet", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    args = parser.parse_args()
    started = time.monotonic()
    runs: dict[str, dict[str, Any]] = {}
    for name in args.variants.split(","):
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; the variants are {', '.join(VARIANTS)}")
        print(f"replaying {name} …", file=sys.stderr, flush=True)
        runs[name] = simulator(name, args.fleet, args.trace).run()
    result = {
        "command": " ".join([".venv/bin/python", "bench/replay_quality.py", *sys.argv[1:]]),
        "trace": str(args.trace),
        "fleet": str(args.fleet),
        "cycle_interval_s": ReplayOptions().cycle_interval,
        "gpus_per_pod": ReplayOptions().gpus_per_pod,
        "seconds": round(time.monotonic() - started, 1),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(runs), file=sys.stderr)


if __name__ == "__main__":
    main()
