"""Standalone start-up: ``quartermaster standalone`` from nothing to ready.

    .venv/bin/python bench/standalone.py [--runs 3] [--target 30]

Each run starts ``quartermaster standalone`` on a fresh data directory
(embedded Postgres and Redis initialised, migrations, the seeded fleet) and
again on the same directory (resumed), and times each until it prints its
ready block; then stops it with Ctrl-C (SIGINT to its process group). The
target (README: ready in well under 30 s) is this bench's, not a test's: on
a busy machine the tests wait for readiness without a deadline.
Progress goes to stderr; one JSON line to stdout, with ``load_1m`` as the
runs began and ended.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.runtime.embedded import free_port  # noqa: E402
from tests.standalone.test_standalone import OURS, Standalone  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def one_run(root: Path) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env["QMCTL_CONFIG"] = str(root / "qmctl-config")
    data, port = root / "data", free_port()
    times = []
    for _ in ("fresh", "resumed"):
        run = Standalone(data, port, env)
        try:
            times.append(run.startup)
        finally:
            run.interrupt()
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", type=float, default=30.0)
    args = parser.parse_args()
    began_load = os.getloadavg()[0]
    fresh, resumed = [], []
    for n in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="qm-bench-standalone-") as where:
            a, b = one_run(Path(where))
        fresh.append(a)
        resumed.append(b)
        log(f"run {n + 1}: fresh {a:.1f} s, resumed {b:.1f} s")

    def summary(times: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(times), 2), "max": round(max(times), 2)}

    result = {
        "bench": "standalone",
        "runs": args.runs,
        "fresh_ready_s": summary(fresh),
        "resumed_ready_s": summary(resumed),
        "target_s": args.target,
        "met": max(fresh) < args.target and max(resumed) < args.target,
        "load_1m": [round(began_load, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
