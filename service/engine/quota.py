"""The quota tree: cohorts and ClusterQueues as resource nodes, Kueue's arithmetic.

Each node holds, per ``(flavor, resource)``, its own quota, its *subtree quota*
(own nominal + what children lend up, i.e. their subtree quota minus their
local quota) and its *usage* (for a cohort: the part of children's usage above
their local quota). ``local quota`` is what a lending limit keeps private to a
subtree. ``available`` walks to the root, bounded by borrowing limits;
``potential_available`` is the same with zero usage.

Reference: kueue ``pkg/cache/scheduler/resource_node.go``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from service.domain.quota import ResourceGroup, ResourceQuota

__all__ = ["FlavorResource", "QuotaNode", "QuotaTree"]

FlavorResource = tuple[str, str]


class QuotaNode:
    """A ClusterQueue or a Cohort in the quota tree."""

    __slots__ = (
        "_flat",
        "children",
        "cluster_queues",
        "fair_weight",
        "height",
        "is_cluster_queue",
        "lineage",
        "name",
        "parent",
        "potential",
        "quotas",
        "subtree_quota",
        "usage",
    )

    def __init__(self, name: str, is_cluster_queue: bool, fair_weight_milli: int) -> None:
        self.name = name
        self.is_cluster_queue = is_cluster_queue
        self.parent: QuotaNode | None = None
        self.children: list[QuotaNode] = []
        self.quotas: dict[FlavorResource, ResourceQuota] = {}
        self.subtree_quota: dict[FlavorResource, int] = {}
        self.usage: dict[FlavorResource, int] = {}
        self.fair_weight = fair_weight_milli / 1000.0
        #: Distance to the furthest leaf (a CQ is 0, a cohort of CQs is 1).
        self.height = 0
        #: For a cohort: every ClusterQueue below it, in a stable order.
        self.cluster_queues: list[QuotaNode] = []
        #: ``potential_available`` does not depend on usage: memoised per flavor-resource.
        self.potential: dict[FlavorResource, int] = {}
        #: The ancestors, nearest first (set by :meth:`QuotaTree.finish`, for the hot paths).
        self.lineage: tuple[QuotaNode, ...] = ()
        #: Per flavor-resource: the root, when no node from here up limits borrowing or
        #: lending of it (so ``available`` is the root's), else ``None``. Memoised.
        self._flat: dict[FlavorResource, QuotaNode | None] = {}

    def __repr__(self) -> str:
        kind = "ClusterQueue" if self.is_cluster_queue else "Cohort"
        return f"<{kind} {self.name}>"

    def path(self) -> str:
        parts = []
        node: QuotaNode | None = self
        while node is not None:
            parts.append(node.name)
            node = node.parent
        return "/" + "/".join(reversed(parts))

    def ancestors(self) -> Iterator[QuotaNode]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def root(self) -> QuotaNode:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def flat_root(self, fr: FlavorResource) -> QuotaNode | None:
        """The root if no node from here up has a borrowing or lending limit for ``fr``.

        Then every node's local quota is 0 and each answers ``available`` with
        its parent's: the root's ``subtree_quota - usage`` is the answer.
        """
        try:
            return self._flat[fr]
        except KeyError:
            pass
        root: QuotaNode | None = self.root()
        for node in (self, *self.ancestors()):
            quota = node.quotas.get(fr)
            if quota is not None and (
                quota.borrowing_limit is not None or quota.lending_limit is not None
            ):
                root = None
                break
        self._flat[fr] = root
        return root

    # --- Kueue's resource-node arithmetic -------------------------------------------------

    def local_quota(self, fr: FlavorResource) -> int:
        quota = self.quotas.get(fr)
        if quota is None or quota.lending_limit is None:
            return 0
        return max(0, self.subtree_quota.get(fr, 0) - quota.lending_limit)

    def local_available(self, fr: FlavorResource) -> int:
        quota = self.quotas.get(fr)
        if quota is None or quota.lending_limit is None:
            return max(0, -self.usage.get(fr, 0))  # no local quota
        return max(0, self.local_quota(fr) - self.usage.get(fr, 0))

    def available(self, fr: FlavorResource) -> int:
        """Capacity this node may still use; negative after over-admission."""
        flat = self._flat.get(fr) or self.flat_root(fr)
        if flat is not None:
            return flat.subtree_quota.get(fr, 0) - flat.usage.get(fr, 0)
        parent = self.parent
        if parent is None:
            return self.subtree_quota.get(fr, 0) - self.usage.get(fr, 0)
        quota = self.quotas.get(fr)
        if quota is None or (quota.borrowing_limit is None and quota.lending_limit is None):
            # Nothing kept local (local quota 0) and no cap: the parent's answer.
            return parent.available(fr)
        parent_available = parent.available(fr)
        if quota.borrowing_limit is not None:
            local = self.local_quota(fr)
            stored_in_parent = self.subtree_quota.get(fr, 0) - local
            used_in_parent = max(0, self.usage.get(fr, 0) - local)
            parent_available = min(
                stored_in_parent - used_in_parent + quota.borrowing_limit, parent_available
            )
        return self.local_available(fr) + parent_available

    def potential_available(self, fr: FlavorResource) -> int:
        """The most this node could ever use, with no usage anywhere."""
        cached = self.potential.get(fr)
        if cached is None:
            cached = self.potential[fr] = self._potential_available(fr)
        return cached

    def _potential_available(self, fr: FlavorResource) -> int:
        parent = self.parent
        if parent is None:
            return self.subtree_quota.get(fr, 0)
        result = self.local_quota(fr) + parent.potential_available(fr)
        quota = self.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            result = min(self.subtree_quota.get(fr, 0) + quota.borrowing_limit, result)
        return result

    def borrowing_with(self, fr: FlavorResource, value: int) -> bool:
        return self.usage.get(fr, 0) + value > self.subtree_quota.get(fr, 0)

    def borrowing(self, fr: FlavorResource) -> bool:
        return self.borrowing_with(fr, 0)

    def within_nominal(self, frs: Iterator[FlavorResource] | list[FlavorResource]) -> bool:
        return all(self.usage.get(fr, 0) <= self.subtree_quota.get(fr, 0) for fr in frs)

    def add_usage(self, fr: FlavorResource, value: int) -> None:
        """Use ``value`` more; what local quota cannot hold is used from the parent, and up."""
        node: QuotaNode | None = self
        while node is not None:
            used = node.usage.get(fr, 0)
            quota = node.quotas.get(fr)
            if quota is None or quota.lending_limit is None:
                local_available = -used if used < 0 else 0  # no local quota
            else:
                local_available = max(0, node.local_quota(fr) - used)
            node.usage[fr] = used + value
            if value <= local_available:
                return
            value -= local_available
            node = node.parent

    def remove_usage(self, fr: FlavorResource, value: int) -> None:
        stored_in_parent = self.usage.get(fr, 0) - self.local_quota(fr)
        self.usage[fr] = self.usage.get(fr, 0) - value
        if stored_in_parent <= 0 or self.parent is None:
            return
        self.parent.remove_usage(fr, min(value, stored_in_parent))

    def add(self, usage: Mapping[FlavorResource, int]) -> None:
        for fr, value in usage.items():
            self.add_usage(fr, value)

    def remove(self, usage: Mapping[FlavorResource, int]) -> None:
        for fr, value in usage.items():
            self.remove_usage(fr, value)

    def borrowing_level(self, fr: FlavorResource, value: int) -> tuple[int, bool]:
        """Height of the lowest subtree that fits ``value`` more (0: no borrowing).

        Kueue's ``FindHeightOfLowestSubtreeThatFits``: the level orders entries
        and prefers flavors whose quota comes from closer in the tree; the flag
        says that subtree is smaller than the whole tree (so reclaiming within
        the hierarchy may help).
        """
        if self.parent is None:
            return 0, False
        if self.usage.get(fr, 0) + value <= self.subtree_quota.get(fr, 0):
            return 0, True
        remaining = value - self.local_available(fr)
        node: QuotaNode = self
        for ancestor in self.lineage:
            node = ancestor
            if ancestor.usage.get(fr, 0) + remaining <= ancestor.subtree_quota.get(fr, 0):
                return ancestor.height, ancestor.parent is not None
            remaining -= ancestor.local_available(fr)
        return node.height, node.parent is not None

    def fits_in_subtree(
        self, requests: Mapping[FlavorResource, int]
    ) -> tuple[bool, dict[FlavorResource, int]]:
        """Kueue's ``QuantitiesFitInQuota``: fits here, and what spills to the parent."""
        fits = True
        remaining = {}
        for fr, value in requests.items():
            if self.usage.get(fr, 0) + value > self.subtree_quota.get(fr, 0):
                fits = False
            remaining[fr] = max(0, value - self.local_available(fr))
        return fits, remaining


class QuotaTree:
    """All cohorts and ClusterQueues of a snapshot, with usage loaded."""

    __slots__ = ("cluster_queues", "cohorts", "roots")

    def __init__(self) -> None:
        self.cluster_queues: dict[str, QuotaNode] = {}
        self.cohorts: dict[str, QuotaNode] = {}
        self.roots: list[QuotaNode] = []

    @staticmethod
    def _quotas(groups: tuple[ResourceGroup, ...]) -> dict[FlavorResource, ResourceQuota]:
        quotas: dict[FlavorResource, ResourceQuota] = {}
        for group in groups:
            for flavor in group.flavors:
                for resource, quota in flavor.resources.items():
                    quotas[(flavor.name, resource)] = quota
        return quotas

    def cohort(self, name: str) -> QuotaNode:
        node = self.cohorts.get(name)
        if node is None:
            # Kueue creates implicit cohorts for names only referenced by queues.
            node = QuotaNode(name, is_cluster_queue=False, fair_weight_milli=1000)
            self.cohorts[name] = node
        return node

    def finish(self) -> None:
        """Link parents, detect cycles, and accumulate subtree quota bottom-up."""
        for root in sorted(
            (c for c in self.cohorts.values() if c.parent is None), key=lambda c: c.name
        ):
            self.roots.append(root)
        for cq in sorted(self.cluster_queues.values(), key=lambda c: c.name):
            if cq.parent is None:
                self.roots.append(cq)
        for root in self.roots:
            self._accumulate(root, set())

    def _accumulate(self, node: QuotaNode, seen: set[str]) -> None:
        if node.name in seen:
            raise ValueError(f"cohort cycle through {node.name}")
        seen.add(node.name)
        node.lineage = (node.parent, *node.parent.lineage) if node.parent is not None else ()
        node.subtree_quota = {fr: q.nominal for fr, q in node.quotas.items()}
        node.potential = {}
        node._flat = {}
        node.usage = {}
        node.children.sort(key=lambda c: (c.is_cluster_queue, c.name))
        node.cluster_queues = []
        height = min(len(node.children), 1) if not node.is_cluster_queue else 0
        for child in node.children:
            self._accumulate(child, seen)
            if child.is_cluster_queue:
                node.cluster_queues.append(child)
            else:
                node.cluster_queues.extend(child.cluster_queues)
                height = max(height, child.height + 1)
            for fr, child_quota in child.subtree_quota.items():
                node.subtree_quota[fr] = (
                    node.subtree_quota.get(fr, 0) + child_quota - child.local_quota(fr)
                )
        node.height = height
