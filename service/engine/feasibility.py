"""Whether a gang could ever be admitted, and if not, why: its true cause.

A gang is *unsatisfiable* when some pod set of it fits no flavor its
ClusterQueue offers even on an empty fleet: the flavor's node labels match no
node, no island (or cluster) could hold it if nothing else ran, or it asks for
more than the ClusterQueue could ever use (nominal plus what it may borrow).
Such a gang waits for ever; saying "N more needed" sends its owner waiting.

The verdict only explains: the cycle decides exactly as before and attaches it
to the pending reason (``result._WhyNot._reason``), and the service uses
it at submission (a ClusterQueue's ``unsatisfiable: Refuse``) and in explain.
"Empty" means no admitted gang holds capacity: what pods Quartermaster does
not manage reserve (``Node.reserved``) is not counted, and unschedulable nodes
and clusters are left out, as the cycle leaves them out.

A fleet without any member cluster is not judged on placement (it is being
set up; quota still is). Multi-pod-set gangs are judged pod set by pod set: a
gang whose pod sets each fit but not all together is not called unsatisfiable
(a conservative verdict: never "can never fit" for a gang that can).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from service.domain.inventory import HOSTNAME_LABEL
from service.domain.quantity import format_amount
from service.domain.workload import Workload
from service.engine.flavorassigner import (
    EXCEEDS_MAX_QUOTA,
    NO_MATCHING_FLAVOR,
    TOPOLOGY_PLACEMENT_FAILED,
    describe_shape,
    flavor_mismatch,
    render_quota_note,
)
from service.engine.packing import PodSetRequest, pristine_capacity_of, pristine_fits
from service.engine.placement import Island, pods_fitting, tolerates
from service.engine.state import CQState, CycleState
from service.engine.types import Snapshot
from service.engine.workload_info import PodSetInfo, WorkloadInfo

__all__ = [
    "NO_NODE_WITH_FLAVOR_LABELS",
    "QUOTA_NEVER_COVERS",
    "TOO_BIG_FOR_ANY_CLUSTER",
    "TOO_BIG_FOR_ANY_ISLAND",
    "Largest",
    "Verdict",
    "never_fits",
    "never_fits_in",
]

#: Causes (``Verdict.cause``); the Kueue reason code goes beside each.
TOO_BIG_FOR_ANY_ISLAND = "TooBigForAnyIsland"
TOO_BIG_FOR_ANY_CLUSTER = "TooBigForAnyCluster"
NO_NODE_WITH_FLAVOR_LABELS = "NoNodeWithFlavorLabels"
QUOTA_NEVER_COVERS = "QuotaNeverCovers"
FLAVOR_NEVER_MATCHES = "FlavorNeverMatches"
_SEVERITY = {
    FLAVOR_NEVER_MATCHES: 5,
    NO_NODE_WITH_FLAVOR_LABELS: 4,
    QUOTA_NEVER_COVERS: 3,
    TOO_BIG_FOR_ANY_ISLAND: 2,
    TOO_BIG_FOR_ANY_CLUSTER: 1,
}


@dataclass(frozen=True, slots=True)
class Largest:
    """The biggest place a too-big pod set could have gone, on an empty fleet."""

    flavor: str
    cluster: str
    #: The island (or lower domain) for a pod set that must stay in one; ``None``: a cluster.
    domain: str | None
    pods: int
    #: The domain's capacity in the pod set's primary resource (e.g. GPUs), if it has one.
    resources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a gang can never be admitted: Kueue's reason code, our cause, the words."""

    reason: str
    cause: str
    message: str
    largest: Largest | None = None


@dataclass(frozen=True, slots=True)
class _Problem:
    reason: str
    cause: str
    message: str
    largest: Largest | None = None


def never_fits_in(snapshot: Snapshot, workload: Workload, cluster_queue: str) -> Verdict | None:
    """``never_fits`` for one workload of ``cluster_queue`` against a snapshot's
    fleet and quota (the admitted workloads of the snapshot are ignored)."""
    state = CycleState(snapshot, 0.0)
    cq = state.cqs.get(cluster_queue)
    if cq is None:
        return None
    wi = WorkloadInfo(workload, 0, 0, workload.key, state.gang_shape(workload))
    wi.cq = cq
    return never_fits(state, wi)


def never_fits(state: CycleState, wi: WorkloadInfo) -> Verdict | None:
    """The verdict on a queued gang, or ``None`` when an empty fleet could admit it.

    Reads only what no admission changes within a cycle (pristine capacity,
    node labels, the most quota could give), so it may run at any point.
    """
    cq = wi.cq
    assert cq is not None
    for index, ps in enumerate(wi.pod_sets):
        problem = _pod_set_never_fits(state, wi, cq, index, ps)
        if problem is not None:
            return Verdict(problem.reason, problem.cause, problem.message, problem.largest)
    return None


def _pod_set_never_fits(
    state: CycleState, wi: WorkloadInfo, cq: CQState, index: int, ps: PodSetInfo
) -> _Problem | None:
    groups: list[int] = []
    for resource in ps.totals:
        group = cq.group_of.get(resource)
        if group is None:
            return _Problem(
                NO_MATCHING_FLAVOR,
                FLAVOR_NEVER_MATCHES,
                f"can never be admitted: couldn't assign flavors to pod set {ps.name}: "
                f"resource {resource} unavailable in ClusterQueue {cq.name}",
            )
        if group not in groups:
            groups.append(group)
    single = len(groups) == 1
    for group in groups:
        covered, flavors = cq.groups[group]
        resources = [r for r in ps.totals if r in covered]
        problems: list[tuple[str, _Problem]] = []
        for name in flavors:
            problem = _flavor_never_fits(state, wi, cq, index, ps, name, resources, single)
            if problem is None:
                break
            problems.append((name, problem))
        else:
            return _combined(ps, problems)
    return None


def _combined(ps: PodSetInfo, problems: list[tuple[str, _Problem]]) -> _Problem:
    """One problem for a pod set that no flavor can ever take: the worst, and every flavor's."""
    worst = max(problems, key=lambda p: _SEVERITY[p[1].cause])[1]
    if len(problems) == 1:
        return worst
    words = "; ".join(f"flavor {name}: {p.message}" for name, p in problems)
    return _Problem(
        worst.reason, worst.cause, f"no flavor can ever take pod set {ps.name}: {words}"
    )


def _flavor_never_fits(
    state: CycleState,
    wi: WorkloadInfo,
    cq: CQState,
    index: int,
    ps: PodSetInfo,
    name: str,
    resources: list[str],
    single: bool,
) -> _Problem | None:
    flavor = state.flavors.get(name)
    mismatch = flavor_mismatch(state, flavor, name, ps)
    if mismatch is not None:
        return _Problem(NO_MATCHING_FLAVOR, FLAVOR_NEVER_MATCHES, mismatch)
    for resource in resources:
        fr = (name, resource)
        maximum = cq.node.potential_available(fr)
        if ps.totals[resource] > maximum:
            return _Problem(
                EXCEEDS_MAX_QUOTA,
                QUOTA_NEVER_COVERS,
                _quota_message(cq, fr, ps.totals[resource], maximum),
            )
    if not single or not state.inventory.clusters:
        # Placement depends on the other groups' flavors; a fleet without any
        # member cluster is still being set up: neither is judged.
        return None
    request = state.pod_set_request(wi, index, dict.fromkeys(ps.totals, name), now=False)
    if not request.eligible:
        return _no_islands(state, wi, ps, name)
    if pristine_fits(state.inventory, [request], state.pristine_cache):
        return None
    largest = _largest(state, request, name)
    return _Problem(
        TOPOLOGY_PLACEMENT_FAILED,
        TOO_BIG_FOR_ANY_ISLAND if ps.mode == "required" else TOO_BIG_FOR_ANY_CLUSTER,
        _too_big_message(ps, name, request, largest),
        largest,
    )


def _quota_message(cq: CQState, fr: tuple[str, str], value: int, maximum: int) -> str:
    flavor, resource = fr
    quota = cq.node.quotas.get(fr)
    nominal = quota.nominal if quota is not None else 0
    borrowable = max(0, maximum - nominal)
    amount = format_amount
    return (
        f"{render_quota_note((fr, value, maximum))}: quota can never cover it, "
        f"ClusterQueue {cq.name} can use at most {amount(resource, maximum)} {resource} "
        f"of flavor {flavor} (nominal {amount(resource, nominal)} + "
        f"{amount(resource, borrowable)} borrowable)"
    )


def _labels_text(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "no labels"


def _no_islands(state: CycleState, wi: WorkloadInfo, ps: PodSetInfo, name: str) -> _Problem:
    """No island is eligible: say which of labels, taints or the cluster selector rules all out."""
    flavor = state.flavors.get(name)
    labels = dict(ps.node_selector)
    tolerations = list(ps.tolerations)
    if flavor is not None:
        labels.update(flavor.node_labels)
        tolerations.extend(flavor.tolerations)
    carrying = [
        island
        for cluster in state.inventory.clusters.values()
        if cluster.cluster.schedulable
        for island in cluster.islands
        if island.nodes and all(island.labels.get(k) == v for k, v in labels.items())
    ]
    selector = wi.wl.cluster_selector
    if not carrying:
        what = f"the labels of flavor {name} ({_labels_text(labels)})"
        message = f"can never be admitted: no node of any schedulable cluster carries {what}"
    elif not any(tolerates(i.taints, tolerations) for i in carrying):
        message = (
            f"can never be admitted: every node with the labels of flavor {name} "
            f"({_labels_text(labels)}) has a taint the pod set does not tolerate"
        )
    elif selector is not None:
        message = (
            f"can never be admitted: no cluster that matches the cluster selector has "
            f"nodes with the labels of flavor {name} ({_labels_text(labels)})"
        )
    else:  # pragma: no cover - eligible islands are exactly these
        message = f"can never be admitted: no node can take pods of flavor {name}"
    return _Problem(TOPOLOGY_PLACEMENT_FAILED, NO_NODE_WITH_FLAVOR_LABELS, message)


def _largest(state: CycleState, request: PodSetRequest, flavor: str) -> Largest | None:
    """The eligible domain (island, lower level, or cluster) holding most pods of the shape."""
    shape = request.shape
    best: tuple[int, int, str, str | None, Island] | None = None

    def consider(pods: int, primary: int, cluster: str, domain: str | None, island: Island) -> None:
        nonlocal best
        if best is None or (pods, primary) > best[:2]:
            best = (pods, primary, cluster, domain, island)

    islands = sorted(request.eligible.values(), key=lambda i: i.seq)
    if request.mode == "required" and request.level is not None:
        for island in islands:
            groups: dict[str, list[int]] = {}
            for node in island.nodes:
                key = (
                    node.name if request.level == HOSTNAME_LABEL else node.labels.get(request.level)
                )
                if key is not None:
                    got = groups.setdefault(key, [0, 0])
                    got[0] += pods_fitting(node.pristine, shape)
                    got[1] += node.pristine.get(island.primary or "", 0)
            for key, (pods, primary) in sorted(groups.items()):
                consider(pods, primary, island.cluster, key, island)
    elif request.mode == "required":
        for island in islands:
            pods = pristine_capacity_of(island, shape, state.pristine_cache)
            consider(pods, _primary_total(island), island.cluster, island.name, island)
    else:
        per_cluster: dict[str, list[int]] = {}
        first: dict[str, Island] = {}
        for island in islands:
            got = per_cluster.setdefault(island.cluster, [0, 0])
            got[0] += pristine_capacity_of(island, shape, state.pristine_cache)
            got[1] += _primary_total(island)
            first.setdefault(island.cluster, island)
        for cluster, (pods, primary) in sorted(per_cluster.items()):
            consider(pods, primary, cluster, None, first[cluster])
    if best is None:
        return None
    pods, primary, cluster, domain, island = best
    resources = {island.primary: primary} if island.primary else {}
    return Largest(flavor, cluster, domain, pods, resources)


def _primary_total(island: Island) -> int:
    primary = island.primary
    return sum(n.pristine.get(primary, 0) for n in island.nodes) if primary else 0


def _too_big_message(
    ps: PodSetInfo, flavor: str, request: PodSetRequest, largest: Largest | None
) -> str:
    if ps.mode == "required":
        unit = "island" if request.level is None else f"{request.level} domain"
        where = "one island"
    else:
        unit, where = "cluster", "one cluster"
    text = (
        f"no schedulable cluster in flavor {flavor} could hold {ps.count} pod(s) of "
        f"{describe_shape(ps)} within {where}, even if it were empty: "
        f"too big for any {unit} of any cluster"
    )
    if largest is None:
        return text
    place = largest.cluster if largest.domain is None else f"{largest.cluster}/{largest.domain}"
    held = ", ".join(f"{format_amount(r, a)} {r}" for r, a in largest.resources.items())
    return f"{text}; the largest {unit} is {place}, which holds {largest.pods} such pod(s)" + (
        f" ({held})" if held else ""
    )
