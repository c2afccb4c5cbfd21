"""Packing a whole gang into one cluster: islands, best fit, per-node fit.

Best fit means the candidate with the least free primary resource that still
holds the pod set, so that big holes stay open for big gangs; ties go to the
lower sequence number (clusters by name, then islands by flavor and name),
which keeps decisions deterministic. Every pod set tries islands first: the
tightest island that holds it whole, then its least-free nodes. One that may
spread (no required topology) and fits no island goes to the least-free
cluster that holds it, on the least-free nodes anywhere in it — or, with
``EngineConfig.spread_packing = "ClusterFirst"`` (the placement before issue
24), goes there at once: a one-GPU job then took the fullest node of the
fullest cluster whatever its island, scattering small jobs over the islands
that gangs need (docs/scheduling-quality.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.domain.inventory import HOSTNAME_LABEL
from service.engine.placement import (
    ClusterState,
    Inventory,
    Island,
    NodeState,
    PodSetPlacement,
    Shape,
    fill_domain,
    fill_island,
    pods_fitting,
    pristine_capacity,
)

__all__ = [
    "GangPlacement",
    "PodSetRequest",
    "place_gang",
    "pristine_capacity_of",
    "pristine_fits",
]


@dataclass(slots=True)
class PodSetRequest:
    """One pod set to place: ``count`` pods of ``shape`` on ``eligible`` islands."""

    name: str
    count: int
    shape: Shape
    #: ``required`` | ``preferred`` | ``unconstrained``.
    mode: str
    #: Domain level for required/preferred: ``None`` is the island level.
    level: str | None
    eligible: Mapping[int, Island]
    #: The node flavors of the eligible islands, sorted (``None``: compute).
    node_flavors: list[str] | None = None
    #: Cluster seq -> its eligible islands, in the cluster's order (memoised).
    by_cluster: dict[int, list[Island]] = field(default_factory=dict)
    #: ``podSetGroupName`` of a required pod set: its group shares one domain.
    group: str | None = None
    #: ``CycleState.class_epochs`` of its class when ``eligible`` was filtered for it.
    class_epoch: int = -1
    #: A class whose islands it tries first (``EngineConfig.serving_islands_first``).
    prefer_held: str | None = None
    #: Per-pod amount of each resource (``dict(shape)``, kept).
    amounts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.amounts = dict(self.shape)


@dataclass(slots=True)
class GangPlacement:
    cluster: str
    pod_sets: tuple[PodSetPlacement, ...]


def _primary_need(island: Island, request: PodSetRequest) -> int:
    primary = island.primary
    if primary is None:
        return 0
    return request.amounts.get(primary, 0) * request.count


def _node_flavors(request: PodSetRequest) -> list[str]:
    if request.node_flavors is None:
        request.node_flavors = sorted({i.node_flavor for i in request.eligible.values()})
    return request.node_flavors


def _islands_best_fit(inventory: Inventory, request: PodSetRequest) -> Iterable[Island]:
    flavors = _node_flavors(request)
    if len(flavors) == 1:
        sample = next(iter(request.eligible.values()))
        return inventory.islands_by_best_fit(
            flavors[0], _primary_need(sample, request), request.eligible
        )
    return sorted(request.eligible.values(), key=lambda i: (i.primary_free(), i.seq))


def _fill_subdomains(island: Island, request: PodSetRequest) -> list[tuple[NodeState, int]] | None:
    """Required at a level below the island: all pods in one rack / one host."""
    groups: dict[str, list[NodeState]] = {}
    for node in island.nodes:
        key = node.name if request.level == HOSTNAME_LABEL else node.labels.get(request.level or "")
        if key is not None:
            groups.setdefault(key, []).append(node)

    def free_primary(nodes: list[NodeState]) -> int:
        return sum(n.free.get(island.primary, 0) for n in nodes) if island.primary else 0

    for _, nodes in sorted(groups.items(), key=lambda kv: (free_primary(kv[1]), kv[0])):
        ordered = sorted(nodes, key=lambda n: (n.free.get(island.primary or "", 0), n.name))
        chosen = fill_domain(ordered, request.shape, request.count)
        if chosen is not None:
            return chosen
    return None


def _fits_in_one_island(
    island: Island, request: PodSetRequest
) -> list[tuple[NodeState, int]] | None:
    if request.level is None:
        return fill_island(island, request.shape, request.count)
    return _fill_subdomains(island, request)


def _place_in_one_island(
    inventory: Inventory, request: PodSetRequest, cluster: str | None
) -> PodSetPlacement | None:
    candidates = _islands_best_fit(inventory, request)
    if request.prefer_held is not None:
        candidates = _held_first(list(candidates), request.prefer_held)
    for island in candidates:
        if cluster is not None and island.cluster != cluster:
            continue
        chosen = _fits_in_one_island(island, request)
        if chosen is not None:
            return PodSetPlacement(tuple(chosen), (island.name,))
    return None


def _held_first(islands: list[Island], workload_class: str) -> list[Island]:
    """Islands already holding pods of ``workload_class`` first, each part in its order."""
    held = [i for i in islands if i.held.get(workload_class, 0) > 0]
    if not held or len(held) == len(islands):
        return islands
    return [*held, *(i for i in islands if i.held.get(workload_class, 0) <= 0)]


def _cluster_islands(request: PodSetRequest, cluster: ClusterState) -> list[Island]:
    islands = request.by_cluster.get(cluster.seq)
    if islands is None:
        eligible = request.eligible
        islands = request.by_cluster[cluster.seq] = [
            i for i in cluster.islands if i.seq in eligible
        ]
    return islands


def _spread_in_cluster(
    request: PodSetRequest, islands: Sequence[Island]
) -> list[tuple[NodeState, int]] | None:
    """Pods anywhere in the cluster, on the nodes with the least free primary first."""
    if not islands:
        return None
    shape = request.shape
    primary = islands[0].primary
    if primary is not None and all(i.primary == primary for i in islands):
        amount = request.amounts.get(primary, 0)
        if amount > 0:
            # The bound only saves a hopeless walk; one pod needs no bound.
            if request.count > 1 and sum(i.upper_bound(shape, amount) for i in islands) < (
                request.count
            ):
                return None
            if request.count == 1:
                return _best_fit_node(islands, shape, amount)
            levels = sorted({f for i in islands for f in i.levels_from(amount)})
            nodes = (n for f in levels for i in islands for n in i.buckets.get(f, ()))
            return fill_domain(nodes, shape, request.count)
    for resource, per_pod in shape:
        if sum(i.free_total.get(resource, 0) for i in islands) < per_pod * request.count:
            return None
    nodes_sorted = sorted(
        (n for i in islands for n in i.nodes), key=lambda n: (sum(n.free.values()), n.name)
    )
    return fill_domain(nodes_sorted, shape, request.count)


def _best_fit_node(
    islands: Sequence[Island], shape: Shape, amount: int
) -> list[tuple[NodeState, int]] | None:
    """One pod: the first node that fits in (free primary, island, bucket) order.

    The order of the general walk over the union of the islands' levels; each
    island stops at its own first fit, or as soon as it cannot beat the best.
    """
    best: NodeState | None = None
    best_level = 0
    for island in islands:
        found = _first_fit_in_island(island, shape, amount, best_level if best else None)
        if found is not None:
            best, best_level = found
    return None if best is None else [(best, 1)]


def _first_fit_in_island(
    island: Island, shape: Shape, amount: int, below: int | None
) -> tuple[NodeState, int] | None:
    """The island's first node (by free primary, then bucket order) where a pod fits,
    with its level, looking only at levels below ``below`` (``None``: any)."""
    levels = island.levels
    for position in range(bisect.bisect_left(levels, amount), len(levels)):
        level = levels[position]
        if below is not None and level >= below:
            return None
        for node in island.buckets[level]:
            if pods_fitting(node.free, shape):
                return node, level
    return None


def _fewest_islands_in_cluster(
    request: PodSetRequest, islands: Sequence[Island]
) -> list[tuple[NodeState, int]] | None:
    """Preferred topology that fits no single island: use the biggest islands first."""
    capacity = []
    for island in islands:
        fit = sum(pods_fitting(n.free, request.shape) for n in island.nodes)
        if fit > 0:
            capacity.append((fit, island))
    capacity.sort(key=lambda item: (-item[0], item[1].seq))
    chosen: list[tuple[NodeState, int]] = []
    need = request.count
    for fit, island in capacity:
        take = min(fit, need)
        part = fill_island(island, request.shape, take)
        if part is None:  # pragma: no cover - capacity was computed from the same state
            return None
        chosen.extend(part)
        need -= take
        if need == 0:
            return chosen
    return None


def _clusters_for(inventory: Inventory, requests: Sequence[PodSetRequest]) -> list[ClusterState]:
    """Clusters that have an eligible island for every pod set, best fit first."""
    names: set[str] | None = None
    for request in requests:
        here = {i.cluster for i in request.eligible.values()}
        names = here if names is None else names & here
    if not names:
        return []
    flavors = _node_flavors(requests[0])
    clusters = [inventory.clusters[name] for name in names]

    def free(cluster: ClusterState) -> int:
        return sum(inventory.cluster_free(f, cluster) for f in flavors)

    return sorted(clusters, key=lambda c: (free(c), c.seq))


def _place_in_cluster(
    inventory: Inventory, request: PodSetRequest, cluster: ClusterState
) -> PodSetPlacement | None:
    islands = _cluster_islands(request, cluster)
    if request.mode in ("required", "preferred") or inventory.spread_island_first:
        ordered = sorted(islands, key=lambda i: (i.primary_free(), i.seq))
        if request.prefer_held is not None:
            ordered = _held_first(ordered, request.prefer_held)
        for island in ordered:
            chosen = _fits_in_one_island(island, request)
            if chosen is not None:
                return PodSetPlacement(tuple(chosen), (island.name,))
        if request.mode == "required":
            return None
    if request.mode == "preferred":
        chosen = _fewest_islands_in_cluster(request, islands)
    else:
        chosen = _spread_in_cluster(request, islands)
    if chosen is None:
        return None
    return PodSetPlacement(tuple(chosen), _islands_of(chosen))


def _islands_of(chosen: Iterable[tuple[NodeState, int]]) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for node, _ in chosen:
        if node.island is not None:
            names[node.island.name] = None
    return tuple(names)


def _place_single(inventory: Inventory, request: PodSetRequest) -> GangPlacement | None:
    if not request.eligible:
        return None
    if request.mode in ("required", "preferred"):
        placement = _place_in_one_island(inventory, request, None)
        if placement is not None:
            island_cluster = next(iter(placement.nodes))[0].cluster
            return GangPlacement(island_cluster, (placement,))
        if request.mode == "required":
            return None
        best: tuple[int, int, ClusterState, list[tuple[NodeState, int]]] | None = None
        for cluster in _clusters_for(inventory, [request]):
            chosen = _fewest_islands_in_cluster(request, _cluster_islands(request, cluster))
            if chosen is not None:
                key = (len(_islands_of(chosen)), cluster.seq)
                if best is None or key < best[:2]:
                    best = (key[0], key[1], cluster, chosen)
        if best is None:
            return None
        return GangPlacement(best[2].name, (PodSetPlacement(tuple(best[3]), _islands_of(best[3])),))
    if inventory.spread_island_first:
        placement = _place_in_one_island(inventory, request, None)
        if placement is not None:
            return GangPlacement(placement.nodes[0][0].cluster, (placement,))
    flavors = _node_flavors(request)
    if len(flavors) == 1:
        sample = next(iter(request.eligible.values()))
        need = _primary_need(sample, request)
        clusters: Iterable[ClusterState] = inventory.clusters_by_best_fit(flavors[0], need)
    else:
        clusters = _clusters_for(inventory, [request])
    for cluster in clusters:
        chosen = _spread_in_cluster(request, _cluster_islands(request, cluster))
        if chosen is not None:
            return GangPlacement(
                cluster.name, (PodSetPlacement(tuple(chosen), _islands_of(chosen)),)
            )
    return None


def place_gang(inventory: Inventory, requests: Sequence[PodSetRequest]) -> GangPlacement | None:
    """Find room for every pod set in one cluster, or ``None``. Does not allocate."""
    if len(requests) == 1:
        return _place_single(inventory, requests[0])
    grouped = any(request.group is not None for request in requests)
    for cluster in _clusters_for(inventory, requests):
        if grouped:
            found = _place_groups_in_cluster(inventory, requests, cluster)
            if found is not None:
                return GangPlacement(cluster.name, found)
            continue
        placed: list[PodSetPlacement] = []
        for request in requests:
            placement = _place_in_cluster(inventory, request, cluster)
            if placement is None:
                break
            inventory.allocate(placement.nodes, request.shape)
            placed.append(placement)
        for request, placement in zip(requests, placed, strict=False):
            inventory.release(placement.nodes, request.shape)
        if len(placed) == len(requests):
            return GangPlacement(cluster.name, tuple(placed))
    return None


def _place_groups_in_cluster(
    inventory: Inventory, requests: Sequence[PodSetRequest], cluster: ClusterState
) -> tuple[PodSetPlacement, ...] | None:
    """Every pod set in ``cluster``, those of one ``group`` in one island
    (Kueue's ``podSetGroupName``); the others as :func:`_place_in_cluster`
    places them. Allocates while it tries; leaves the inventory as it found it."""
    placed: dict[int, PodSetPlacement] = {}
    done: set[int] = set()
    ok = True
    for index, request in enumerate(requests):
        if index in done:
            continue
        group = request.group
        members = [i for i, r in enumerate(requests) if group is not None and r.group == group]
        members = members or [index]
        done.update(members)
        found = (
            _place_group_in_one_island(inventory, [requests[i] for i in members], cluster)
            if request.group is not None
            else _one(_place_in_cluster(inventory, request, cluster))
        )
        if found is None:
            ok = False
            break
        for i, placement in zip(members, found, strict=True):
            inventory.allocate(placement.nodes, requests[i].shape)
            placed[i] = placement
    for i, placement in placed.items():
        inventory.release(placement.nodes, requests[i].shape)
    return tuple(placed[i] for i in range(len(requests))) if ok else None


def _one(placement: PodSetPlacement | None) -> list[PodSetPlacement] | None:
    return None if placement is None else [placement]


def _place_group_in_one_island(
    inventory: Inventory, group: Sequence[PodSetRequest], cluster: ClusterState
) -> list[PodSetPlacement] | None:
    """The group's pod sets in the tightest island of ``cluster`` eligible for
    all of them that holds them all at once, or ``None``."""
    shared = [
        island
        for island in _cluster_islands(group[0], cluster)
        if all(island.seq in request.eligible for request in group[1:])
    ]
    ordered = sorted(shared, key=lambda i: (i.primary_free(), i.seq))
    if group[0].prefer_held is not None:
        ordered = _held_first(ordered, group[0].prefer_held)
    for island in ordered:
        placed: list[PodSetPlacement] = []
        for request in group:
            chosen = _fits_in_one_island(island, request)
            if chosen is None:
                break
            inventory.allocate(chosen, request.shape)
            placed.append(PodSetPlacement(tuple(chosen), (island.name,)))
        for request, placement in zip(group, placed, strict=False):
            inventory.release(placement.nodes, request.shape)
        if len(placed) == len(group):
            return placed
    return None


def pristine_capacity_of(island: Island, shape: Shape, cache: dict[tuple[int, Shape], int]) -> int:
    """``pristine_capacity``, memoised in ``cache`` (it cannot change within a cycle)."""
    key = (island.seq, shape)
    value = cache.get(key)
    if value is None:
        value = cache[key] = pristine_capacity(island, shape)
    return value


def pristine_fits(
    inventory: Inventory,
    requests: Sequence[PodSetRequest],
    cache: dict[tuple[int, Shape], int],
) -> bool:
    """Whether the gang could fit some cluster if no admitted gang held capacity."""

    def capacity(island: Island, shape: Shape) -> int:
        return pristine_capacity_of(island, shape, cache)

    if len(requests) == 1:
        return _pristine_fits_one(requests[0], capacity)
    clusters: set[str] | None = None
    for request in requests:
        ok: set[str] = set()
        per_cluster: dict[str, int] = {}
        for island in request.eligible.values():
            cap = capacity(island, request.shape)
            if request.mode == "required":
                if request.level is None:
                    if cap >= request.count:
                        ok.add(island.cluster)
                elif _pristine_subdomain_fits(island, request):
                    ok.add(island.cluster)
            else:
                per_cluster[island.cluster] = per_cluster.get(island.cluster, 0) + cap
        ok |= {c for c, cap in per_cluster.items() if cap >= request.count}
        clusters = ok if clusters is None else clusters & ok
        if not clusters:
            return False
    return bool(clusters)


def _pristine_fits_one(request: PodSetRequest, capacity: Callable[[Island, Shape], int]) -> bool:
    """``pristine_fits`` of one pod set: true at the first island (or, for a
    preferred topology, the first cluster) with room, instead of after all."""
    per_cluster: dict[str, int] = {}
    for island in request.eligible.values():
        cap = capacity(island, request.shape)
        if request.mode != "required":
            total = per_cluster[island.cluster] = per_cluster.get(island.cluster, 0) + cap
            if total >= request.count:
                return True
        elif request.level is None:
            if cap >= request.count:
                return True
        elif _pristine_subdomain_fits(island, request):
            return True
    return False


def _pristine_subdomain_fits(island: Island, request: PodSetRequest) -> bool:
    groups: dict[str, int] = {}
    for node in island.nodes:
        key = node.name if request.level == HOSTNAME_LABEL else node.labels.get(request.level or "")
        if key is not None:
            groups[key] = groups.get(key, 0) + pods_fitting(node.pristine, request.shape)
    return any(cap >= request.count for cap in groups.values())
