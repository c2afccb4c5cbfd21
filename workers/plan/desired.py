"""What a member should hold: its queue objects and jobs, worked out per
central ClusterQueue (in generations where one member queue cannot hold
them all), with a memo that keeps each gang's placement between passes."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from workers.plan.jobs import member_job, priority_of
from workers.plan.names import (
    API_VERSIONS,
    CLUSTER_UID_LABEL,
    RUNS_HERE,
    admission_id,
    dns_label,
    managed_labels,
    priority_class_name,
    short_name,
)
from workers.plan.queues import (
    Desired,
    MemberQueue,
    Placements,
    Use,
    components,
    member_flavor,
    member_queue,
    merged_uses,
    one_flavor_per_group,
    unambiguous,
    use_of,
)
from workers.plan.serving import (
    UNITS_RUN,
    admission_label,
    is_serving,
    member_object,
    parts,
    selectors,
    unit_view,
    units,
)
from workers.plan.views import ClusterView, Obj, Ref, WorkloadView


@dataclass
class Admitted:
    """A workload admitted here, as desired() gathers it."""

    workload: WorkloadView
    uses: list[Use]
    selectors: dict[str, dict[str, str]]


@dataclass(frozen=True)
class _Kept:
    """What :func:`desired` made of one cluster's workloads in its last
    pass, by (uid, version): valid while the flavors and topologies it read
    are as they were (a copy of them, compared whole every pass)."""

    flavors: Mapping[str, Mapping[str, Any]]
    topologies: Mapping[str, Mapping[str, Any]]
    entries: Mapping[tuple[str, int], Admitted]
    #: A serving workload's replicas here, each as a gang, by the same stamp.
    replicas: Mapping[tuple[str, int], list[Admitted]] = field(default_factory=dict)


class PlanMemo:
    """What :func:`desired` made of each cluster's gangs in its last pass,
    for the next one: a gang's placement (its flavors, islands and node
    selectors) is worked out once per (uid, version) while the cluster's
    flavors and topologies stay as they were. Owned by whoever runs the
    passes and handed in (workers/reconcile.py keeps one per process);
    without one, a pass works out every gang afresh. Each pass replaces its
    cluster's entry whole, so it holds only current gangs; a pass of another
    thread at the same time only replaces what is equally valid."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    def kept(self, view: ClusterView) -> _Kept:
        """``view.cluster``'s kept entries if its flavors and topologies are
        unchanged, else none (and a copy of the new ones to compare with)."""
        kept = self._kept.get(view.cluster)
        if kept is not None and kept.flavors == view.flavors and kept.topologies == view.topologies:
            return kept
        return _Kept(copy.deepcopy(dict(view.flavors)), copy.deepcopy(dict(view.topologies)), {})

    def keep(self, cluster: str, kept: _Kept) -> None:
        self._kept[cluster] = kept


def _admitted(view: ClusterView, workload: WorkloadView, placements: Placements) -> Admitted:
    entry = Admitted(workload, [], {})
    for assignment in workload.admission.get("podSetAssignments") or ():
        use = use_of(view, assignment, placements)
        entry.uses.append(use)
        entry.selectors.setdefault(str(assignment.get("name")), {}).update(use.selector)
    return entry


def _links(uses: Iterable[Use]) -> list[list[str]]:
    used: dict[str, set[str]] = {}
    for use in uses:
        for resource, (flavor, _) in use.flavors.items():
            used.setdefault(flavor, set()).add(resource)
    return [sorted(resources) for resources in used.values()]


def _holds(
    view: ClusterView, spec: Mapping[str, Any], admitted: Sequence[Admitted]
) -> MemberQueue | None:
    """The one member ClusterQueue that admits exactly ``admitted``, if any."""
    uses = merged_uses(u for a in admitted for u in a.uses)
    if not one_flavor_per_group(components(_links(uses)), uses):
        return None
    member = member_queue(view, "", spec, uses)
    return member if unambiguous(view, member, uses) else None


def _generations(
    view: ClusterView, spec: Mapping[str, Any], admitted: Sequence[Admitted]
) -> list[tuple[list[Admitted], MemberQueue]]:
    """Admissions of one central ClusterQueue with the member ClusterQueue
    that holds them: one for all, unless no one can (the centre's resource
    groups changed between them: a flavor covering cpu and GPUs then, cpu
    alone now); then the earliest admissions first, the rest in further
    generations, each its own member ClusterQueue."""
    whole = _holds(view, spec, admitted)
    if whole is not None:
        return [(list(admitted), whole)]
    out: list[tuple[list[Admitted], MemberQueue]] = []
    order = sorted(
        admitted, key=lambda a: (str(a.workload.admission.get("admittedAt")), a.workload.key)
    )
    for entry in order:
        for index, (generation, _) in enumerate(out):
            member = _holds(view, spec, [*generation, entry])
            if member is not None:
                out[index] = ([*generation, entry], member)
                break
        else:
            # Alone it always fits: the centre admitted it as one flavor per group.
            alone = _holds(view, spec, [entry]) or member_queue(view, "", spec, entry.uses)
            out.append(([entry], alone))
    return out


def _generation_name(name: str, generation: int, limit: int = 63) -> str:
    """Central names reach the member through :func:`dns_label` (no dots), so a
    dotted suffix cannot collide with another queue's name."""
    return (
        short_name(name, limit)
        if generation == 0
        else f"{short_name(name, limit - 8)}.g{generation}"
    )


def _local_queue(out: Desired, workload: WorkloadView, cq: str, generation: int) -> str:
    """``qm-<queue>``, unless the namespace's queue already points at
    another member ClusterQueue (the central LocalQueue was moved to another
    ClusterQueue while gangs admitted through it still run)."""
    local = f"qm-{dns_label(str(workload.spec.get('queueName', 'default')))}"
    name = _generation_name(local, generation)
    taken = out.queues.get(Ref("LocalQueue", workload.namespace, name))
    if taken is None or taken["spec"]["clusterQueue"] == cq:
        return name
    digest = hashlib.sha256(cq.encode()).hexdigest()[:8]
    return f"{short_name(local, 63 - 9)}.{digest}"


def desired(
    view: ClusterView, held: Set[tuple[str, str]] = frozenset(), memo: PlanMemo | None = None
) -> Desired:
    """What the member should hold. ``held``: the (workload, admission) keys
    of the jobs it holds, which are only noted in ``held``, not built (a
    pass built every in-flight gang's job to dispatch a few). ``memo``: what
    the last pass over this cluster worked out, reused and renewed."""
    out = Desired()
    #: Serving workloads whose member objects are planned (once each, in
    #: the generation of the first of their replicas met).
    served: set[str] = set()
    for central, admitted in sorted(admitted_here(view, out, memo).items()):
        spec = view.cluster_queues.get(central) or {}
        for generation, (entries, member) in enumerate(_generations(view, spec, admitted)):
            cq = _generation_name(f"qm-{dns_label(central)}", generation, 253)
            member.queue["metadata"]["name"] = cq
            out.queues[Ref("ClusterQueue", "", cq)] = member.queue
            for name, placed in member.flavors.items():
                ref = Ref("ResourceFlavor", "", name)
                if ref not in out.queues:
                    out.queues[ref] = member_flavor(view, name, placed)
            _jobs(out, entries, cq, generation, held, view, served)
    if view.cluster_uid:
        for obj in (*out.namespaces.values(), *out.queues.values(), *out.jobs.values()):
            obj["metadata"]["labels"][CLUSTER_UID_LABEL] = view.cluster_uid
    return out


def workload_priority_class(priority: int) -> tuple[Ref, Obj]:
    """A Kueue member's ``qm-p<priority>``."""
    wpc = Ref("WorkloadPriorityClass", "", priority_class_name(priority))
    return wpc, {
        "apiVersion": API_VERSIONS["WorkloadPriorityClass"],
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": wpc.name, "labels": managed_labels()},
        "value": priority,
    }


def admitted_here(
    view: ClusterView,
    out: Desired,
    memo: PlanMemo | None,
    priority_class: Callable[[int], tuple[Ref, Obj]] = workload_priority_class,
) -> dict[str, list[Admitted]]:
    """The workloads admitted here by central ClusterQueue, each with its
    uses; their Namespaces and priority classes (``priority_class`` makes
    the backend's) noted in ``out``."""
    by_queue: dict[str, list[Admitted]] = {}
    placements: Placements = {}
    kept = memo.kept(view) if memo is not None else _Kept({}, {}, {})
    entries: dict[tuple[str, int], Admitted] = {}
    units_kept: dict[tuple[str, int], list[Admitted]] = {}
    priorities: set[int] = set()
    for workload in view.workloads:
        if is_serving(workload):
            stamp = (workload.uid, workload.version or 0)
            replicas = kept.replicas.get(stamp) if workload.version is not None else None
            if replicas is None:
                replicas = _replicas(view, workload, placements)
            if workload.version is not None:
                units_kept[stamp] = replicas
            for unit in replicas:
                central = str(unit.workload.admission["clusterQueue"])
                by_queue.setdefault(central, []).append(unit)
            if replicas:
                _note(out, workload, priorities, priority_class)
            continue
        if workload.state not in RUNS_HERE or workload.admission.get("cluster") != view.cluster:
            continue
        central = str(workload.admission["clusterQueue"])
        if workload.version is None:
            entry = _admitted(view, workload, placements)
        else:
            stamp = (workload.uid, workload.version)
            known = kept.entries.get(stamp)
            entry = known if known is not None else _admitted(view, workload, placements)
            entries[stamp] = entry
        by_queue.setdefault(central, []).append(Admitted(workload, entry.uses, entry.selectors))
        _note(out, workload, priorities, priority_class)
    if memo is not None:
        memo.keep(view.cluster, _Kept(kept.flavors, kept.topologies, entries, units_kept))
    return by_queue


def _replicas(view: ClusterView, workload: WorkloadView, placements: Placements) -> list[Admitted]:
    """A serving workload's replicas admitted here, each as a gang of its
    own (its uses raise the member queue's quota as a gang's do); none
    once it stops (cancelled, evicted, finished)."""
    if workload.state not in UNITS_RUN:
        return []
    return [
        _admitted(view, unit_view(workload, entry), placements)
        for entry in units(workload, view.cluster)
        if (entry.get("admission") or {}).get("clusterQueue")
    ]


def _note(
    out: Desired,
    workload: WorkloadView,
    priorities: set[int],
    priority_class: Callable[[int], tuple[Ref, Obj]],
) -> None:
    """The Namespace and the priority class an admitted workload needs here."""
    if workload.namespace not in out.namespaces:
        out.namespaces[workload.namespace] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": workload.namespace, "labels": managed_labels()},
        }
    priority = priority_of(workload)
    if priority not in priorities:
        priorities.add(priority)
        ref, obj = priority_class(priority)
        out.queues[ref] = obj


def serving_objects(
    out: Desired,
    view: ClusterView,
    workload: WorkloadView,
    queue: str,
    held: Set[tuple[str, str]],
) -> None:
    """The member objects of a serving workload here, one per placement of
    its admitted replicas (workers/plan/serving.py), and their counts; one
    the member holds is only counted, not built (a copy of its manifest
    was most of a pass over many)."""
    for part in parts(workload, view.cluster):
        key = (workload.key, admission_label(workload, part.key))
        out.replicas[key] = part.replicas
        if key in held:
            out.held.add(key)
        else:
            out.jobs[key] = member_object(part, queue, selectors(view, part))


def _jobs(
    out: Desired,
    entries: Sequence[Admitted],
    cq: str,
    generation: int,
    held: Set[tuple[str, str]],
    view: ClusterView | None = None,
    served: set[str] | None = None,
) -> None:
    """The LocalQueues and the jobs of ``entries``, admitted through member
    ClusterQueue ``cq``: jobs the member holds only noted. A serving
    workload's replicas make its member objects, with their counts (what
    scaling compares)."""
    #: A (namespace, central LocalQueue)'s member LocalQueue, once decided.
    queues: dict[tuple[str, str], str] = {}
    for entry in entries:
        workload = entry.workload
        local = (workload.namespace, str(workload.spec.get("queueName", "default")))
        queue = queues.get(local)
        if queue is None:
            queue = queues[local] = _local_queue(out, workload, cq, generation)
            out.queues.setdefault(
                Ref("LocalQueue", workload.namespace, queue),
                {
                    "apiVersion": API_VERSIONS["LocalQueue"],
                    "kind": "LocalQueue",
                    "metadata": {
                        "name": queue,
                        "namespace": workload.namespace,
                        "labels": managed_labels(),
                    },
                    "spec": {"clusterQueue": cq},
                },
            )
        if is_serving(workload):
            if view is not None and served is not None and workload.key not in served:
                served.add(workload.key)
                serving_objects(out, view, workload, queue, held)
            continue
        admission = admission_id(workload)
        if (workload.key, admission) in held:
            out.held.add((workload.key, admission))
            continue
        out.jobs[(workload.key, admission)] = member_job(
            workload, queue, entry.selectors, admission
        )
