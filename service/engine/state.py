"""The engine's mutable working state for one cycle, built from an immutable Snapshot.

``CQState`` is a ClusterQueue during the cycle; ``CycleState`` holds the quota
tree, the inventory and the admitted workloads, mutated as the cycle decides.
What is derived of each workload is in ``service.engine.workload_info``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.domain.quota import (
    WORKLOAD_CLASSES,
    ClusterQueue,
    LabelSelector,
    LocalQueue,
    ResourceFlavor,
    Toleration,
    Topology,
)
from service.domain.workload import AdmittedWorkload, Workload
from service.engine.fair_sharing import decay_factor, decayed_usage, weighted_usage
from service.engine.island_classes import closed_statically, open_now
from service.engine.packing import GangPlacement, PodSetRequest, place_gang
from service.engine.placement import Inventory, Island, NodeState, Shape
from service.engine.protection import Protection
from service.engine.quota import FlavorResource, QuotaNode, QuotaTree
from service.engine.types import LocalQueueUsage, Snapshot
from service.engine.workload_info import (
    AdmittedInfo,
    GangShape,
    PodSetInfo,
    WorkloadInfo,
    pod_set_key,
    selector_key,
    shape_of,
    sorted_items,
)

__all__ = ["CQState", "CycleState"]


class CQState:
    __slots__ = (
        "group_of",
        "groups",
        "name",
        "node",
        "preemptible",
        "preempts_while_borrowing",
        "root",
        "spec",
        "strict",
    )

    def __init__(self, spec: ClusterQueue, node: QuotaNode) -> None:
        self.spec = spec
        self.name = spec.name
        self.node = node
        self.groups = [
            (frozenset(g.covered_resources), tuple(f.name for f in g.flavors))
            for g in spec.resource_groups
        ]
        self.group_of: dict[str, int] = {}
        for index, (covered, _) in enumerate(self.groups):
            for resource in covered:
                self.group_of.setdefault(resource, index)
        #: Workloads admitted before this cycle: the only possible preemption victims.
        self.preemptible: dict[str, AdmittedInfo] = {}
        self.root = node.root().name
        #: Whether a flavor it would borrow in may still need preemption (set per cycle).
        self.preempts_while_borrowing = False
        self.strict = spec.queueing_strategy == "StrictFIFO"


class CycleState:
    """Quota tree, inventory and admitted workloads, mutated as the cycle decides."""

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snapshot = snapshot
        self.now = now
        self.config = snapshot.config
        self.flavors: dict[str, ResourceFlavor] = {f.name: f for f in snapshot.resource_flavors}
        self.topologies: dict[str, Topology] = {t.name: t for t in snapshot.topologies}
        self.priority_classes = {p.name: p.value for p in snapshot.priority_classes}
        self.namespaces = snapshot.namespaces
        self.local_queues: dict[str, LocalQueue] = {lq.key: lq for lq in snapshot.local_queues}
        self.tree = QuotaTree()
        self.cqs: dict[str, CQState] = {}
        self._build_tree()
        #: Minimum runtimes and preemption budgets (``service.engine.protection``).
        self.protection = Protection(snapshot.cluster_queues, snapshot.preemption_budgets, now)
        self.inventory = Inventory(
            snapshot.clusters,
            snapshot.nodes,
            snapshot.config.accelerator_resources,
            spread_island_first=snapshot.config.spread_packing == "IslandFirst",
        )
        #: Class -> bumped whenever an island starts or stops holding another class
        #: (``island_classes``): requests of that class are then filtered anew.
        self.class_epochs: dict[str, int] = dict.fromkeys(WORKLOAD_CLASSES, 0)
        self.admitted: dict[str, AdmittedInfo] = {}
        #: Serving workload key -> its admitted units by key (``service.engine.replicas``).
        self.units: dict[str, dict[str, AdmittedInfo]] = {}
        #: ClusterQueues whose serving units the last preemption search could
        #: not take for their ``minReplicas`` floor (``preemption``).
        self.floored: frozenset[str] = frozenset()
        #: ClusterQueue -> seconds until the first of its island gangs' grace
        #: (``islandGangGraceSeconds``) lapses for the workload the last
        #: preemption search served, when that grace kept it from a plan.
        self.graced: dict[str, float] = {}
        #: Per quota-tree root, how many workloads there may be preempted.
        self.preemptible_in_tree: dict[str, int] = {}
        #: Per quota-tree root, bumped on every usage change in the tree.
        self.usage_version: dict[str, int] = {}
        #: ``(quota-tree root, flavor)`` -> a counter (one item) bumped on every usage
        #: change of that flavor there; plans hold it (``PlanEntry.version``).
        self.flavor_version: dict[tuple[str, str], list[int]] = {}
        for admitted in sorted(snapshot.admitted, key=lambda a: a.workload.key):
            self._load_admitted(admitted)
        self.lendable_cache: dict[str, dict[str, int]] = {}
        self.eligible_cache: dict[object, dict[int, Island]] = {}
        self.pristine_cache: dict[tuple[int, Shape], int] = {}
        self.mismatch_cache: dict[object, str | None] = {}
        #: See ``flavorassigner.plans._plan_skeleton``.
        self.plan_skeletons: dict[tuple[object, ...], tuple[Any, ...]] = {}
        self.node_flavors_cache: dict[int, list[str]] = {}
        #: ``(pod set, flavor names, cluster selector key, class, now)`` -> request.
        self._requests: dict[tuple[object, ...], PodSetRequest] = {}
        #: Bumped whenever capacity is freed (eviction, preemption): fast-reject caches reset.
        self.epoch = 0
        #: Pod-set keys -> the shape workloads with those pod sets share (see ``gang_shape``).
        self._gang_shapes: dict[tuple[object, ...], GangShape] = {}
        self._single_shapes: dict[tuple[object, ...], GangShape] = {}
        self._init_lq_usage()

    # --- construction ---------------------------------------------------------------------

    def _build_tree(self) -> None:
        tree = self.tree
        for cohort in self.snapshot.cohorts:
            node = tree.cohort(cohort.name)
            node.fair_weight = cohort.fair_weight_milli / 1000.0
            node.quotas = QuotaTree._quotas(cohort.resource_groups)
        for cohort in self.snapshot.cohorts:
            if cohort.parent_name:
                child, parent = tree.cohorts[cohort.name], tree.cohort(cohort.parent_name)
                child.parent = parent
                parent.children.append(child)
        for spec in self.snapshot.cluster_queues:
            node = QuotaNode(spec.name, True, spec.fair_weight_milli)
            node.quotas = QuotaTree._quotas(spec.resource_groups)
            tree.cluster_queues[spec.name] = node
            if spec.cohort_name:
                parent = tree.cohort(spec.cohort_name)
                node.parent = parent
                parent.children.append(node)
            self.cqs[spec.name] = CQState(spec, node)
        tree.finish()
        fair = self.config.fair_sharing.enable
        for cq in self.cqs.values():
            preemption = cq.spec.preemption
            cq.preempts_while_borrowing = preemption.borrow_within_cohort.policy != "Never" or (
                fair and preemption.reclaim_within_cohort != "Never"
            )

    def _load_admitted(self, admitted: AdmittedWorkload) -> None:
        wl = admitted.workload
        admission = admitted.admission
        cq = self.cqs.get(admission.cluster_queue)
        usage: dict[FlavorResource, int] = {}
        placements: list[tuple[NodeState, int, Shape]] = []
        pod_sets = {ps.name: ps for ps in wl.pod_sets}
        for assignment in admission.pod_set_assignments:
            pod_set = pod_sets.get(assignment.name)
            for resource, flavor in assignment.flavors.items():
                amount = assignment.resource_usage.get(resource)
                if amount is None and pod_set is not None:
                    amount = pod_set.requests.get(resource, 0) * assignment.count
                if amount:
                    fr = (flavor, resource)
                    usage[fr] = usage.get(fr, 0) + amount
            if pod_set is None:
                continue
            shape = shape_of(pod_set.requests)
            for node_name, pods in assignment.placement:
                node = self.inventory.nodes.get(node_name)
                if node is not None and pods > 0:
                    placements.append((node, pods, shape))
        info = AdmittedInfo(
            wl=wl,
            cq_name=admission.cluster_queue,
            cq=cq,
            priority=self.priority_of(wl),
            cluster=admission.cluster,
            usage=usage,
            placements=placements,
            admitted_at=admitted.admitted_at,
            fresh=False,
        )
        info.pods_ready = admitted.pods_ready
        info.checkpoint = admitted.last_checkpoint
        self.admitted[info.key] = info
        self._count_unit(info, True)
        self._hold(info)

    def _init_lq_usage(self) -> None:
        afs = self.config.admission_fair_sharing
        current: dict[str, dict[str, int]] = {}
        for info in self.admitted.values():
            bucket = current.setdefault(info.lq, {})
            for r, a in info.resources.items():
                bucket[r] = bucket.get(r, 0) + a
        self.lq_consumed: dict[str, dict[str, float]] = {}
        keys = set(current) | set(self.snapshot.local_queue_usage) | set(self.local_queues)
        for key in sorted(keys):
            stored = self.snapshot.local_queue_usage.get(key)
            if stored is None:
                consumed = decayed_usage({}, current.get(key, {}), 0.0, afs.usage_half_life_seconds)
            else:
                consumed = decayed_usage(
                    stored.consumed,
                    current.get(key, {}),
                    self.now - stored.last_update,
                    afs.usage_half_life_seconds,
                )
            self.lq_consumed[key] = consumed
        self.sampled_usage = {
            key: LocalQueueUsage(consumed=dict(value), last_update=self.now)
            for key, value in self.lq_consumed.items()
        }
        self.entry_penalty_factor = decay_factor(
            afs.usage_sampling_interval_seconds, afs.usage_half_life_seconds
        )

    # --- lookups --------------------------------------------------------------------------

    def gang_shape(self, wl: Workload) -> GangShape:
        """The workload's derived pod-set data, shared by every workload with equal pod sets.

        A big queue holds few distinct gang shapes: deriving each once keeps
        building the pending set cheap and lets equal signatures be one object.
        """
        pod_sets = wl.pod_sets
        if len(pod_sets) == 1:
            # ``pod_set_key``, inlined: this runs for every pending workload.
            ps = pod_sets[0]
            selector, topology = ps.node_selector, ps.topology_request
            key = (
                ps.name,
                ps.count,
                tuple(ps.requests.items()),
                None if topology is None else (topology.mode, topology.level, topology.group),
                ps.tolerations,
                tuple(selector.items()) if selector else (),
            )
            shape = self._single_shapes.get(key)
            if shape is None:
                shape = self._single_shapes[key] = GangShape((PodSetInfo(pod_sets[0]),))
            return shape
        keys = tuple(pod_set_key(ps) for ps in pod_sets)
        shape = self._gang_shapes.get(keys)
        if shape is None:
            shape = GangShape(tuple(PodSetInfo(ps) for ps in pod_sets))
            self._gang_shapes[keys] = shape
        return shape

    def priority_of(self, wl: Workload) -> int:
        if wl.priority is not None:
            return wl.priority
        if wl.priority_class_name is not None:
            return self.priority_classes.get(wl.priority_class_name, 0)
        return 0

    def lq_usage(self, lq_key: str) -> float:
        """The LocalQueue's admission fair-sharing value (0 when AFS is off)."""
        afs = self.config.admission_fair_sharing
        if not afs.enable:
            return 0.0
        consumed = self.lq_consumed.get(lq_key)
        if not consumed:
            return 0.0
        lq = self.local_queues.get(lq_key)
        weight = lq.fair_weight_milli / 1000.0 if lq is not None else 1.0
        return weighted_usage(consumed, afs.resource_weights, weight)

    def eligible_islands(
        self,
        flavors: tuple[str, ...],
        tolerations: tuple[Toleration, ...],
        node_selector: Mapping[str, str],
        cluster_selector: LabelSelector | None,
        workload_class: str | None = None,
    ) -> dict[int, Island]:
        """Islands the flavors' labels and taints allow, not labelled for
        another class than ``workload_class`` (``None``: any class)."""
        key = (
            flavors,
            tolerations,
            sorted_items(node_selector),
            selector_key(cluster_selector),
            workload_class,
        )
        cached = self.eligible_cache.get(key)
        if cached is not None:
            return cached
        labels: dict[str, str] = dict(node_selector)
        all_tolerations = list(tolerations)
        for name in flavors:
            flavor = self.flavors.get(name)
            if flavor is not None:
                labels.update(flavor.node_labels)
                all_tolerations.extend(flavor.tolerations)
        result = self.inventory.matching_islands(labels, all_tolerations, cluster_selector)
        if workload_class is not None:
            result = {s: i for s, i in result.items() if not closed_statically(i, workload_class)}
        self.eligible_cache[key] = result
        return result

    def pod_set_request(
        self, wi: WorkloadInfo, index: int, flavors: Mapping[str, str], *, now: bool = True
    ) -> PodSetRequest:
        """Pod set ``index`` to place with ``flavors`` (resource -> flavor), memoised.

        ``now``: without the islands that hold the other class at the moment;
        ``False`` for what an empty fleet would allow (feasibility)."""
        return self._request(wi, index, tuple(sorted(set(flavors.values()))), now)

    def place_simply(self, wi: WorkloadInfo, flavor: str) -> GangPlacement | None:
        """Room now for a one-pod-set gang with every resource in ``flavor``, or ``None``."""
        return place_gang(self.inventory, [self._request(wi, 0, (flavor,))])

    def _request(
        self, wi: WorkloadInfo, index: int, names: tuple[str, ...], now: bool = True
    ) -> PodSetRequest:
        # Requests depend only on the pod set, the flavors, the cluster selector and
        # the class, and are not changed by placing (only their memos fill in):
        # share them, until islands change class.
        ps = wi.pod_sets[index]
        selector = wi.wl.cluster_selector
        cq = wi.cq
        workload_class = None if cq is not None and cq.spec.mixed_islands else wi.wl.workload_class
        prefer = wi.wl.workload_class if self._prefers_held(wi) else None
        key = (
            ps,
            names,
            None if selector is None else selector_key(selector),
            workload_class,
            now,
            prefer,
        )
        request = self._requests.get(key)
        stale = now and workload_class is not None and request is not None
        if request is None or (
            stale and request.class_epoch != self.class_epochs.get(workload_class or "", 0)
        ):
            request = self._requests[key] = self._new_request(
                ps, names, selector, workload_class, now
            )
            request.prefer_held = prefer
        return request

    def _prefers_held(self, wi: WorkloadInfo) -> bool:
        return self.config.serving_islands_first and wi.wl.workload_class == "inference"

    def _new_request(
        self,
        ps: PodSetInfo,
        names: tuple[str, ...],
        cluster_selector: LabelSelector | None,
        workload_class: str | None,
        now: bool,
    ) -> PodSetRequest:
        eligible: Mapping[int, Island] = self.eligible_islands(
            names, ps.tolerations, ps.node_selector, cluster_selector, workload_class
        )
        shared = eligible
        if now and workload_class is not None:
            eligible = open_now(eligible, workload_class)
        level = ps.level
        if ps.mode != "unconstrained" and level is not None:
            for name in names:
                flavor = self.flavors.get(name)
                topology = self.topologies.get(flavor.topology_name or "") if flavor else None
                if topology is not None and topology.levels and topology.levels[0] == level:
                    level = None
        node_flavors = self.node_flavors_cache.get(id(eligible)) if eligible is shared else None
        if node_flavors is None:
            node_flavors = sorted({island.node_flavor for island in eligible.values()})
            if eligible is shared:
                # ``eligible`` lives in ``eligible_cache`` for the whole cycle: its id is stable
                # (a mapping filtered for the class of the moment does not, and is not kept).
                self.node_flavors_cache[id(eligible)] = node_flavors
        request = PodSetRequest(
            ps.name, ps.count, ps.shape, ps.mode, level, eligible, node_flavors, group=ps.group
        )
        request.class_epoch = self.class_epochs.get(workload_class or "", 0)
        return request

    # --- mutation -------------------------------------------------------------------------

    def _hold(self, info: AdmittedInfo) -> None:
        cq = info.cq
        if cq is not None:
            cq.node.add(info.usage)
            self._usage_changed(cq.root, info)
            if not info.fresh:
                cq.preemptible[info.key] = info
                self.preemptible_in_tree[cq.root] = self.preemptible_in_tree.get(cq.root, 0) + 1
        for node, pods, shape in info.placements:
            self.inventory._change(node, shape, pods, 1)
        self._held(info, 1)

    def _held(self, info: AdmittedInfo, sign: int) -> None:
        """Count the gang's pods in its islands' classes (``island_classes``)."""
        workload_class = info.wl.workload_class
        for node, pods, _ in info.placements:
            island = node.island
            if island is None:
                continue
            before = island.held.get(workload_class, 0)
            after = island.held[workload_class] = before + sign * pods
            if (before > 0) != (after > 0):
                for other in self.class_epochs:
                    if other != workload_class:
                        self.class_epochs[other] += 1

    def _usage_changed(self, root: str, info: AdmittedInfo) -> None:
        self.usage_version[root] = self.usage_version.get(root, 0) + 1
        counters = self.flavor_version
        for flavor, _ in info.usage:
            counter = counters.get((root, flavor)) or self.flavor_counter(root, flavor)
            counter[0] += 1

    def flavor_counter(self, root: str, flavor: str) -> list[int]:
        """The usage counter of ``flavor`` in the quota tree of ``root`` (``flavor_version``)."""
        key = (root, flavor)
        counter = self.flavor_version.get(key)
        if counter is None:
            counter = self.flavor_version[key] = [0]
        return counter

    def _unhold(self, info: AdmittedInfo) -> None:
        cq = info.cq
        if cq is not None:
            cq.node.remove(info.usage)
            self._usage_changed(cq.root, info)
            if cq.preemptible.pop(info.key, None) is not None:
                self.preemptible_in_tree[cq.root] -= 1
        for node, pods, shape in info.placements:
            self.inventory._change(node, shape, pods, -1)
        self._held(info, -1)

    def simulate_remove(self, info: AdmittedInfo) -> None:
        self._unhold(info)

    def simulate_restore(self, info: AdmittedInfo) -> None:
        self._hold(info)

    def evict(self, info: AdmittedInfo) -> None:
        """Release a workload's quota and capacity for good (preempted or evicted)."""
        self._unhold(info)
        del self.admitted[info.key]
        self._count_unit(info, False)
        self.epoch += 1

    def _count_unit(self, info: AdmittedInfo, present: bool) -> None:
        parent = info.wl.replica_of
        if parent is None:
            return
        units = self.units.setdefault(parent, {})
        if present:
            units[info.key] = info
        else:
            units.pop(info.key, None)

    def admit(
        self,
        wi: WorkloadInfo,
        usage: dict[FlavorResource, int],
        placement: GangPlacement,
    ) -> AdmittedInfo:
        assert wi.cq is not None
        if len(wi.pod_sets) == 1 == len(placement.pod_sets):
            shape = wi.pod_sets[0].shape
            placements = [(node, pods, shape) for node, pods in placement.pod_sets[0].nodes]
        else:
            placements = [
                (node, pods, ps.shape)
                for ps, placed in zip(wi.pod_sets, placement.pod_sets, strict=True)
                for node, pods in placed.nodes
            ]
        info = AdmittedInfo(
            wl=wi.wl,
            cq_name=wi.cq.name,
            cq=wi.cq,
            priority=wi.priority,
            cluster=placement.cluster,
            usage=usage,
            placements=placements,
            admitted_at=self.now,
            fresh=True,
            pending=wi,
        )
        self.admitted[info.key] = info
        self._count_unit(info, True)
        self._hold(info)
        self._penalise(info)
        return info

    def _penalise(self, info: AdmittedInfo) -> None:
        """Admission fair sharing's entry penalty: count the admission at once."""
        consumed = self.lq_consumed.setdefault(info.lq, {})
        factor = self.entry_penalty_factor
        for r, a in info.resources.items():
            consumed[r] = consumed.get(r, 0.0) + a * factor
