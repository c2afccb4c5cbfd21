"""SHA-256 digests of the engine's CycleResults: a refactor changes no decision.

    .venv/bin/python bench/digest.py --trace /tmp/traces/cluster04.csv [--out FILE]
        [--spread-packing ClusterFirst]

Digests (of each result's ``repr``) over the benchmark's synthetic snapshots
(bench/engine.py's fleet, sizes 1,000 and 10,000, two seeds) and over every
cycle of the ITP cluster04 replay (sim/fleets/itp-cluster04.yaml): one for the
decisions alone (admissions, preemptions, evictions) and one for the whole
result (pending reasons and admission fair-sharing usage too). Run it on two
commits (a ``git worktree`` of the older one, this file copied in) and compare.
``--spread-packing`` runs every cycle with that ``EngineConfig.spread_packing``
(``ClusterFirst``: the placement before issue 24, to show it is unchanged).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import snapshot  # bench/engine.py: the benchmark's fleet and gangs

from service.engine import CycleResult, admission_cycle

SIZES, SEEDS = (1000, 10000), (7, 11)
#: ``--spread-packing``, when given: set on every snapshot's config.
SPREAD: list[str] = []


def configured(snap: Any) -> Any:
    if not SPREAD:
        return snap
    config = dataclasses.replace(snap.config, spread_packing=SPREAD[0])
    return dataclasses.replace(snap, config=config)


class Digest:
    """Running digests of decisions and of whole results."""

    def __init__(self) -> None:
        self.decisions = hashlib.sha256()
        self.whole = hashlib.sha256()
        self.cycles = 0

    def add(self, result: CycleResult) -> None:
        decided = (result.admissions, result.preemptions, result.evictions)
        self.decisions.update(repr(decided).encode())
        self.whole.update(repr(result).encode())
        self.cycles += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "cycles": self.cycles,
            "decisions_sha256": self.decisions.hexdigest(),
            "whole_sha256": self.whole.hexdigest(),
        }


def snapshots() -> dict[str, Any]:
    digest = Digest()
    for size in SIZES:
        for seed in SEEDS:
            digest.add(admission_cycle(configured(snapshot(size, seed, None)), 3600.0))
            print(f"snapshot {size} seed {seed}", file=sys.stderr)
    return digest.as_dict()


def replay(trace: Path) -> dict[str, Any]:
    from sim.fleet import load_fleet
    from sim.replay import loop
    from sim.replay.trace import load_trace

    digest = Digest()
    cycle = loop.admission_cycle

    def digesting(snap: Any, now: float) -> CycleResult:
        result = cycle(configured(snap), now)
        digest.add(result)
        return result

    loop.admission_cycle = digesting  # type: ignore[assignment]
    fleet = load_fleet(Path("sim/fleets/itp-cluster04.yaml"))
    loop.replay(fleet, load_trace(trace, None))
    return digest.as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="the ITP cluster04.csv")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--spread-packing", choices=("IslandFirst", "ClusterFirst"))
    args = parser.parse_args()
    if args.spread_packing:
        SPREAD.append(args.spread_packing)
    started = time.monotonic()
    result = {"snapshots": snapshots(), "replay_cluster04": replay(args.trace)}
    result["seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
