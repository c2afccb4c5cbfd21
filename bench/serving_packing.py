"""Large training gangs' waits with one-GPU serving replicas mixed in: the
serving packing preference and island classes against best fit alone.

    .venv/bin/python bench/serving_packing.py --trace /tmp/traces/cluster04.csv \\
        --fleet sim/fleets/itp-cluster04-576.yaml --seed 22 \\
        --out bench/results/serving-packing-cluster04-576.json

One run, one process: the ITP trace and a seeded stream of one-GPU serving
replicas (``sim/replay/serving.py``: one every 10 min on average, each
serving 6 h on average, ~36 GPUs busy) replayed on the same fleet, with a
ClusterQueue ``serving`` (class inference, 48 GPUs nominal) added to the
fleet's cohort, under four engines:

* ``best-fit-shared``: every ClusterQueue ``mixed-islands`` and
  ``serving_islands_first`` off — the engine before issue 22;
* ``serving-first-shared``: the preference alone (islands still shared);
* ``best-fit-isolated``: island classes alone;
* ``serving-first-isolated``: both — the engine as it now runs.

It writes the command, the inputs and each variant's RESULT
(``sim/replay/metrics.py``) and prints on stderr a table of the waits of
training gangs of 17-32 and 33-64 GPUs and of the serving replicas.
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

from service.domain.quota import (
    ClusterQueue,
    FlavorQuotas,
    LocalQueue,
    ResourceGroup,
    ResourceQuota,
)
from service.domain.workload import Workload
from service.engine import EngineConfig
from sim.fleet import Fleet, load_fleet
from sim.replay.loop import GPU, ReplayOptions, Simulator
from sim.replay.serving import SERVING_TEAM, serving_stream
from sim.replay.trace import TraceJob, load_trace, stable_team

VARIANTS = (
    "best-fit-shared",
    "serving-first-shared",
    "best-fit-isolated",
    "serving-first-isolated",
)
SERVING_NOMINAL = 48


def with_serving(fleet: Fleet, mixed: bool) -> Fleet:
    """The fleet with a ``serving`` ClusterQueue in the first cohort, every
    ClusterQueue ``mixed_islands`` as asked."""
    flavor = fleet.resource_flavors[0].name
    cohort = fleet.cluster_queues[0].cohort_name
    serving = ClusterQueue(
        name=SERVING_TEAM,
        cohort_name=cohort,
        resource_groups=(
            ResourceGroup(
                covered_resources=(GPU,),
                flavors=(FlavorQuotas(flavor, {GPU: ResourceQuota(SERVING_NOMINAL)}),),
            ),
        ),
        workload_class="inference",
    )
    queues = tuple(replace(cq, mixed_islands=mixed) for cq in (*fleet.cluster_queues, serving))
    return replace(
        fleet,
        cluster_queues=queues,
        local_queues=(*fleet.local_queues, LocalQueue(SERVING_TEAM, SERVING_TEAM, SERVING_TEAM)),
        namespaces={**fleet.namespaces, SERVING_TEAM: {}},
    )


class MixedSimulator(Simulator):
    """Training jobs hashed to the training teams only; serving jobs inference."""

    def __init__(self, fleet: Fleet, jobs: list[TraceJob], options: ReplayOptions) -> None:
        super().__init__(fleet, jobs, options)
        teams = sorted(t for t in self.queues if t != SERVING_TEAM)
        self.team_of = {
            j.job_id: SERVING_TEAM if j.team == SERVING_TEAM else stable_team(j.job_id, teams)
            for j in self.jobs
        }
        self.by_key = {f"{self.team_of[j.job_id]}/{j.job_id}": j for j in self.jobs}

    def workload(self, job: TraceJob) -> Workload:
        wl = super().workload(job)
        if self.team_of[job.job_id] == SERVING_TEAM:
            return replace(wl, workload_class="inference")
        return wl


def simulator(name: str, fleet_path: Path, jobs: list[TraceJob]) -> Simulator:
    fleet = with_serving(load_fleet(fleet_path), mixed=name.endswith("-shared"))
    engine = EngineConfig(serving_islands_first=name.startswith("serving-first"))
    return MixedSimulator(fleet, jobs, ReplayOptions(engine=engine, label=name))


def _waits(result: dict[str, Any], size: str) -> str:
    block = result["by_size"].get(size)
    if not block:
        return "-"
    wait = block["wait_s"]
    return f"{wait['mean']:,.0f} / {wait['p95']:,.0f} ({block['jobs']})"


def table(runs: dict[str, dict[str, Any]]) -> str:
    head = (
        "| variant | 17-32 GPUs wait mean / p95 (s) (jobs) | 33-64 GPUs wait mean / p95 (s) "
        "| serving replica wait mean / p95 (s) | preemptions | island violations |\n"
        "|---|---|---|---|---|---|"
    )
    rows = [
        f"| {name} | {_waits(r, '17-32')} | {_waits(r, '33-64')} "
        f"| {r['serving']['mean']:,.0f} / {r['serving']['p95']:,.0f} "
        f"| {r['preemptions']} | {r['island_violations']} |"
        for name, r in runs.items()
    ]
    return "\n".join([head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--fleet", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--limit", type=int, default=None, help="first N trace jobs only")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    training = load_trace(args.trace, limit=args.limit)
    start = min(j.submission_time for j in training)
    end = max(j.submission_time for j in training)
    serving = serving_stream(args.seed, start, end)
    jobs = sorted([*training, *serving], key=lambda j: j.submission_time)
    runs: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    for name in VARIANTS:
        sim = simulator(name, args.fleet, jobs)
        result = sim.run()
        waits = [sim.stats.total_wait[j.job_id] for j in serving if j.job_id in sim.stats.finished]
        waits.sort()
        result["serving"] = {
            "jobs": len(waits),
            "mean": sum(waits) / len(waits) if waits else 0.0,
            "p95": waits[int(0.95 * (len(waits) - 1))] if waits else 0.0,
        }
        runs[name] = result
        print(f"{name}: {result['wall_s']} s", file=sys.stderr)
        # Written after each variant, so that a long run stopped early keeps what it found.
        out = {
            "command": " ".join(sys.argv),
            "trace": str(args.trace),
            "fleet": str(args.fleet),
            "seed": args.seed,
            "limit": args.limit,
            "serving_replicas": len(serving),
            "serving_nominal_gpus": SERVING_NOMINAL,
            "seconds": round(time.perf_counter() - started, 1),
            "runs": runs,
        }
        args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(table(runs), file=sys.stderr)


if __name__ == "__main__":
    main()
