"""What a replay reports: waits, utilisation, fairness, preemptions, island violations.

``jain_fairness`` is Jain's index ``(Σx)² / (n·Σx²)`` over teams, where ``x``
is a team's GPU-time received divided by its *entitlement*: its weighted
max-min fair share of all GPU-time delivered, capped by its own demand (the
GPU-time its jobs asked for). Weights are the teams' nominal GPU quotas. A
team that asked for less than its quota is entitled to what it asked for, so
1.0 means every team got what it was due; lower means some got more at the
expense of others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["jain_index", "percentile", "weighted_max_min"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100), nearest-rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


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
