"""Fair sharing: Kueue's weighted dominant resource share, and admission fair sharing.

*DRS* of a node (ClusterQueue or Cohort) with a parent: for every resource, the
amount it uses above its subtree quota (borrowed), summed over flavors, divided
by what its parent could lend of that resource (``potential_available`` of the
parent, summed over flavors), times 1000; the largest ratio, divided by the
node's weight. A zero weight that borrows is infinitely unfair. A lower share
goes first in admission and is preempted last.

Reference: kueue ``pkg/cache/scheduler/fair_sharing.go``.

*Admission fair sharing* orders workloads within a ClusterQueue by the decayed
historical usage of their LocalQueue: ``u ← u*(1-alpha) + current*alpha`` with
``alpha = 1 - 0.5^(Δt / half_life)`` (Kueue KEP-4136).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from service.engine.quota import FlavorResource, QuotaNode

__all__ = [
    "ZERO_SHARE",
    "Share",
    "decay_factor",
    "decayed_usage",
    "dominant_resource_share",
    "lendable",
    "weighted_usage",
]

#: ``(zero_weight_borrows, value)``: tuples order an infinite share above any finite one.
Share = tuple[int, float]
ZERO_SHARE: Share = (0, 0.0)


def lendable(parent: QuotaNode, cache: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per resource, what ``parent`` could lend to a child at most (usage-independent)."""
    cached = cache.get(parent.name)
    if cached is not None:
        return cached
    root = parent.root()
    result: dict[str, int] = {}
    for fr in root.subtree_quota:
        result[fr[1]] = result.get(fr[1], 0) + parent.potential_available(fr)
    cache[parent.name] = result
    return result


def dominant_resource_share(
    node: QuotaNode,
    lendable_cache: dict[str, dict[str, int]],
    extra: Mapping[FlavorResource, int] | None = None,
) -> Share:
    """The node's weighted DRS, optionally as if ``extra`` usage were added to it."""
    parent = node.parent
    if parent is None:
        return ZERO_SHARE
    borrowed: dict[str, int] = {}
    usage = node.usage
    for fr, quota in node.subtree_quota.items():
        amount = usage.get(fr, 0) - quota
        if extra:
            amount += extra.get(fr, 0)
        if amount > 0:
            borrowed[fr[1]] = borrowed.get(fr[1], 0) + amount
    if not borrowed:
        return ZERO_SHARE
    if node.fair_weight == 0:
        ratio = _ratio(borrowed, lendable(parent, lendable_cache))
        return (1, ratio)
    return (0, _ratio(borrowed, lendable(parent, lendable_cache)) / node.fair_weight)


def _ratio(borrowed: Mapping[str, int], lendable_amounts: Mapping[str, int]) -> float:
    best = 0.0
    for resource, amount in borrowed.items():
        lend = lendable_amounts.get(resource, 0)
        if lend > 0:
            best = max(best, amount * 1000.0 / lend)
    return best


def decay_factor(elapsed_seconds: float, half_life_seconds: float) -> float:
    """``alpha`` of the exponential moving average: the weight of the newest sample."""
    if half_life_seconds <= 0:
        return 1.0
    if elapsed_seconds <= 0:
        return 0.0
    return 1.0 - math.pow(0.5, elapsed_seconds / half_life_seconds)


def decayed_usage(
    consumed: Mapping[str, float],
    current: Mapping[str, int],
    elapsed_seconds: float,
    half_life_seconds: float,
) -> dict[str, float]:
    """Blend the stored history with the current usage over ``elapsed_seconds``."""
    alpha = decay_factor(elapsed_seconds, half_life_seconds)
    result: dict[str, float] = {}
    for resource in sorted(set(consumed) | set(current)):
        value = consumed.get(resource, 0.0) * (1.0 - alpha) + current.get(resource, 0) * alpha
        if value > 0:
            result[resource] = value
    return result


_DEFAULT_SCALE = {"cpu": 1000.0, "memory": float(2**30)}


def weighted_usage(
    consumed: Mapping[str, float], weights: Mapping[str, float], queue_weight: float
) -> float:
    """One number to order LocalQueues by: weighted usage over the queue's weight.

    Without configured weights every resource weighs 1, cpu counted in cores
    and memory in GiB. A queue of weight 0 sorts last once it has any usage.
    """
    total = 0.0
    if weights:
        for resource, value in consumed.items():
            total += weights.get(resource, 0.0) * value
    else:
        for resource, value in consumed.items():
            total += value / _DEFAULT_SCALE.get(resource, 1.0)
    if queue_weight <= 0:
        return math.inf if total > 0 else 0.0
    return total / queue_weight
