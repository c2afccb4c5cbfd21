"""Whether a pod set may use a flavor at all (taints, node labels, topology).

Reference: kueue ``pkg/scheduler/flavorassigner/flavorassigner.go``
(``checkFlavorForPodSets``).
"""

from __future__ import annotations

from service.domain.quantity import format_amount
from service.domain.quota import ResourceFlavor
from service.engine.placement import tolerates
from service.engine.state import CycleState
from service.engine.workload_info import PodSetInfo

__all__ = ["describe_shape", "flavor_mismatch", "known_mismatch", "never_fits_message"]


def flavor_mismatch(
    state: CycleState, flavor: ResourceFlavor | None, name: str, ps: PodSetInfo
) -> str | None:
    if flavor is None:
        return f"flavor {name} not found"
    tolerations = tuple(ps.tolerations) + tuple(flavor.tolerations)
    for taint in flavor.node_taints:
        if taint.effect != "PreferNoSchedule" and not tolerates((taint,), tolerations):
            return f"untolerated taint {taint.key}={taint.value}:{taint.effect} in flavor {name}"
    for key, value in ps.node_selector.items():
        if key in flavor.node_labels and flavor.node_labels[key] != value:
            return f"flavor {name} doesn't match node affinity"
    if ps.mode != "unconstrained":
        topology = state.topologies.get(flavor.topology_name or "")
        if topology is None:
            return f"flavor {name} does not support TopologyAwareScheduling"
        if ps.level is not None and ps.level not in topology.levels:
            return f"flavor {name} does not contain the requested level {ps.level}"
    return None


def known_mismatch(state: CycleState, name: str, ps: PodSetInfo) -> str | None:
    """``flavor_mismatch``, memoised per flavor and pod-set constraints."""
    key = (name, ps.tolerations, ps.selector_items, ps.mode, ps.level)
    cache = state.mismatch_cache
    if key in cache:
        return cache[key]
    found = cache[key] = flavor_mismatch(state, state.flavors.get(name), name, ps)
    return found


def describe_shape(ps: PodSetInfo) -> str:
    return "{" + ", ".join(f"{r}: {format_amount(r, a)}" for r, a in ps.shape) + "}"


def never_fits_message(ps: PodSetInfo, flavor: str) -> str:
    where = "one island" if ps.mode == "required" else "one cluster"
    return (
        f"no schedulable cluster in flavor {flavor} could hold {ps.count} pod(s) of "
        f"{describe_shape(ps)} within {where}, even if it were empty"
    )
