"""What the cycle derives of each workload: pod-set info, gang shapes, workload infos.

Derived once per cycle (and shared by workloads whose pod sets are equal), so
the admission loop, the flavor assigner and preemption read precomputed values.
``AdmittedInfo`` is a workload holding quota and capacity; ``CQState`` and
the cycle's state are in ``service.engine.state``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from service.domain.quota import LabelSelector
from service.domain.workload import PodSet, Workload
from service.engine.placement import NodeState, Shape
from service.engine.quota import FlavorResource, QuotaNode

if TYPE_CHECKING:
    from service.engine.state import CQState

__all__ = [
    "AdmittedInfo",
    "FlavorPlan",
    "GangShape",
    "PlanEntry",
    "PlannedFlavor",
    "PodSetInfo",
    "WorkloadInfo",
    "pod_set_key",
    "selector_key",
    "shape_of",
    "sorted_items",
]


def shape_of(requests: Mapping[str, int]) -> Shape:
    items = sorted(requests.items())
    if all(a > 0 for _, a in items):
        return tuple(items)
    return tuple((r, a) for r, a in items if a > 0)


class PodSetInfo:
    """One pod set's requests, totals and placement constraints, derived once.

    Immutable once built: workloads whose pod sets are equal share one
    (see :meth:`CycleState.gang_shape`).
    """

    __slots__ = (
        "count",
        "group",
        "level",
        "mode",
        "name",
        "node_selector",
        "requests",
        "selector_items",
        "shape",
        "sorted_totals",
        "tolerations",
        "totals",
    )

    def __init__(self, pod_set: PodSet) -> None:
        self.name = pod_set.name
        self.count = pod_set.count
        self.requests = pod_set.requests
        self.shape = shape_of(pod_set.requests)
        self.totals = {r: a * pod_set.count for r, a in pod_set.requests.items() if a > 0}
        self.sorted_totals = tuple(sorted(self.totals.items()))
        request = pod_set.topology_request
        self.mode = request.mode if request is not None else "unconstrained"
        self.level = request.level if request is not None else None
        self.group = request.group if request is not None and self.mode == "required" else None
        self.tolerations = pod_set.tolerations
        self.node_selector = pod_set.node_selector
        self.selector_items = sorted_items(pod_set.node_selector)


#: What a gang would take of each flavor-resource of one flavor, with the root that
#: answers for it when no node up to the root limits it (``QuotaNode.flat_root``).
PlannedFlavor = tuple[tuple[FlavorResource, int, QuotaNode | None], ...]


class PlanEntry:
    """A flavor of a :class:`FlavorPlan`: what the gang would take of it, and the
    last answer of its quota check (``flavorassigner.plans._known_flavor_mode``).

    ``version`` is the shared usage counter of the flavor in the quota tree
    (``CycleState.flavor_version``): the answer holds while it is unchanged.
    """

    __slots__ = ("checked_at", "frs", "mode", "name", "version")

    def __init__(self, name: str, frs: PlannedFlavor, version: list[int]) -> None:
        self.name = name
        self.frs = frs
        self.version = version
        #: ``version[0]`` when ``mode`` was computed (-1: never).
        self.checked_at = -1
        self.mode: tuple[int, int] = (0, 0)


class FlavorPlan:
    """How a one-pod-set gang meets one ClusterQueue's quota, whatever the usage.

    ``flavors``: the flavors of the resource group covering all its resources
    that it may use, in the ClusterQueue's order, each with what it would take
    of every flavor-resource. ``general``: not that simple (several pod sets or
    resource groups): search the general way. ``uncovered``: a resource is in
    no resource group.
    """

    __slots__ = ("flavors", "general", "mode", "stamp", "uncovered")

    def __init__(
        self,
        flavors: tuple[PlanEntry, ...] = (),
        general: bool = False,
        uncovered: bool = False,
    ) -> None:
        self.flavors = flavors
        self.general = general
        self.uncovered = uncovered
        #: ``flavorassigner.quota_mode_only``'s answer, valid while the quota tree's usage
        #: stamp (``CycleState.usage_version``) is ``stamp``.
        self.stamp = -1
        self.mode: tuple[int, int] = (0, 0)


class GangShape:
    """What workloads with equal pod sets share: pod-set infos, totals, signature."""

    __slots__ = ("plain_signature", "plans", "pod_sets", "resources", "signature")

    def __init__(self, pod_sets: tuple[PodSetInfo, ...]) -> None:
        self.pod_sets = pod_sets
        if len(pod_sets) == 1:
            self.resources = pod_sets[0].totals
        else:
            totals: dict[str, int] = {}
            for ps in pod_sets:
                for r, a in ps.totals.items():
                    totals[r] = totals.get(r, 0) + a
            self.resources = totals
        self.signature = tuple(
            (ps.shape, ps.mode, ps.level, ps.group, ps.tolerations, ps.selector_items)
            for ps in pod_sets
        )
        #: :meth:`WorkloadInfo.signature` of a gang of this shape without a cluster selector.
        self.plain_signature: tuple[object, ...] = (self.signature, None, len(pod_sets))
        #: ClusterQueue name -> :class:`FlavorPlan` (see ``flavorassigner.flavor_plan``).
        self.plans: dict[str, FlavorPlan] = {}


def pod_set_key(pod_set: PodSet) -> tuple[object, ...]:
    """Equal keys, equal :class:`PodSetInfo` (request order included: totals keep it)."""
    selector = pod_set.node_selector
    topology = pod_set.topology_request
    return (
        pod_set.name,
        pod_set.count,
        tuple(pod_set.requests.items()),
        None if topology is None else (topology.mode, topology.level, topology.group),
        pod_set.tolerations,
        tuple(selector.items()) if selector else (),
    )


class WorkloadInfo:
    """A pending workload with everything the cycle needs precomputed."""

    __slots__ = (
        "_signature",
        "cq",
        "key",
        "lq",
        "pod_sets",
        "priority",
        "resources",
        "seq",
        "shape",
        "time",
        "why",
        "wl",
    )

    def __init__(
        self,
        wl: Workload,
        priority: int,
        seq: int,
        key: str | None = None,
        shape: GangShape | None = None,
        time: float | None = None,
    ) -> None:
        self.wl = wl
        self.key = wl.key if key is None else key
        self.priority = priority
        self.time = wl.ordering_time if time is None else time
        self.seq = seq
        self.cq: CQState | None = None
        self.lq = wl.queue_key
        if shape is None:
            shape = GangShape(tuple(PodSetInfo(ps) for ps in wl.pod_sets))
        self.shape = shape
        self.pod_sets = shape.pod_sets
        self.resources = shape.resources
        self._signature: tuple[object, ...] | None = (
            shape.plain_signature if wl.cluster_selector is None else None
        )
        #: Why it still waits, once the cycle knows (``failures.Entry``); ``None`` otherwise.
        self.why: object = None

    def signature(self) -> tuple[object, ...]:
        """Everything but counts that decides where the gang may go (for fast rejects)."""
        if self._signature is None:
            selector = self.wl.cluster_selector
            assert selector is not None
            self._signature = (
                self.shape.signature,
                selector_key(selector),
                len(self.pod_sets),
            )
        return self._signature


def sorted_items(mapping: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    if not mapping:
        return ()
    return tuple(sorted(mapping.items()))


def selector_key(selector: LabelSelector | None) -> object:
    if selector is None:
        return None
    return (sorted_items(selector.match_labels), selector.match_expressions)


class AdmittedInfo:
    """A workload holding quota and capacity during the cycle."""

    __slots__ = (
        "admitted_at",
        "checkpoint",
        "cluster",
        "cq",
        "cq_name",
        "fresh",
        "key",
        "lq",
        "placements",
        "pods_ready",
        "priority",
        "resources",
        "time",
        "usage",
        "wl",
    )

    def __init__(
        self,
        *,
        wl: Workload,
        cq_name: str,
        cq: CQState | None,
        priority: int,
        cluster: str,
        usage: dict[FlavorResource, int],
        placements: list[tuple[NodeState, int, Shape]],
        admitted_at: float,
        fresh: bool,
        pending: WorkloadInfo | None = None,
    ) -> None:
        """``pending``: the workload's info when it is admitted this cycle (derived values)."""
        self.wl = wl
        self.cq_name = cq_name
        self.cq = cq
        self.priority = priority
        self.cluster = cluster
        self.usage = usage
        self.placements = placements
        self.admitted_at = admitted_at
        self.fresh = fresh
        self.pods_ready: bool | None = None
        #: Its last checkpoint (see ``AdmittedWorkload.last_checkpoint``).
        self.checkpoint: float | None = None
        if pending is not None and len(pending.pod_sets) == 1:
            # One pod set: its totals are the usage summed over flavors, in the same order.
            self.key, self.time, self.lq = pending.key, pending.time, pending.lq
            self.resources = pending.resources
            return
        self.key = wl.key
        self.time = wl.ordering_time
        self.lq = wl.queue_key
        resources: dict[str, int] = {}
        for (_, r), a in usage.items():
            resources[r] = resources.get(r, 0) + a
        self.resources = resources

    def uses_any(self, frs: set[FlavorResource] | frozenset[FlavorResource]) -> bool:
        return any(fr in frs for fr in self.usage)

    def accelerators(self, names: tuple[str, ...]) -> int:
        """How many accelerators (of ``names``, e.g. GPUs) it holds."""
        return sum(self.resources.get(name, 0) for name in names)

    def seconds_at_risk(self, now: float) -> float:
        """Seconds of run a preemption now would destroy: since its last
        checkpoint, or since admission when none is known (or it predates it)."""
        saved = self.admitted_at
        if self.checkpoint is not None and self.checkpoint > saved:
            saved = min(self.checkpoint, now)
        return max(0.0, now - saved)
