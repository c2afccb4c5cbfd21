"""A repeatable fault run: the whole stack under load through every fault,
checked from the ledger and the members (issue 18, "Must show").

    flock /tmp/qm-bench.lock .venv/bin/python bench/chaos.py --out bench/results/chaos.json

The stack, the load, the faults and the checks are those of
tests/workers/chaos/ (its docstring says each): two API processes, a
Celery worker, two schedulers, three stand-in members with fence agents, a
private Postgres and Redis; a client submitting gangs at ``--rate`` with
Idempotency-Keys, cancelling every ``--cancel-every``-th a few seconds after
its 201, every ``--high-every``-th of a high priority, teams holding
``--nominal-fraction`` of the fleet with as much again to borrow (so the
scheduler reclaims and preempts); then, one after another under that load, a worker, the
admission leader and an API process SIGKILLed, Redis killed and started
empty, Postgres crashed and started, a member partitioned from the centre
(its fence agent running on) until its gangs run elsewhere, then healed,
and the busiest member killed for good. Then the load
stops, every in-doubt submission is settled, every acknowledged gang is
waited for until it has finished, and the checks run: lost = ∅,
unexpected = ∅, no gang admitted twice without a release between, no gang
running in two clusters at once, the ledger's open usage = what the
members run, the ledger verifies and matches the events.

A line per phase and per fault on stderr, then the table of checks; one
JSON document on stdout (``--out`` also writes it). The exit status is 1
when a check found a problem.

To see the checks catch what they are for: ``--agents=`` (no fence agents:
the partitioned member's gangs run on there while the centre requeues them
elsewhere, and "running in two clusters at once" fails) and ``--rogue 3``
(workloads created behind the client's back: "unexpected" fails).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.workers.chaos import FAULTS, MEMBERS, Runner, Size  # noqa: E402


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rate", type=float, default=1.0, help="submissions per second")
    parser.add_argument("--warmup", type=float, default=20.0, help="load before the first fault")
    parser.add_argument("--between", type=float, default=10.0, help="load after each recovery")
    parser.add_argument("--run-seconds", default="2,8", help="a gang runs this long (low,high)")
    parser.add_argument("--nodes", type=int, default=6, help="8-GPU nodes per member")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--faults", default=",".join(FAULTS), help="which, in their order")
    parser.add_argument("--agents", default=",".join(MEMBERS), help="members with a fence agent")
    parser.add_argument("--rogue", type=int, default=0, help="workloads no client submitted")
    parser.add_argument("--cancel-every", type=int, default=7, help="cancel every n-th (0: none)")
    parser.add_argument("--high-every", type=int, default=5, help="every n-th gang high priority")
    parser.add_argument(
        "--nominal-fraction",
        type=float,
        default=0.5,
        help="each team's nominal share of the fleet (as much again to borrow, reclaimable)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    low, high = (float(x) for x in args.run_seconds.split(","))
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise SystemExit(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    size = Size(
        rate=args.rate,
        warmup=args.warmup,
        between=args.between,
        run_seconds=(low, high),
        nodes=args.nodes,
        seed=args.seed,
        agents=tuple(a for a in args.agents.split(",") if a),
        faults=faults,
        rogue=args.rogue,
        cancel_every=args.cancel_every,
        high_every=args.high_every,
        nominal_fraction=args.nominal_fraction,
        preemption=args.high_every > 0 or args.nominal_fraction < 1,
    )
    workdir = Path(tempfile.mkdtemp(prefix="qm-chaos-"))
    try:
        run = Runner(workdir, size).execute()
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    document = {"bench": "chaos", "command": " ".join(sys.argv[1:]), **run.to_json()}
    document["processes_left"] = run.processes_left
    text = json.dumps(document, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    sys.exit(0 if run.ok and not run.processes_left else 1)


if __name__ == "__main__":
    main()
