"""Kueue's scheduler performance scenarios through our whole stack.

    flock /tmp/qm-bench.lock .venv/bin/python -m bench.kueue_perf --config baseline \\
        --out bench/results/kueue_perf.json

``--config`` is one of Kueue's ``test/performance/scheduler/configs``
(``baseline``, ``large-scale``, ``tas``; :mod:`bench.kueue_perf.configs`);
``--members 3`` splits the same nodes over three members (MultiKueue's
shape) and ``--kill-at S`` SIGKILLs the busiest one S seconds after the
start (cluster-loss recovery, ``QM_CLUSTER_LEASE`` 60 s). ``--cohorts``,
``--queues`` and ``--scale`` shrink a config (the smoke test's). Progress on
stderr; one JSON line on stdout: our figures beside Kueue's published ones
and the physical limit, and the checks; ``--out`` keeps one line per config
and variant in that file (replacing the same one's). Exit status 1 when a
check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.kueue_perf.configs import (
    CONFIGS,
    KUEUE_COMMIT,
    KUEUE_SETUP,
    PUBLISHED,
    Config,
    physical_limit,
)
from bench.kueue_perf.manifests import UNSUPPORTED
from bench.kueue_perf.measure import figures
from bench.kueue_perf.run import API_ENV, ENV, Options, execute


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kueue_perf", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--config", choices=sorted(CONFIGS), default="baseline")
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument(
        "--stand-ins",
        choices=("controllers", "api"),
        default="controllers",
        help="members run each pod, or serve their API only with the bench as kubelet",
    )
    parser.add_argument("--kill-at", type=float, default=None, help="s after the start")
    parser.add_argument("--cohorts", type=int, default=None)
    parser.add_argument("--queues", type=int, default=None, help="ClusterQueues per cohort")
    parser.add_argument("--scale", type=float, default=1.0, help="workloads per set, x")
    parser.add_argument("--capacity-factor", type=float, default=None)
    parser.add_argument("--api-processes", type=int, default=2)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--py-spy", default=None, help="a py-spy binary: profile every part")
    parser.add_argument("--profile-dir", type=Path, default=None, help="keep py-spy's stacks")
    parser.add_argument("--env", default="{}", help="JSON of extra QM_ settings")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def sized(args: argparse.Namespace) -> Config:
    config = CONFIGS[args.config]
    if args.cohorts or args.queues or args.scale != 1.0:
        config = config.scaled(args.cohorts, args.queues, args.scale)
    return config


def variant(args: argparse.Namespace, config: Config) -> str:
    full = CONFIGS[args.config]
    parts = [f"{args.members} member{'s' if args.members > 1 else ''}"]
    if args.stand_ins == "api":
        parts.append("stand-ins serve their API only, the bench completes each job")
    if args.kill_at is not None:
        parts.append(f"one killed at {args.kill_at:g} s")
    if config != full:
        parts.append(f"scaled to {config.workloads} workloads")
    if args.py_spy:
        parts.append("profiled (py-spy)")
    return ", ".join(parts)


def compare(ours: dict[str, Any], kueue: dict[str, Any], limit: dict[str, Any]) -> dict[str, Any]:
    """Ratios of ours to Kueue's means and to the limit (> 1: slower)."""
    classes = ours["classes"]
    means = kueue["time_to_admission_s_mean"]
    return {
        "wall_over_kueue": round(ours["wall_s"] / kueue["wall_s_mean"], 2),
        "wall_over_limit": round(ours["wall_s"] / limit["limit_s"], 2),
        "kueue_wall_over_limit": round(kueue["wall_s_mean"] / limit["limit_s"], 2),
        "usage_pct_minus_kueue": round(
            (ours["usage"]["usage_pct"] or 0) - kueue["usage_pct_mean"], 1
        ),
        "mean_time_to_admission_over_kueue": {
            name: round(classes[name]["time_to_admission_s"]["mean"] / means[name], 2)
            for name in means
            if name in classes and classes[name]["time_to_admission_s"]["mean"] is not None
        },
    }


def document(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    config = sized(args)
    env = {**ENV, **(API_ENV if args.stand_ins == "api" else {}), **json.loads(args.env)}
    capacity = args.capacity_factor or (2.0 if args.members > 1 else 1.5)
    load_before = os.getloadavg()
    began = time.time()
    raw = execute(
        Options(
            config=config,
            members=args.members,
            capacity_factor=capacity,
            api_processes=args.api_processes,
            worker_concurrency=args.worker_concurrency,
            connections=args.connections,
            kill_at=args.kill_at,
            timeout=args.timeout,
            env=env,
            py_spy=args.py_spy,
            profile_dir=args.profile_dir,
            stand_ins=args.stand_ins,
        )
    )
    ours = figures(raw)
    limit = physical_limit(config)
    kueue = {**PUBLISHED[args.config], "setup": KUEUE_SETUP, "commit": KUEUE_COMMIT}
    doc: dict[str, Any] = {
        "bench": "kueue_perf",
        "config": args.config,
        "variant": variant(args, config),
        "command": "flock /tmp/qm-bench.lock .venv/bin/python -m bench.kueue_perf "
        + " ".join(argv),
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "shape": {
            "cohorts": config.cohorts,
            "cluster_queues": config.cluster_queues,
            "workloads": config.workloads,
            "members": args.members,
            "nodes": raw.nodes,
            "node_cpu": 96,
            "capacity_over_quota": round(
                raw.nodes * 96 / (config.cluster_queues * config.nominal_milli / 1000), 2
            ),
        },
        "ours": ours,
        "kueue": kueue,
        "physical_limit": limit,
        "compared": compare(ours, kueue, limit) if config == CONFIGS[args.config] else None,
        "unsupported": {
            k: v for k, v in UNSUPPORTED.items() if any(c.tas == k for c in config.classes)
        },
        "settings": env,
        "stack": {
            "api_processes": args.api_processes,
            "workers": 1,
            "worker_concurrency": args.worker_concurrency,
            "scheduler": 1,
            "postgres": "private pg_ctl, synchronous_commit on, fsync off",
            "redis": "private, no persistence",
            "stand_ins": (
                "sim cluster with controllers (scheduler, kubelet, Job controller, Kueue-like "
                "admission), --time-scale 1, one process per member"
                if args.stand_ins == "controllers"
                else "sim cluster --no-controllers (API server only), one process per member; "
                "the bench marks each Job Complete its runtime after it appeared "
                "(bench/kueue_perf/kubelet.py)"
            ),
        },
        "box": {
            "cpus": os.cpu_count(),
            "shared": "shared with other agents' work while it ran; read figures with that in mind",
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_during": raw.load_average,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(time.time() - began, 1),
        },
        "profiles": raw.profiles or None,
    }
    return doc


def keep(out: Path, doc: dict[str, Any]) -> None:
    """One line per (config, variant) in ``out``: this run's replaces the same one's."""
    lines = []
    if out.exists():
        for line in out.read_text().splitlines():
            if not line.strip():
                continue
            old = json.loads(line)
            if (old.get("config"), old.get("variant")) != (doc["config"], doc["variant"]):
                lines.append(line)
    lines.append(json.dumps(doc))
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = arguments(argv)
    doc = document(args, argv)
    line = json.dumps(doc)
    print(line, flush=True)
    if args.out is not None:
        keep(args.out, doc)
    return 0 if doc["ours"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
