"""Trace replay: the admission engine in virtual time, with no database.

``quartermaster sim replay --trace TRACE.csv --fleet FLEET.yaml --out RESULT.json
[--baseline fifo]`` reads a job trace (:mod:`sim.replay.trace`), runs the loop
of :mod:`sim.replay.loop` (arrivals, admission cycles, completions,
preemptions) and writes the metrics of :mod:`sim.replay.metrics`, with the
command that made them. Every engine option (fair sharing and its strategies,
admission fair sharing, the head ceiling, the cycle interval) is an option of
the command (:mod:`sim.replay.options`); the defaults are the engine's. The
tests and benchmarks reuse :func:`replay` and :class:`Simulator` directly.
"""

from __future__ import annotations

from sim.replay.loop import ReplayOptions, Simulator, fifo_fleet, replay
from sim.replay.trace import TraceJob, load_trace, stable_team

__all__ = [
    "ReplayOptions",
    "Simulator",
    "TraceJob",
    "fifo_fleet",
    "load_trace",
    "replay",
    "stable_team",
]
