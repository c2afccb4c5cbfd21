"""Physical placement: every member cluster's nodes, by flavor and fabric island.

The inventory keeps, for each node, its free capacity (allocatable - reserved -
pods of admitted gangs), and indexes it so that most gangs are placed or
rejected without walking nodes:

* each :class:`Island` buckets its nodes by the free amount of its *primary*
  resource (the accelerator, e.g. ``nvidia.com/gpu``): a pod asking for ``g``
  GPUs looks only at buckets ``g…max``, smallest first (best fit), and the
  bucket counts give an upper bound on how many such pods the island can hold.
  Buckets are sparse (one per distinct free amount, kept in a sorted list), so
  a node with a huge allocatable costs no more than a small one;
* per node flavor, islands and clusters are kept sorted by total free primary
  resource, so the best-fit search starts at the first one big enough.

A gang (all pod sets of a workload) always lands in one cluster. A pod set with
a *required* topology request lands inside one domain of that level (usually
the island); *preferred* tries one island, then the fewest islands of one
cluster; otherwise pods may spread over the cluster. Every pod is placed on a
node where it fits (kueue#5243 admits gangs kube-scheduler cannot place).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from service.domain.inventory import Cluster, Node
from service.domain.quota import LabelSelector, Taint, Toleration

__all__ = [
    "ClusterState",
    "Inventory",
    "Island",
    "NodeState",
    "PodSetPlacement",
    "Shape",
    "pods_fitting",
    "tolerates",
]

#: Per-pod requests as a sorted tuple of ``(resource, amount)``, amounts > 0.
Shape = tuple[tuple[str, int], ...]


def pods_fitting(free: Mapping[str, int], shape: Shape) -> int:
    """How many pods of ``shape`` fit in ``free``."""
    best = 1 << 62
    for resource, amount in shape:
        have = free.get(resource, 0)
        if have < amount:
            return 0
        count = have // amount
        best = min(best, count)
    return best


def tolerates(taints: Iterable[Taint], tolerations: Sequence[Toleration]) -> bool:
    """Whether every NoSchedule/NoExecute taint is tolerated."""
    for taint in taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


class NodeState:
    __slots__ = ("cluster", "free", "island", "labels", "name", "pristine", "schedulable", "taints")

    def __init__(self, node: Node, island: Island | None) -> None:
        self.name = node.name
        self.cluster = node.cluster
        self.island = island
        self.labels = node.labels
        self.taints = node.taints
        self.schedulable = node.schedulable
        reserved = node.reserved
        #: Free capacity with no admitted gang on the node (read only).
        self.pristine: Mapping[str, int] = (
            {r: a - reserved.get(r, 0) for r, a in node.allocatable.items()}
            if reserved
            else node.allocatable
        )
        self.free: dict[str, int] = dict(self.pristine)


class Island:
    """One fabric island (one value of the topology's island level) of one cluster."""

    __slots__ = (
        "buckets",
        "cluster",
        "free_total",
        "held",
        "labels",
        "levels",
        "name",
        "node_flavor",
        "nodes",
        "primary",
        "seq",
        "stable_ties",
        "taints",
    )

    def __init__(self, seq: int, cluster: str, node_flavor: str, name: str) -> None:
        self.seq = seq
        #: Ties among equally free nodes go to the first by name, not bucket order.
        self.stable_ties = False
        self.cluster = cluster
        self.node_flavor = node_flavor
        self.name = name
        self.nodes: list[NodeState] = []
        self.primary: str | None = None
        #: ``buckets[f]`` holds the nodes whose free primary amount is ``f`` (never empty).
        self.buckets: dict[int, dict[NodeState, None]] = {}
        #: The keys of ``buckets``, ascending.
        self.levels: list[int] = []
        self.free_total: dict[str, int] = {}
        self.labels: dict[str, str] = {}
        self.taints: tuple[Taint, ...] = ()
        #: Pods of admitted gangs per workload class (``service.engine.island_classes``).
        self.held: dict[str, int] = {}

    def primary_free(self) -> int:
        return self.free_total.get(self.primary, 0) if self.primary else 0

    def upper_bound(self, shape: Shape, primary_amount: int) -> int:
        """Pods of ``shape`` the island could hold judging by the primary resource alone."""
        buckets = self.buckets
        levels = self.levels
        total = 0
        for position in range(bisect.bisect_left(levels, primary_amount), len(levels)):
            f = levels[position]
            total += len(buckets[f]) * (f // primary_amount)
        return total

    def candidate_nodes(self, primary_amount: int) -> Iterable[NodeState]:
        """Nodes that could take a pod, best fit first (least free primary)."""
        if self.primary is None or primary_amount <= 0:
            return sorted((n for n in self.nodes), key=lambda n: (sum(n.free.values()), n.name))
        levels = self.levels[bisect.bisect_left(self.levels, primary_amount) :]
        if self.stable_ties:
            return (n for f in levels for n in _by_name(self.buckets[f]))
        return (n for f in levels for n in self.buckets[f])

    def levels_from(self, primary_amount: int) -> list[int]:
        """Free primary amounts of at least ``primary_amount`` held by some node, ascending."""
        return self.levels[bisect.bisect_left(self.levels, primary_amount) :]

    def bucket_add(self, node: NodeState, free: int) -> None:
        key = max(0, free)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = {}
            bisect.insort(self.levels, key)
        bucket[node] = None


def _by_name(bucket: dict[NodeState, None]) -> Iterable[NodeState]:
    """A bucket's nodes by name: one fixed order, so that equally free nodes fill
    in the same order every time and load gathers on them, instead of rotating
    with the order in which nodes last changed (see ``Inventory``)."""
    return bucket if len(bucket) == 1 else sorted(bucket, key=_name)


def _name(node: NodeState) -> str:
    return node.name


@dataclass(slots=True)
class PodSetPlacement:
    """Pods per node for one pod set, and the islands it spans."""

    nodes: tuple[tuple[NodeState, int], ...]
    islands: tuple[str, ...]


class ClusterState:
    __slots__ = ("cluster", "islands", "name", "seq")

    def __init__(self, seq: int, cluster: Cluster) -> None:
        self.seq = seq
        self.name = cluster.name
        self.cluster = cluster
        self.islands: list[Island] = []


#: Sequence numbers (of islands, of clusters) stay below this: ``free * _SEQS + seq``
#: orders like ``(free, seq)`` (free amounts are never negative), and ints bisect faster.
_SEQS = 1 << 32


class _FlavorIndex:
    """Islands and clusters of one node flavor, sorted by free primary resource.

    Keys are ``free * _SEQS + seq``: the order of ``(free, seq)``.
    """

    __slots__ = ("cluster_free", "cluster_keys", "island_keys", "islands")

    def __init__(self) -> None:
        self.islands: dict[int, Island] = {}
        self.island_keys: list[int] = []
        self.cluster_free: dict[int, int] = {}
        self.cluster_keys: list[int] = []


class Inventory:
    """Mutable capacity state for one cycle."""

    def __init__(
        self,
        clusters: Sequence[Cluster],
        nodes: Sequence[Node],
        accelerators: Sequence[str],
        *,
        spread_island_first: bool = True,
    ) -> None:
        #: Whether a pod set that may spread tries one island first (``packing``);
        #: with it, a pod placed inside one island takes the first by name of its
        #: equally free nodes. Before, it took the one longest at that free amount
        #: (bucket order), which spreads pods over nodes that a fixed order would
        #: have kept whole: on cluster04 at 576 GPUs that alone is 11 % of the
        #: mean delay (docs/scheduling-quality.md).
        self.spread_island_first = spread_island_first
        self.clusters: dict[str, ClusterState] = {}
        for seq, cluster in enumerate(sorted(clusters, key=lambda c: c.name)):
            self.clusters[cluster.name] = ClusterState(seq, cluster)
        self.nodes: dict[str, NodeState] = {}
        self.islands: list[Island] = []
        self._index: dict[str, _FlavorIndex] = {}
        islands: dict[tuple[str, str, str], Island] = {}
        for node in sorted(nodes, key=operator.attrgetter("cluster", "flavor", "island", "name")):
            cluster_state = self.clusters.get(node.cluster)
            if cluster_state is None:
                # Nodes of an unknown cluster still hold usage but take nothing new.
                self.nodes[node.name] = NodeState(node, None)
                continue
            key = (node.cluster, node.flavor, node.island)
            island = islands.get(key)
            if island is None:
                island = Island(len(self.islands), node.cluster, node.flavor, node.island)
                islands[key] = island
                self.islands.append(island)
                cluster_state.islands.append(island)
            state = NodeState(node, island)
            self.nodes[node.name] = state
            island.nodes.append(state)
        for island in self.islands:
            self._init_island(island, accelerators)
            island.stable_ties = spread_island_first
        for island in self.islands:
            index = self._index.setdefault(island.node_flavor, _FlavorIndex())
            index.islands[island.seq] = island
            cseq = self.clusters[island.cluster].seq
            index.cluster_free[cseq] = index.cluster_free.get(cseq, 0) + island.primary_free()
        for index in self._index.values():
            index.island_keys = sorted(
                i.primary_free() * _SEQS + s for s, i in index.islands.items()
            )
            index.cluster_keys = sorted(f * _SEQS + c for c, f in index.cluster_free.items())
        self._cluster_by_seq = {c.seq: c for c in self.clusters.values()}

    @staticmethod
    def _init_island(island: Island, accelerators: Sequence[str]) -> None:
        nodes = island.nodes
        common = dict(nodes[0].labels) if nodes else {}
        taints: dict[Taint, None] = {}
        for node in nodes:
            for taint in node.taints:
                taints[taint] = None
            labels = node.labels
            if any(labels.get(k) != v for k, v in common.items()):
                common = {k: v for k, v in common.items() if labels.get(k) == v}
        island.labels = common
        island.primary = next(
            (a for a in accelerators if any(n.pristine.get(a, 0) > 0 for n in nodes)), None
        )
        island.nodes = [n for n in nodes if n.schedulable]
        # The union of node taints: a pod must tolerate all of them to use the island.
        island.taints = tuple(taints)
        if island.primary is not None:
            for node in island.nodes:
                island.bucket_add(node, node.free.get(island.primary, 0))
        for node in island.nodes:
            for r, amount in node.free.items():
                island.free_total[r] = island.free_total.get(r, 0) + max(0, amount)

    # --- capacity bookkeeping -------------------------------------------------------------

    def _change(self, node: NodeState, shape: Shape, pods: int, sign: int) -> None:
        island = node.island
        free = node.free
        if island is None or not node.schedulable:
            for resource, amount in shape:
                free[resource] = free.get(resource, 0) - sign * amount * pods
            return
        primary = island.primary
        old_primary = free.get(primary, 0) if primary else 0
        totals = island.free_total
        for resource, amount in shape:
            before = free.get(resource, 0)
            after = before - sign * amount * pods
            free[resource] = after
            # Totals count only what is free: a node over-committed adds nothing.
            gained = (after if after > 0 else 0) - (before if before > 0 else 0)
            totals[resource] = totals.get(resource, 0) + gained
        if primary is None:
            return
        new_primary = free.get(primary, 0)
        old_level = old_primary if old_primary > 0 else 0
        new_level = new_primary if new_primary > 0 else 0
        if old_level != new_level:
            # The node moves between buckets, inlined: the hottest path.
            buckets = island.buckets
            bucket = buckets[old_level]
            del bucket[node]
            if not bucket:
                del buckets[old_level]
                del island.levels[bisect.bisect_left(island.levels, old_level)]
            target = buckets.get(new_level)
            if target is None:
                target = buckets[new_level] = {}
                bisect.insort(island.levels, new_level)
            target[node] = None
            self._reindex(island, new_level - old_level)

    def _reindex(self, island: Island, delta: int) -> None:
        index = self._index[island.node_flavor]
        new_free = island.primary_free()
        keys = index.island_keys
        keys.pop(bisect.bisect_left(keys, (new_free - delta) * _SEQS + island.seq))
        bisect.insort(keys, new_free * _SEQS + island.seq)
        cseq = self.clusters[island.cluster].seq
        old = index.cluster_free[cseq]
        index.cluster_free[cseq] = old + delta
        ckeys = index.cluster_keys
        ckeys.pop(bisect.bisect_left(ckeys, old * _SEQS + cseq))
        bisect.insort(ckeys, (old + delta) * _SEQS + cseq)

    def allocate(self, nodes: Iterable[tuple[NodeState, int]], shape: Shape) -> None:
        for node, pods in nodes:
            self._change(node, shape, pods, 1)

    def release(self, nodes: Iterable[tuple[NodeState, int]], shape: Shape) -> None:
        for node, pods in nodes:
            self._change(node, shape, pods, -1)

    # --- searching ------------------------------------------------------------------------

    def islands_by_best_fit(
        self, node_flavor: str, need: int, eligible: Mapping[int, Island]
    ) -> Iterable[Island]:
        """Eligible islands of a node flavor with at least ``need`` free primary, tightest first."""
        index = self._index.get(node_flavor)
        if index is None:
            return
        keys = index.island_keys
        # Callers do not allocate while iterating (the index would move under them).
        for position in range(bisect.bisect_left(keys, need * _SEQS), len(keys)):
            island = eligible.get(keys[position] % _SEQS)
            if island is not None:
                yield island

    def clusters_by_best_fit(self, node_flavor: str, need: int) -> list[ClusterState]:
        index = self._index.get(node_flavor)
        if index is None:
            return []
        keys = index.cluster_keys
        position = bisect.bisect_left(keys, need * _SEQS)
        by_seq = self._cluster_by_seq
        return [by_seq[key % _SEQS] for key in keys[position:]]

    def cluster_free(self, node_flavor: str, cluster: ClusterState) -> int:
        index = self._index.get(node_flavor)
        return index.cluster_free.get(cluster.seq, 0) if index is not None else 0

    def matching_islands(
        self,
        node_labels: Mapping[str, str],
        tolerations: Sequence[Toleration],
        cluster_selector: LabelSelector | None,
    ) -> dict[int, Island]:
        """Islands of schedulable clusters with the node labels, whose taints are tolerated."""
        result: dict[int, Island] = {}
        for cluster in self.clusters.values():
            if not cluster.cluster.schedulable:
                continue
            if cluster_selector is not None and not cluster_selector.matches(
                cluster.cluster.labels
            ):
                continue
            for island in cluster.islands:
                labels = island.labels
                if any(labels.get(k) != v for k, v in node_labels.items()):
                    continue
                if not tolerates(island.taints, tolerations):
                    continue
                result[island.seq] = island
        return result


def fill_domain(
    nodes: Iterable[NodeState], shape: Shape, count: int
) -> list[tuple[NodeState, int]] | None:
    """Greedily place ``count`` pods on ``nodes`` in the given order, or ``None``."""
    chosen: list[tuple[NodeState, int]] = []
    need = count
    for node in nodes:
        fit = pods_fitting(node.free, shape)
        if fit <= 0:
            continue
        take = fit if fit < need else need
        chosen.append((node, take))
        need -= take
        if need == 0:
            return chosen
    return None


def fill_island(island: Island, shape: Shape, count: int) -> list[tuple[NodeState, int]] | None:
    """Place all ``count`` pods inside one island, best fit first, or ``None``."""
    primary = island.primary
    amount = 0
    if primary:
        for resource, per_pod in shape:
            if resource == primary:
                amount = per_pod
                break
    if amount > 0:
        if island.upper_bound(shape, amount) < count:
            return None
    else:
        for resource, per_pod in shape:
            if island.free_total.get(resource, 0) < per_pod * count:
                return None
    return fill_domain(island.candidate_nodes(amount), shape, count)


def pristine_capacity(island: Island, shape: Shape) -> int:
    """Pods of ``shape`` the island holds when empty of admitted gangs."""
    return sum(pods_fitting(n.pristine, shape) for n in island.nodes)
