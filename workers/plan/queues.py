"""Member queue objects: per admitted pod set its flavors, island and node
selector, merged into one member ClusterQueue and its ResourceFlavors that
admit exactly what the centre admitted there."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.domain.quantity import canonical_amount, format_amount
from workers.plan.names import (
    API_VERSIONS,
    MAX_FLAVORS,
    MAX_FLAVORS_TOTAL,
    MAX_NODE_LABELS,
    flavor_name,
    managed_labels,
)
from workers.plan.views import ClusterView, Ref

Obj = dict[str, Any]


# -- desired state ---------------------------------------------------------------------------


@dataclass
class Desired:
    namespaces: dict[str, Obj] = field(default_factory=dict)
    queues: dict[Ref, Obj] = field(default_factory=dict)
    jobs: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (workload key, admission)
    #: Jobs wanted that the member already holds: not built again.
    held: set[tuple[str, str]] = field(default_factory=set)
    #: A Volcano member's PodGroup of each job in ``jobs``, by the same key.
    groups: dict[tuple[str, str], Obj] = field(default_factory=dict)
    #: The replica count of each serving object wanted, built or held
    #: (what a held one is scaled to).
    replicas: dict[tuple[str, str], int] = field(default_factory=dict)


#: One central flavor on the member, pinned to one island or not: ``(flavor, island)``.
Placed = tuple[str, str | None]
#: A use's flavors and selector, hashable.
Shape = tuple[tuple[tuple[str, Placed], ...], tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Use:
    """One admitted pod set here: per resource, the central flavor (and the
    island it is pinned to) and the amount it reserved; the node selector
    that pins its pods (every flavor's labels, and its island)."""

    flavors: Mapping[str, Placed]
    usage: Mapping[str, int]
    selector: Mapping[str, str]
    #: ``flavors`` and ``selector`` as one value: all that the member queue
    #: reads of a use but its usage, which it only sums (:func:`merged_uses`).
    shape: Shape


def _island_label(view: ClusterView, flavor: str) -> str | None:
    spec = view.flavors.get(flavor) or {}
    topology = view.topologies.get(str(spec.get("topologyName") or "")) or {}
    levels = topology.get("levels") or ()
    return str(levels[0]["nodeLabel"]) if levels else None


def _node_labels(view: ClusterView, flavor: str) -> dict[str, str]:
    labels = (view.flavors.get(flavor) or {}).get("nodeLabels") or {}
    return {str(k): str(v) for k, v in labels.items()}


#: Placements worked out in one :func:`desired`, by island and (resource, flavor) pairs.
Placements = dict[
    tuple[str | None, tuple[tuple[str, str], ...]],
    tuple[dict[str, Placed], dict[str, str], Shape],
]


def use_of(view: ClusterView, assignment: Mapping[str, Any], placements: Placements) -> Use:
    islands = list(assignment.get("islands") or ())
    island = str(islands[0]) if len(islands) == 1 else None
    assigned = tuple((str(r), str(f)) for r, f in (assignment.get("flavors") or {}).items())
    placed = placements.get((island, assigned))
    if placed is None:
        placed = placements[(island, assigned)] = _placement(view, island, assigned)
    usage = {str(r): _amount(str(r), q) for r, q in (assignment.get("resourceUsage") or {}).items()}
    return Use(placed[0], usage, placed[1], placed[2])


def _placement(
    view: ClusterView, island: str | None, assigned: Iterable[tuple[str, str]]
) -> tuple[dict[str, Placed], dict[str, str], Shape]:
    """Per resource the flavor (pinned to ``island`` if it has islands), and
    the node selector: the same for every pod set of one assignment (a
    fleet's gangs share a few), shared by their uses and never written to."""
    flavors: dict[str, Placed] = {}
    selector: dict[str, str] = {}
    for resource, flavor in assigned:
        key = _island_label(view, flavor)
        pinned = island if key is not None else None
        flavors[resource] = (flavor, pinned)
        selector.update(_node_labels(view, flavor))
        if key is not None and pinned is not None:
            selector[key] = pinned
    return flavors, selector, (tuple(flavors.items()), tuple(selector.items()))


def merged_uses(uses: Iterable[Use]) -> list[Use]:
    """Uses of one shape as one, their usage summed: what the member queue
    makes of them is the same (it reads their flavors and selectors, and
    their usage only in sum), and a pass weighs every gang in flight."""
    usage: dict[Shape, dict[str, int]] = {}
    first: dict[Shape, Use] = {}
    for use in uses:
        total = usage.get(use.shape)
        if total is None:
            first[use.shape] = use
            usage[use.shape] = dict(use.usage)
            continue
        for resource, amount in use.usage.items():
            total[resource] = total.get(resource, 0) + amount
    return [Use(u.flavors, usage[s], u.selector, s) for s, u in first.items()]


@functools.lru_cache(maxsize=4096)
def _amount(resource: str, quantity: str | int | float) -> int:
    """A quantity's canonical amount, parsed once: a fleet's gangs ask for a
    few distinct quantities, and parsing them (with fractions) for every
    in-flight gang was a fifth of a reconcile pass."""
    return canonical_amount(resource, quantity)


def _flavor_labels(view: ClusterView, placed: Placed) -> dict[str, str]:
    central, island = placed
    labels = _node_labels(view, central)
    key = _island_label(view, central)
    first: list[tuple[str, str]] = []
    if island is not None and key is not None:
        labels.pop(key, None)
        first = [(key, island)]
    # Kueue allows 8 node labels; the island's is the one that must stay.
    return dict((first + sorted(labels.items()))[:MAX_NODE_LABELS])


def member_flavor(view: ClusterView, name: str, placed: Placed) -> Obj:
    source = view.flavors.get(placed[0]) or {}
    spec: Obj = {"nodeLabels": _flavor_labels(view, placed)}
    for field_name in ("nodeTaints", "tolerations"):
        if source.get(field_name):
            spec[field_name] = copy.deepcopy(list(source[field_name]))
    return {
        "apiVersion": API_VERSIONS["ResourceFlavor"],
        "kind": "ResourceFlavor",
        "metadata": {"name": name, "labels": managed_labels()},
        "spec": spec,
    }


def components(links: Iterable[Sequence[str]]) -> dict[str, str]:
    """Resources linked into groups (union-find): resource → its group's
    smallest resource."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in links:
        for other in link[1:]:
            a, b = root(link[0]), root(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
        if link:
            root(link[0])
    return {r: root(r) for r in parent}


def one_flavor_per_group(groups: Mapping[str, str], uses: Sequence[Use]) -> bool:
    """Kueue gives a pod set one flavor per resource group: can each of
    these admissions be read that way?"""
    for use in uses:
        seen: dict[str, Placed] = {}
        for resource, placed in use.flavors.items():
            if seen.setdefault(groups[resource], placed) != placed:
                return False
    return True


def _resource_groups(
    spec: Mapping[str, Any], uses: Sequence[Use]
) -> list[tuple[list[str], list[str]]]:
    """The central ClusterQueue's resource groups, as far as the admissions
    here use them: ``(coveredResources, central flavors in the centre's
    order)``. A flavor covers every resource it was admitted for, so those
    resources share a group whatever the spec says now; the spec's groups
    are mirrored (covered resources no one uses here get quota 0) unless an
    admission made under an earlier spec could not be read with them."""
    central = [
        (
            [str(r) for r in group.get("coveredResources") or ()],
            [str(f.get("name")) for f in group.get("flavors") or ()],
        )
        for group in spec.get("resourceGroups") or ()
    ]
    rank: dict[str, tuple[int, int]] = {}
    for g, (_, names) in enumerate(central):
        for position, name in enumerate(names):
            rank.setdefault(name, (g, position))
    used: dict[str, set[str]] = {}
    for use in uses:
        for resource, (flavor, _) in use.flavors.items():
            used.setdefault(flavor, set()).add(resource)
    links = [sorted(resources) for resources in used.values()]
    groups = components(links + [covered for covered, _ in central if covered])
    if not one_flavor_per_group(groups, uses):
        groups = components(links)
    members: dict[str, list[str]] = {}
    last = (len(central), 0)
    for flavor in sorted(used, key=lambda f: (rank.get(f, last), f)):
        members.setdefault(groups[min(used[flavor])], []).append(flavor)
    covered: dict[str, list[str]] = {}
    for resource, group in sorted(groups.items()):
        covered.setdefault(group, []).append(resource)
    return [(covered[group], flavors) for group, flavors in members.items()]


def _collapsed(
    groups: Sequence[tuple[list[str], list[str]]], islands: Mapping[str, set[str | None]]
) -> set[str]:
    """Central flavors whose islands share one member flavor, so that the
    ClusterQueue stays within Kueue's caps (64 flavors a group, 256 in all).
    A whole group at a time: a pod set pinned to an island must find no
    island label on its group's flavors but its own island's. The quota
    stays exact in sum, the jobs stay pinned by their node selectors; only
    the member's per-island bookkeeping is given up."""
    out: set[str] = set()

    def size(flavors: Sequence[str]) -> int:
        return sum(1 if f in out else len(islands[f]) for f in flavors)

    for _, flavors in groups:
        if size(flavors) > MAX_FLAVORS:
            out.update(flavors)
    for _, flavors in sorted(groups, key=lambda g: -size(g[1])):
        if size([f for _, fs in groups for f in fs]) <= MAX_FLAVORS_TOTAL:
            break
        out.update(flavors)
    return out


@dataclass
class MemberQueue:
    queue: Obj
    #: Member flavor name → the central flavor and island it stands for.
    flavors: dict[str, Placed]
    #: A pod set's (central flavor, island) → the member flavor it takes.
    names: dict[Placed, str]


def member_queue(
    view: ClusterView, name: str, spec: Mapping[str, Any], uses: Sequence[Use]
) -> MemberQueue:
    """The member ClusterQueue mirroring ``spec``'s resource groups, each
    member flavor's nominal quota exactly what the centre admitted there;
    and the member flavors it lists."""
    groups = _resource_groups(spec, uses)
    islands: dict[str, set[str | None]] = {}
    for use in uses:
        for flavor, island in use.flavors.values():
            islands.setdefault(flavor, set()).add(island)
    collapsed = _collapsed(groups, islands)

    def member(placed: Placed) -> Placed:
        return (placed[0], None) if placed[0] in collapsed else placed

    quota: dict[Placed, dict[str, int]] = {}
    for use in uses:
        for resource, placed in use.flavors.items():
            bucket = quota.setdefault(member(placed), {})
            bucket[resource] = bucket.get(resource, 0) + use.usage.get(resource, 0)
    flavors: dict[str, Placed] = {}
    resource_groups = []
    for covered, centrals in groups:
        placed_here = [
            (rank, placed)
            for rank, central in enumerate(centrals)
            for placed in sorted({member((central, i)) for i in islands[central]}, key=unpinned)
        ]
        # Fewest node labels first (the island-less flavor before its
        # islands', h100 before h100-on-spot): Kueue takes the first flavor
        # that suits a pod set, and a pod set suits every flavor whose labels
        # hold its own; then the centre's order.
        placed_here.sort(key=lambda item: (len(_flavor_labels(view, item[1])), item[0]))
        entries = []
        for _, placed in placed_here:
            flavors[flavor_name(*placed)] = placed
            entries.append(
                {
                    "name": flavor_name(*placed),
                    "resources": [
                        {"name": r, "nominalQuota": format_amount(r, quota[placed].get(r, 0))}
                        for r in covered
                    ],
                }
            )
        resource_groups.append({"coveredResources": covered, "flavors": entries})
    names = {p: flavor_name(*member(p)) for use in uses for p in use.flavors.values()}
    queue = {
        "apiVersion": API_VERSIONS["ClusterQueue"],
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": managed_labels()},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": resource_groups,
        },
    }
    return MemberQueue(queue, flavors, names)


def _suits(labels: Mapping[str, Any], selector: Mapping[str, str], keys: set[str]) -> bool:
    """Kueue's flavor match: the pod set's node selector, on the label keys
    the group's flavors use, against the flavor's node labels."""
    return all(str(labels.get(k)) == v for k, v in selector.items() if k in keys)


def unambiguous(view: ClusterView, member: MemberQueue, uses: Sequence[Use]) -> bool:
    """Whether the member's Kueue, taking per group the first flavor that
    suits a pod set, takes the very flavor that holds its quota — in any
    order of arrival, so it admits every admission and leaves nothing over.
    (Flavors whose labels are a subset of another's in one group, say, or a
    flavor that the centre's groups changed under, can break this.)"""
    labels = {n: _flavor_labels(view, placed) for n, placed in member.flavors.items()}
    groups = []
    for group in member.queue["spec"]["resourceGroups"]:
        names = [f["name"] for f in group["flavors"]]
        keys = {k for n in names for k in labels[n]}
        groups.append((set(group["coveredResources"]), names, keys))
    for use in uses:
        for covered, names, keys in groups:
            own = {member.names[p] for r, p in use.flavors.items() if r in covered}
            if not own:
                continue
            first = next((n for n in names if _suits(labels[n], use.selector, keys)), None)
            if {first} != own:
                return False
    return True


def unpinned(placed: Placed) -> tuple[bool, str]:
    return (placed[1] is not None, placed[1] or "")
