"""One full admission cycle on a big synthetic fleet, beside Kueue's one-head ceiling.

    .venv/bin/python bench/engine.py [--sizes 1000,10000,100000] [--seed 7]

The fleet: 20 clusters x 4 GPU flavors x 8 fabric islands x 32 nodes x 8 GPUs
(20,480 nodes, 163,840 GPUs), 1,000 ClusterQueues in 10 cohorts (nominal quota
= an even share of every flavor, borrowing within the cohort, preemption on),
one LocalQueue per ClusterQueue, and N pending gangs of 1 to 64 GPUs (pods of
at most 8 GPUs; gangs of 8 GPUs and more require one fabric island), with
three priorities and random submission times, from a seeded generator.

For every size it runs, each in a fresh process so that peak memory is its
own: the engine as shipped (one cycle admits everything that fits), and the
baseline — the same engine limited to one head per ClusterQueue per cycle,
as Kueue is (kueue#14477). It prints one JSON line per size on stdout:
seconds for the full cycle (the fastest of ``--repeat`` runs on the same
snapshot: the machine is shared, and the cycle is pure), admissions,
admissions per second, the process's peak resident memory (which includes
the snapshot), and the same for the baseline. ``cycle_cpu_s`` is the
process CPU time of the fastest run, a check on wall time when other work
shares the machine. Python's garbage collector is paused around each cycle,
as the service and the replay simulator pause it (see ``service.engine``).
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.domain.inventory import HOSTNAME_LABEL, Cluster, Node
from service.domain.quota import (
    BorrowWithinCohort,
    ClusterQueue,
    Cohort,
    FlavorQuotas,
    LocalQueue,
    PreemptionPolicy,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Topology,
)
from service.domain.workload import PodSet, TopologyRequest, Workload
from service.engine import EngineConfig, Snapshot, admission_cycle

CLUSTERS, FLAVORS, ISLANDS, NODES, GPUS = 20, ("h100", "h200", "a100", "l40s"), 8, 32, 8
CLUSTER_QUEUES, COHORTS = 1000, 10
ISLAND_LEVEL = "example.com/fabric-block"
GPU, CPU = "nvidia.com/gpu", "cpu"
CPU_PER_GPU = 12_000  # milli-cores
#: Gang sizes (GPUs) and how often they occur: mostly small, a tail of big gangs.
SIZES = (1, 2, 4, 8, 16, 32, 64)
WEIGHTS = (40, 10, 10, 20, 10, 6, 4)
PRIORITIES = (0, 100, 1000)


def fleet() -> tuple[list[Cluster], list[Node], list[ResourceFlavor], list[Topology]]:
    topology = Topology("fabric", (ISLAND_LEVEL, HOSTNAME_LABEL))
    flavors = [
        ResourceFlavor(name=f, node_labels={"example.com/gpu": f}, topology_name="fabric")
        for f in FLAVORS
    ]
    clusters = [Cluster(f"c{c:02d}", labels={"region": f"r{c % 4}"}) for c in range(CLUSTERS)]
    nodes = []
    allocatable = {GPU: GPUS, CPU: GPUS * CPU_PER_GPU + 8_000}
    for cluster in clusters:
        for flavor in FLAVORS:
            for i in range(ISLANDS):
                island = f"{cluster.name}-{flavor}-i{i}"
                for k in range(NODES):
                    name = f"{island}-n{k}"
                    nodes.append(
                        Node(
                            name=name,
                            cluster=cluster.name,
                            flavor=flavor,
                            island=island,
                            allocatable=allocatable,
                            labels={
                                "example.com/gpu": flavor,
                                ISLAND_LEVEL: island,
                                HOSTNAME_LABEL: name,
                            },
                        )
                    )
    return clusters, nodes, flavors, [topology]


def queues() -> tuple[list[ClusterQueue], list[Cohort], list[LocalQueue]]:
    per_flavor = CLUSTERS * ISLANDS * NODES * GPUS // CLUSTER_QUEUES
    quotas = tuple(
        FlavorQuotas(
            f,
            {
                GPU: ResourceQuota(per_flavor),
                CPU: ResourceQuota(per_flavor * CPU_PER_GPU),
            },
        )
        for f in FLAVORS
    )
    group = ResourceGroup((GPU, CPU), quotas)
    preemption = PreemptionPolicy(
        within_cluster_queue="LowerPriority",
        reclaim_within_cohort="Any",
        borrow_within_cohort=BorrowWithinCohort("LowerPriority", max_priority_threshold=100),
    )
    cqs = [
        ClusterQueue(
            name=f"cq{q:04d}",
            resource_groups=(group,),
            cohort_name=f"cohort{q % COHORTS}",
            preemption=preemption,
        )
        for q in range(CLUSTER_QUEUES)
    ]
    cohorts = [Cohort(f"cohort{c}") for c in range(COHORTS)]
    lqs = [LocalQueue(f"ns-{cq.name}", "main", cq.name) for cq in cqs]
    return cqs, cohorts, lqs


def gangs(count: int, seed: int) -> list[Workload]:
    rng = random.Random(seed)
    result = []
    for n in range(count):
        gpus = rng.choices(SIZES, WEIGHTS)[0]
        per_pod = min(gpus, GPUS)
        pods = gpus // per_pod
        topology = TopologyRequest("required") if gpus >= GPUS else None
        pod_set = PodSet(
            name="main",
            count=pods,
            requests={GPU: per_pod, CPU: per_pod * CPU_PER_GPU},
            topology_request=topology,
        )
        q = rng.randrange(CLUSTER_QUEUES)
        result.append(
            Workload(
                namespace=f"ns-cq{q:04d}",
                name=f"job-{n:06d}",
                queue_name="main",
                pod_sets=(pod_set,),
                creation_time=rng.uniform(0, 3600),
                priority=rng.choice(PRIORITIES),
            )
        )
    return result


def snapshot(pending: int, seed: int, max_heads: int | None) -> Snapshot:
    clusters, nodes, flavors, topologies = fleet()
    cqs, cohorts, lqs = queues()
    return Snapshot(
        cluster_queues=cqs,
        resource_flavors=flavors,
        cohorts=cohorts,
        local_queues=lqs,
        topologies=topologies,
        clusters=clusters,
        nodes=nodes,
        pending=gangs(pending, seed),
        namespaces={lq.namespace: {} for lq in lqs},
        config=EngineConfig(max_heads_per_cluster_queue=max_heads),
    )


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_one(pending: int, seed: int, mode: str, repeat: int) -> dict[str, Any]:
    """Build the snapshot, run the cycle ``repeat`` times (it is pure), report the fastest."""
    snap = snapshot(pending, seed, 1 if mode == "baseline" else None)
    before = _rss_mib()
    times = []
    cpu = []
    result = None
    for _ in range(repeat):
        result = None  # let the previous cycle's result go before the next one
        gc.disable()  # as the service pauses the collector around a cycle
        try:
            started, started_cpu = time.perf_counter(), time.process_time()
            result = admission_cycle(snap, 3600.0)
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        finally:
            gc.enable()
    seconds = min(times)
    assert result is not None
    admitted = len(result.admissions)
    gpus = sum(
        a.admission.pod_set_assignments[0].resource_usage.get(GPU, 0) for a in result.admissions
    )
    reasons: dict[str, int] = {}
    for reason in result.pending.values():
        reasons[reason.reason] = reasons.get(reason.reason, 0) + 1
    return {
        "cycle_s": round(seconds, 3),
        "cycle_s_all": [round(t, 3) for t in times],
        "cycle_cpu_s": round(min(cpu), 3),
        "admitted": admitted,
        "admitted_gpus": gpus,
        "admissions_per_s": round(admitted / seconds, 1) if seconds > 0 else None,
        "peak_rss_mib": round(_rss_mib(), 1),
        "rss_before_cycle_mib": round(before, 1),
        "pending_reasons": dict(sorted(reasons.items())),
    }


def _child(pending: int, seed: int, mode: str, repeat: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", str(pending), "--mode", mode]
    out = subprocess.run(
        [*command, "--seed", str(seed), "--repeat", str(repeat)],
        check=True,
        capture_output=True,
        text=True,
    )
    parsed: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="cycles per size; the fastest counts")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="engine", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure_one(args.one, args.seed, args.mode, args.repeat)))
        return
    for size in (int(s) for s in args.sizes.split(",")):
        line: dict[str, Any] = {
            "pending": size,
            "fleet": {
                "clusters": CLUSTERS,
                "flavors": len(FLAVORS),
                "islands_per_flavor": ISLANDS,
                "nodes_per_island": NODES,
                "gpus_per_node": GPUS,
                "cluster_queues": CLUSTER_QUEUES,
                "cohorts": COHORTS,
            },
            "seed": args.seed,
        }
        for mode in ("engine", "baseline"):
            print(f"[bench] {size} pending, {mode}…", file=sys.stderr, flush=True)
            line[mode] = _child(size, args.seed, mode, args.repeat)
            print(f"[bench]   {line[mode]['cycle_s']} s", file=sys.stderr, flush=True)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
