"""Whether a gang waits only because the fleet's free room is scattered over islands.

A pod set that must land in one island, whose quota fits and whose request
the eligible islands' free total (in the primary resource, e.g. GPUs) covers,
but that no single island can hold now, is *fragmented*: freeing the right
island would admit it, while more quota would not (issue 24; kueue#5243,
#12478). The cycle decides exactly as before; this only tells it apart in the
pending reason (``cause``), in explain and in the metrics.

Kueue's reason code stays ``WaitingForCapacity`` (a gang that may fit later
waits for capacity either way); the cause beside it is ours, as
``TooBigForAnyIsland`` is.
"""

from __future__ import annotations

from service.engine.packing import PodSetRequest
from service.engine.types import Fragmentation

__all__ = ["FRAGMENTED_ACROSS_ISLANDS", "Fragmentation", "fragmentation_of"]

#: The pending reason's cause for a gang blocked only by fragmentation.
FRAGMENTED_ACROSS_ISLANDS = "FragmentedAcrossIslands"


def fragmentation_of(request: PodSetRequest, flavor: str) -> Fragmentation | None:
    """The fragmentation of a pod set that found no room now, or ``None`` when it
    may spread, asks below the island level, or the free total does not cover it."""
    if request.mode != "required" or request.level is not None:
        return None
    islands = sorted(request.eligible.values(), key=lambda i: i.seq)
    primary = next((i.primary for i in islands if i.primary), None)
    if primary is None:
        return None
    requested = request.amounts.get(primary, 0) * request.count
    if requested <= 0:
        return None
    free = [(i.primary_free(), i) for i in islands if i.primary == primary]
    fleet_free = sum(f for f, _ in free)
    if fleet_free < requested:
        return None
    largest, island = max(free, key=lambda p: (p[0], -p[1].seq))
    return Fragmentation(
        flavor, primary, requested, fleet_free, largest, f"{island.cluster}/{island.name}"
    )
