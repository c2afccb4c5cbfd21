"""Flavor assignment modes and pending reasons, and how two modes compare.

A flavor's mode is ``(mode, borrow)``: the mode (``FIT`` best, ``NO_FIT``
worst) and the borrowing level (0 = within the ClusterQueue's nominal quota).

Reference: kueue ``pkg/scheduler/flavorassigner/flavorassigner.go``
(``FlavorAssignmentMode``, ``granularMode``, ``isPreferred``).
"""

from __future__ import annotations

from service.domain.quota import FlavorFungibility

__all__ = [
    "EXCEEDS_MAX_QUOTA",
    "FIT",
    "FITS_NOMINAL",
    "NO_CANDIDATES",
    "NO_FIT",
    "NO_MATCHING_FLAVOR",
    "PREEMPT",
    "RECLAIM",
    "SEVERITY",
    "TOPOLOGY_PLACEMENT_FAILED",
    "WAITING_FOR_CAPACITY",
    "WAITING_FOR_QUOTA",
    "is_preferred",
    "most_severe",
    "should_try_next",
    "worse",
]


NO_FIT, NO_CANDIDATES, PREEMPT, RECLAIM, FIT = 0, 1, 2, 3, 4
#: Fits without borrowing: no ``flavorFungibility`` setting looks further.
FITS_NOMINAL = (FIT, 0)

# Pending reasons, from most to least severe (Kueue's UnadmittedWorkloadsObservability).
NO_MATCHING_FLAVOR = "NoMatchingFlavor"
EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
TOPOLOGY_PLACEMENT_FAILED = "TopologyPlacementFailed"
WAITING_FOR_QUOTA = "WaitingForQuota"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
SEVERITY = {
    NO_MATCHING_FLAVOR: 5,
    EXCEEDS_MAX_QUOTA: 4,
    TOPOLOGY_PLACEMENT_FAILED: 3,
    WAITING_FOR_QUOTA: 2,
    WAITING_FOR_CAPACITY: 1,
    "": 0,
}


def worse(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """The less admissible of two (mode, borrow) pairs."""
    mode = min(a[0], b[0])
    return (mode, max(a[1], b[1]))


def is_preferred(a: tuple[int, int], b: tuple[int, int], fungibility: FlavorFungibility) -> bool:
    """Whether mode ``a`` beats ``b`` (Kueue ``isPreferred``)."""
    if a[0] == NO_FIT:
        return False
    if b[0] == NO_FIT:
        return True
    if (a[0] == NO_CANDIDATES) != (b[0] == NO_CANDIDATES):
        return a[0] != NO_CANDIDATES
    if fungibility.preference == "PreemptionOverBorrowing":
        if a[1] != b[1]:
            return a[1] < b[1]
        return a[0] > b[0]
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] < b[1]


def should_try_next(mode: tuple[int, int], fungibility: FlavorFungibility) -> bool:
    if mode[0] in (NO_FIT, NO_CANDIDATES):
        return True
    if mode[0] in (PREEMPT, RECLAIM) and fungibility.when_can_preempt == "TryNextFlavor":
        return True
    return mode[1] > 0 and fungibility.when_can_borrow == "TryNextFlavor"


def most_severe(a: str, b: str) -> str:
    return a if SEVERITY.get(a, 0) >= SEVERITY.get(b, 0) else b
