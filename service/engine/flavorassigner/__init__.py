"""Flavor assignment with ``flavorFungibility``, checking quota and physical room.

For each pod set and each resource group it needs, flavors are tried in the
ClusterQueue's order. Each gets a mode — ``FIT`` (quota and room now),
``RECLAIM``/``PREEMPT`` (room after evicting victims found by the preemption
search), ``NO_CANDIDATES`` (would need preemption but nobody may be evicted),
``NO_FIT`` — and a *borrowing level* (0 = within the ClusterQueue's nominal
quota; higher = quota from further up the cohort tree). ``whenCanBorrow`` /
``whenCanPreempt`` decide whether to stop at a flavor that borrows or needs
preemption, ``preference`` which of two imperfect flavors wins.

Kueue checks physical room only after choosing the flavor (TAS); across many
clusters a flavor that has quota but no room anywhere is as good as one that
needs preemption, so the physical check is part of each flavor's mode.

Modules, top down: ``assigner`` (a whole gang) over ``search`` (one resource
group of one pod set) and ``plans`` (fast paths for one-pod-set gangs) over
``fits`` (quota checks) and ``matching`` (taints, labels, topology) over
``assignment`` (the result) over ``modes``.

Reference: kueue ``pkg/scheduler/flavorassigner/flavorassigner.go``.
"""

from __future__ import annotations

from service.engine.flavorassigner.assigner import assign_flavors
from service.engine.flavorassigner.assignment import (
    Assignment,
    Oracle,
    PreemptionPlan,
    render_quota_note,
)
from service.engine.flavorassigner.matching import describe_shape, flavor_mismatch
from service.engine.flavorassigner.modes import (
    EXCEEDS_MAX_QUOTA,
    FIT,
    NO_CANDIDATES,
    NO_FIT,
    NO_MATCHING_FLAVOR,
    PREEMPT,
    RECLAIM,
    TOPOLOGY_PLACEMENT_FAILED,
    WAITING_FOR_CAPACITY,
    WAITING_FOR_QUOTA,
)
from service.engine.flavorassigner.plans import admit_simply, flavor_plan, quota_mode_only

__all__ = [
    "EXCEEDS_MAX_QUOTA",
    "FIT",
    "NO_CANDIDATES",
    "NO_FIT",
    "NO_MATCHING_FLAVOR",
    "PREEMPT",
    "RECLAIM",
    "TOPOLOGY_PLACEMENT_FAILED",
    "WAITING_FOR_CAPACITY",
    "WAITING_FOR_QUOTA",
    "Assignment",
    "Oracle",
    "PreemptionPlan",
    "admit_simply",
    "assign_flavors",
    "describe_shape",
    "flavor_mismatch",
    "flavor_plan",
    "quota_mode_only",
    "render_quota_note",
]
