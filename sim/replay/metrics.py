"""What a replay reports: waits, utilisation, fairness, preemptions, island violations.

``mean_wait_s`` / ``p95_wait_s`` (kept for older results): from submission to
the job's first admission, over admitted jobs; the same as ``first_wait_s``.
The honest figures, each as ``mean`` / ``p50`` / ``p95`` / ``p99`` / ``max``
(:func:`summary`), over the jobs that completed:

* ``wait_s``: every wait of the job — from submission to its first admission,
  plus, after each preemption or eviction, from its re-queue to its next
  admission;
* ``delay_s``: finish - submission - duration, i.e. every wait *and* the run
  time that a preemption threw away (preempted jobs restart from zero);
* ``by_size`` / ``by_team``: the same three per GPU size class
  (:func:`size_class`) and per team, with the class's job count.

``gpu_utilization``: GPU-seconds of every run, finished or preempted,
over fleet GPUs times the makespan (first submission to last completion);
``goodput_utilization`` leaves out runs that were preempted.

Fairness is Jain's index ``(Σx)² / (n·Σx²)`` over teams, where ``x`` is a
team's GPU-time received divided by its *entitlement*: its weighted max-min
fair share of the GPU-time delivered, capped by its own demand. Weights are the
teams' nominal GPU quotas. A team that asked for less than its quota is
entitled to what it asked for, so 1.0 means every team got what it was due;
lower means some got more at the expense of others.

Over a whole trace nearly every team gets all it asked for, so the index is
taken where it means something: ``jain_fairness`` is the mean, weighted by
GPU-time delivered, of the index over *contended* windows (by default one
hour) — those in which the teams' demand (GPUs of their waiting and running
jobs, times the time they were there) exceeded the fleet. Over the whole run
it is ``jain_fairness_whole_run``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = [
    "SIZE_CLASSES",
    "contended_jain",
    "jain_index",
    "percentile",
    "size_class",
    "summary",
    "weighted_max_min",
]

#: Upper bounds (GPUs) and names of the size classes. A size between two
#: bounds goes to the class above it (12 GPUs count as "9-16", 48 as "33-64");
#: the ITP traces hold only 1, 2, 4, 8, 16, 32 and 64.
SIZE_CLASSES: tuple[tuple[int, str], ...] = (
    (1, "1"),
    (8, "2-8"),
    (16, "9-16"),
    (32, "17-32"),
    (64, "33-64"),
)

#: ``(team, gpus, start, end)``.
Interval = tuple[str, int, float, float]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100), nearest-rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def size_class(gpus: int) -> str:
    """The size class of a job of ``gpus`` GPUs (see :data:`SIZE_CLASSES`)."""
    for bound, name in SIZE_CLASSES:
        if gpus <= bound:
            return name
    return f">{SIZE_CLASSES[-1][0]}"


def summary(values: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p95, p99 and max of ``values``, rounded to 0.1 (0 for none)."""
    if not values:
        return dict.fromkeys(("mean", "p50", "p95", "p99", "max"), 0.0)
    return {
        "mean": round(sum(values) / len(values), 1),
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(float(max(values)), 1),
    }


def weighted_max_min(
    total: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Water-filling: split ``total`` by weight, never giving a team more than it asked."""
    share = dict.fromkeys(demands, 0.0)
    active = {t for t, d in demands.items() if d > 0 and weights.get(t, 0) > 0}
    left = total
    while active and left > 1e-9:
        weight = sum(weights[t] for t in active)
        step = {t: left * weights[t] / weight for t in active}
        left = 0.0
        for team in sorted(active):
            room = demands[team] - share[team]
            if step[team] >= room:
                share[team] = demands[team]
                left += step[team] - room
                active.discard(team)
            else:
                share[team] += step[team]
    return share


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values`` (1.0 when all equal; 1.0 for none)."""
    if not values:
        return 1.0
    square = sum(v * v for v in values)
    if square == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square)


def _spread(target: dict[int, dict[str, float]], interval: Interval, window: float) -> None:
    team, gpus, start, end = interval
    index = int(start // window)
    while start < end:
        edge = min(end, (index + 1) * window)
        bucket = target.setdefault(index, {})
        bucket[team] = bucket.get(team, 0.0) + gpus * (edge - start)
        start = edge
        index += 1


def contended_jain(
    runs: Sequence[Interval],
    presence: Sequence[Interval],
    weights: Mapping[str, float],
    capacity_gpus: float,
    window: float,
) -> tuple[float, int]:
    """Mean Jain index over contended windows (see the module docstring), and their number."""
    received: dict[int, dict[str, float]] = {}
    demand: dict[int, dict[str, float]] = {}
    for run in runs:
        _spread(received, run, window)
    for job in presence:
        _spread(demand, job, window)
    total = weighted = 0.0
    contended = 0
    for index, wanted in demand.items():
        if sum(wanted.values()) <= capacity_gpus * window:
            continue
        contended += 1
        got = received.get(index, {})
        delivered = sum(got.values())
        fair = weighted_max_min(delivered, wanted, weights)
        ratios = [got.get(t, 0.0) / fair[t] for t in sorted(fair) if fair[t] > 0]
        weighted += jain_index(ratios) * delivered
        total += delivered
    return (weighted / total if total else 1.0), contended
