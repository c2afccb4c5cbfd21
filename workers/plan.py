"""Pure planners: what one member cluster should hold, given the centre's
decisions, against what it holds; and the events sync derives from it.

No I/O here: the reconciler (workers/reconcile.py) loads the read models and
lists the member cluster, calls :func:`plan`, and carries the actions out.

The centre stays the only quota authority. Each member ClusterQueue
``qm-<cq>`` mirrors the central ClusterQueue's resource groups (a pod set
admitted with cpu of one flavor and GPUs of another fits, as it did
centrally): per group, one member flavor per central flavor and island
(``qm-<flavor>-<island>``: the flavor's node labels plus the island's
label), each listing the group's covered resources with a nominal quota of
exactly what the centre admitted there; no cohort and no preemption. So it
cannot admit what the centre did not (nothing else is queued to it and
there is no room), nor block what it admitted (the quota is raised before
the job is created, and every admission reads as one flavor per group).
Admissions that no one ClusterQueue can hold together (the centre's groups
changed between them) go to further generations ``qm-<cq>.g<n>``; a group
that would pass Kueue's 64 flavors shares one island-less member flavor.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from service.domain.jobs import JOB_API_VERSIONS, job_pod_templates
from service.domain.quantity import canonical_amount, format_amount
from workers.clusters import Ref

__all__ = [
    "ADMISSION_LABEL",
    "CLUSTER_UID_LABEL",
    "JOB_KINDS",
    "MANAGED",
    "MANAGED_LABEL",
    "QUEUE_LABEL",
    "WORKLOAD_ANNOTATION",
    "WORKLOAD_LABEL",
    "Actions",
    "ClusterView",
    "WorkloadView",
    "admission_id",
    "desired",
    "job_kinds",
    "job_name",
    "member_status",
    "plan",
]

Obj = dict[str, Any]

MANAGED_LABEL = "quartermaster.dev/managed"
MANAGED = f"{MANAGED_LABEL}=true"
#: The uid of the Cluster registration that wrote an object: what a deleted
#: registration's collection may remove (workers/collect.py), and nothing
#: a later registration of the same member wrote.
CLUSTER_UID_LABEL = "quartermaster.dev/cluster-uid"
WORKLOAD_LABEL = "quartermaster.dev/workload"
ADMISSION_LABEL = "quartermaster.dev/admission"
WORKLOAD_ANNOTATION = "quartermaster.dev/workload"
UID_ANNOTATION = "quartermaster.dev/workload-uid"
PRIORITY_ANNOTATION = "quartermaster.dev/priority"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SIM_ANNOTATIONS = ("quartermaster.dev/sim-duration", "quartermaster.dev/sim-exit")
JOB_KINDS = tuple(JOB_API_VERSIONS)
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: Deletion order (applied in reverse).
QUEUE_KINDS = ("LocalQueue", "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass")
RUNS_HERE = frozenset({"Admitted", "Running"})
_API_VERSIONS = {
    "Namespace": "v1",
    "ResourceFlavor": "kueue.x-k8s.io/v1beta2",
    "ClusterQueue": "kueue.x-k8s.io/v1beta2",
    "LocalQueue": "kueue.x-k8s.io/v1beta2",
    "WorkloadPriorityClass": "kueue.x-k8s.io/v1beta2",
    "Job": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
}
#: Kueue's caps: flavors in one resource group, in one ClusterQueue; a
#: ResourceFlavor's node labels.
MAX_FLAVORS = 64
MAX_FLAVORS_TOTAL = 256
MAX_NODE_LABELS = 8


@dataclass(frozen=True)
class WorkloadView:
    """A central workload as the reconciler sees it (its read-model row)."""

    namespace: str
    name: str
    uid: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, Any] = field(default_factory=dict)
    #: The row's resource version: with the uid it names one content of the
    #: row (every event moves it), so what :func:`desired` makes of the
    #: workload is kept between passes; ``None``: nothing kept.
    version: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def state(self) -> str:
        return str(self.status.get("state", "Pending"))

    @property
    def admission(self) -> Mapping[str, Any]:
        return self.status.get("admission") or {}


@dataclass(frozen=True)
class ClusterView:
    """What the centre wants of one cluster: workloads admitted to it (or
    leaving it), and the flavors and topologies they name."""

    cluster: str
    workloads: Sequence[WorkloadView]
    flavors: Mapping[str, Mapping[str, Any]]
    topologies: Mapping[str, Mapping[str, Any]]
    #: Central ClusterQueue specs by name: their resource groups are mirrored.
    cluster_queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The Cluster's uid, labelled on every object written (none if empty).
    cluster_uid: str = ""


@dataclass
class Actions:
    """In order: delete jobs (and wait until gone), apply queue objects,
    dispatch new jobs, collect unused queue objects, then record."""

    delete: list[Ref] = field(default_factory=list)
    #: Admission ids of the jobs deleted or still terminating: their pods
    #: (labelled with it) must be gone before anything new is dispatched.
    draining: list[str] = field(default_factory=list)
    apply: list[Obj] = field(default_factory=list)
    dispatch: list[Obj] = field(default_factory=list)
    collect: list[Ref] = field(default_factory=list)
    #: Workloads evicted from this cluster whose job is gone: back to Pending.
    requeue: list[str] = field(default_factory=list)
    #: Workloads cancelled while here whose job is gone: Cancelled.
    cancelled: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any(
            (
                self.delete,
                self.draining,
                self.apply,
                self.dispatch,
                self.collect,
                self.requeue,
                self.cancelled,
            )
        )


# -- names -----------------------------------------------------------------------------------


def _short(value: str, limit: int = 63) -> str:
    """``value`` if it fits, else a prefix and a hash (deterministic)."""
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    return f"{value[: limit - 11].rstrip('-.')}-{digest}"


@functools.lru_cache(maxsize=8192)
def _dns(value: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "-" for c in value.lower()).strip("-")


def job_name(workload: WorkloadView) -> str:
    """The workload's own name when it is a DNS label; otherwise a label
    made of it and a hash of it (``a.b`` and ``a-b`` must not collide)."""
    name = _dns(workload.name)
    if name != workload.name:
        name = f"{name}-{hashlib.sha256(workload.name.encode()).hexdigest()[:6]}"
    return _short(name)


def admission_id(workload: WorkloadView) -> str:
    """Names one admission: a job from an earlier admission of the same
    workload (requeued, admitted again) is stale, never adopted."""
    admission = workload.admission
    return _admission_hash(
        workload.uid, str(admission.get("cluster")), str(admission.get("admittedAt"))
    )


@functools.lru_cache(maxsize=65536)
def _admission_hash(uid: str, cluster: str, admitted_at: str) -> str:
    """Hashed once per admission, not once per pass for every gang in flight."""
    return hashlib.sha256(f"{uid}/{cluster}/{admitted_at}".encode()).hexdigest()[:16]


def workload_label(namespace: str, name: str) -> str:
    return _short(f"{namespace}.{name}")


def priority_class_name(priority: int) -> str:
    """One member WorkloadPriorityClass per priority value (not per central
    class: a class whose value changes must not re-rank running gangs)."""
    return f"qm-p{priority}" if priority >= 0 else f"qm-m{-priority}"


@functools.lru_cache(maxsize=4096)
def flavor_name(flavor: str, island: str | None) -> str:
    return _short(_dns(f"qm-{flavor}-{island}" if island else f"qm-{flavor}"), 253)


def _labels(**extra: str) -> dict[str, str]:
    return {MANAGED_LABEL: "true", **extra}


# -- desired state ---------------------------------------------------------------------------


@dataclass
class _Desired:
    namespaces: dict[str, Obj] = field(default_factory=dict)
    queues: dict[Ref, Obj] = field(default_factory=dict)
    jobs: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (workload key, admission)
    #: Jobs wanted that the member already holds: not built again.
    held: set[tuple[str, str]] = field(default_factory=set)


#: One central flavor on the member, pinned to one island or not: ``(flavor, island)``.
Placed = tuple[str, str | None]
#: A use's flavors and selector, hashable.
Shape = tuple[tuple[tuple[str, Placed], ...], tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class _Use:
    """One admitted pod set here: per resource, the central flavor (and the
    island it is pinned to) and the amount it reserved; the node selector
    that pins its pods (every flavor's labels, and its island)."""

    flavors: Mapping[str, Placed]
    usage: Mapping[str, int]
    selector: Mapping[str, str]
    #: ``flavors`` and ``selector`` as one value: all that the member queue
    #: reads of a use but its usage, which it only sums (:func:`_merged`).
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


def _use(view: ClusterView, assignment: Mapping[str, Any], placements: Placements) -> _Use:
    islands = list(assignment.get("islands") or ())
    island = str(islands[0]) if len(islands) == 1 else None
    assigned = tuple((str(r), str(f)) for r, f in (assignment.get("flavors") or {}).items())
    placed = placements.get((island, assigned))
    if placed is None:
        placed = placements[(island, assigned)] = _placement(view, island, assigned)
    usage = {str(r): _amount(str(r), q) for r, q in (assignment.get("resourceUsage") or {}).items()}
    return _Use(placed[0], usage, placed[1], placed[2])


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


def _merged(uses: Iterable[_Use]) -> list[_Use]:
    """Uses of one shape as one, their usage summed: what the member queue
    makes of them is the same (it reads their flavors and selectors, and
    their usage only in sum), and a pass weighs every gang in flight."""
    usage: dict[Shape, dict[str, int]] = {}
    first: dict[Shape, _Use] = {}
    for use in uses:
        total = usage.get(use.shape)
        if total is None:
            first[use.shape] = use
            usage[use.shape] = dict(use.usage)
            continue
        for resource, amount in use.usage.items():
            total[resource] = total.get(resource, 0) + amount
    return [_Use(u.flavors, usage[s], u.selector, s) for s, u in first.items()]


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


def _flavor(view: ClusterView, name: str, placed: Placed) -> Obj:
    source = view.flavors.get(placed[0]) or {}
    spec: Obj = {"nodeLabels": _flavor_labels(view, placed)}
    for field_name in ("nodeTaints", "tolerations"):
        if source.get(field_name):
            spec[field_name] = copy.deepcopy(list(source[field_name]))
    return {
        "apiVersion": _API_VERSIONS["ResourceFlavor"],
        "kind": "ResourceFlavor",
        "metadata": {"name": name, "labels": _labels()},
        "spec": spec,
    }


def _components(links: Iterable[Sequence[str]]) -> dict[str, str]:
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


def _one_flavor_per_group(groups: Mapping[str, str], uses: Sequence[_Use]) -> bool:
    """Kueue gives a pod set one flavor per resource group: can each of
    these admissions be read that way?"""
    for use in uses:
        seen: dict[str, Placed] = {}
        for resource, placed in use.flavors.items():
            if seen.setdefault(groups[resource], placed) != placed:
                return False
    return True


def _resource_groups(
    spec: Mapping[str, Any], uses: Sequence[_Use]
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
    groups = _components(links + [covered for covered, _ in central if covered])
    if not _one_flavor_per_group(groups, uses):
        groups = _components(links)
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
class _MemberQueue:
    queue: Obj
    #: Member flavor name → the central flavor and island it stands for.
    flavors: dict[str, Placed]
    #: A pod set's (central flavor, island) → the member flavor it takes.
    names: dict[Placed, str]


def _member_queue(
    view: ClusterView, name: str, spec: Mapping[str, Any], uses: Sequence[_Use]
) -> _MemberQueue:
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
            for placed in sorted({member((central, i)) for i in islands[central]}, key=_unpinned)
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
        "apiVersion": _API_VERSIONS["ClusterQueue"],
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": _labels()},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": resource_groups,
        },
    }
    return _MemberQueue(queue, flavors, names)


def _suits(labels: Mapping[str, Any], selector: Mapping[str, str], keys: set[str]) -> bool:
    """Kueue's flavor match: the pod set's node selector, on the label keys
    the group's flavors use, against the flavor's node labels."""
    return all(str(labels.get(k)) == v for k, v in selector.items() if k in keys)


def _unambiguous(view: ClusterView, member: _MemberQueue, uses: Sequence[_Use]) -> bool:
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


def _unpinned(placed: Placed) -> tuple[bool, str]:
    return (placed[1] is not None, placed[1] or "")


def _pin(
    template: Mapping[str, Any],
    selector: Mapping[str, str],
    extra: Mapping[str, str],
    labels: Mapping[str, str],
) -> Obj:
    """A pod template pinned to its flavors' (and island's) node labels, its
    pods labelled with the workload and admission they belong to."""
    # Copies of what changes only (metadata, its labels and annotations, the
    # spec's top level); the rest (containers, volumes) is shared with the
    # workload's spec, which nothing writes to: a deep copy of every
    # in-flight gang's template was a tenth of a reconcile pass.
    out = dict(template)
    meta = out["metadata"] = dict(out.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    for key, value in extra.items():
        annotations.setdefault(key, value)
    spec = out["spec"] = dict(out.get("spec") or {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **selector}
    spec.setdefault("restartPolicy", "Never")
    return out


def _job_spec(count: int, template: Obj) -> Obj:
    return {
        "parallelism": count,
        "completions": count,
        "backoffLimit": 0,
        "template": template,
    }


def _templates(job: Obj) -> Iterable[tuple[str, Obj]]:
    """The pod templates of a job manifest of any supported kind, each with
    the name of its pod set: the very list the security floor checked and
    the submission was charged for (service/domain/jobs.py)."""
    found, _ = job_pod_templates(job)
    for template in found:
        if isinstance(template.template, dict):
            yield template.name, template.template


def job_kinds(specs: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The kinds of the member jobs of workloads with these specs (as
    :func:`_job` builds them), and always ``Job``: what a pass that does not
    look for strays lists."""
    used = {"Job"}
    for spec in specs:
        source = spec.get("job")
        if isinstance(source, Mapping) and source.get("kind") in JOB_KINDS:
            used.add(str(source["kind"]))
        elif len(list(spec.get("podSets") or ())) != 1:
            used.add("JobSet")
    return tuple(k for k in JOB_KINDS if k in used)


def _job(
    workload: WorkloadView,
    queue: str,
    selectors: Mapping[str, Mapping[str, str]],
    admission: str,
) -> Obj:
    """The member job of ``workload``, each pod set pinned by its own
    selector (pod sets of one gang may sit in different islands), its
    priority the member's Kueue sees."""
    first = next(iter(selectors.values()), {})
    meta: Obj = {
        "name": job_name(workload),
        "namespace": workload.namespace,
        "labels": _labels(
            **{
                WORKLOAD_LABEL: workload_label(workload.namespace, workload.name),
                ADMISSION_LABEL: admission,
                QUEUE_LABEL: queue,
                PRIORITY_LABEL: priority_class_name(_priority(workload)),
            }
        ),
        "annotations": {
            WORKLOAD_ANNOTATION: workload.key,
            UID_ANNOTATION: workload.uid,
            PRIORITY_ANNOTATION: str(workload.spec.get("priority") or 0),
        },
    }
    sim = {k: str(v) for k, v in workload.annotations.items() if k in SIM_ANNOTATIONS}
    pods = {k: meta["labels"][k] for k in (WORKLOAD_LABEL, ADMISSION_LABEL)}
    source = workload.spec.get("job")
    if isinstance(source, Mapping) and source.get("kind") in JOB_KINDS:
        job = copy.deepcopy(dict(source))
        original = job.get("metadata") or {}
        meta["labels"] = {**(original.get("labels") or {}), **meta["labels"]}
        meta["annotations"] = {**(original.get("annotations") or {}), **meta["annotations"]}
        job["metadata"] = meta
        job.pop("status", None)
        for name, template in _templates(job):
            template.update(_pin(template, selectors.get(name, first), sim, pods))
        return job
    pod_sets = list(workload.spec.get("podSets") or ())
    if len(pod_sets) == 1:
        ps = pod_sets[0]
        return {
            "apiVersion": _API_VERSIONS["Job"],
            "kind": "Job",
            "metadata": meta,
            "spec": _job_spec(
                int(ps["count"]),
                _pin(
                    ps.get("template") or {}, selectors.get(str(ps.get("name")), first), sim, pods
                ),
            ),
        }
    return {
        "apiVersion": _API_VERSIONS["JobSet"],
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "replicatedJobs": [
                {
                    "name": _short(_dns(str(ps.get("name", f"set-{i}"))), 40),
                    "replicas": 1,
                    "template": {
                        "spec": _job_spec(
                            int(ps["count"]),
                            _pin(
                                ps.get("template") or {},
                                selectors.get(str(ps.get("name")), first),
                                sim,
                                pods,
                            ),
                        )
                    },
                }
                for i, ps in enumerate(pod_sets)
            ]
        },
    }


def _priority(workload: WorkloadView) -> int:
    return int(workload.spec.get("priority") or 0)


@dataclass
class _Admitted:
    """A workload admitted here, as desired() gathers it."""

    workload: WorkloadView
    uses: list[_Use]
    selectors: dict[str, dict[str, str]]


@dataclass(frozen=True)
class _Kept:
    """What :func:`desired` made of one cluster's workloads in its last
    pass, by (uid, version): valid while the flavors and topologies it read
    are as they were (a copy of them, compared whole every pass)."""

    flavors: Mapping[str, Mapping[str, Any]]
    topologies: Mapping[str, Mapping[str, Any]]
    entries: Mapping[tuple[str, int], _Admitted]


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


def _admitted(view: ClusterView, workload: WorkloadView, placements: Placements) -> _Admitted:
    entry = _Admitted(workload, [], {})
    for assignment in workload.admission.get("podSetAssignments") or ():
        use = _use(view, assignment, placements)
        entry.uses.append(use)
        entry.selectors.setdefault(str(assignment.get("name")), {}).update(use.selector)
    return entry


def _links(uses: Iterable[_Use]) -> list[list[str]]:
    used: dict[str, set[str]] = {}
    for use in uses:
        for resource, (flavor, _) in use.flavors.items():
            used.setdefault(flavor, set()).add(resource)
    return [sorted(resources) for resources in used.values()]


def _holds(
    view: ClusterView, spec: Mapping[str, Any], admitted: Sequence[_Admitted]
) -> _MemberQueue | None:
    """The one member ClusterQueue that admits exactly ``admitted``, if any."""
    uses = _merged(u for a in admitted for u in a.uses)
    if not _one_flavor_per_group(_components(_links(uses)), uses):
        return None
    member = _member_queue(view, "", spec, uses)
    return member if _unambiguous(view, member, uses) else None


def _generations(
    view: ClusterView, spec: Mapping[str, Any], admitted: Sequence[_Admitted]
) -> list[tuple[list[_Admitted], _MemberQueue]]:
    """Admissions of one central ClusterQueue with the member ClusterQueue
    that holds them: one for all, unless no one can (the centre's resource
    groups changed between them: a flavor covering cpu and GPUs then, cpu
    alone now); then the earliest admissions first, the rest in further
    generations, each its own member ClusterQueue."""
    whole = _holds(view, spec, admitted)
    if whole is not None:
        return [(list(admitted), whole)]
    out: list[tuple[list[_Admitted], _MemberQueue]] = []
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
            alone = _holds(view, spec, [entry]) or _member_queue(view, "", spec, entry.uses)
            out.append(([entry], alone))
    return out


def _generation_name(name: str, generation: int, limit: int = 63) -> str:
    """Central names reach the member through :func:`_dns` (no dots), so a
    dotted suffix cannot collide with another queue's name."""
    return _short(name, limit) if generation == 0 else f"{_short(name, limit - 8)}.g{generation}"


def _local_queue(out: _Desired, workload: WorkloadView, cq: str, generation: int) -> str:
    """``qm-<queue>``, unless the namespace's queue already points at
    another member ClusterQueue (the central LocalQueue was moved to another
    ClusterQueue while gangs admitted through it still run)."""
    local = f"qm-{_dns(str(workload.spec.get('queueName', 'default')))}"
    name = _generation_name(local, generation)
    taken = out.queues.get(Ref("LocalQueue", workload.namespace, name))
    if taken is None or taken["spec"]["clusterQueue"] == cq:
        return name
    digest = hashlib.sha256(cq.encode()).hexdigest()[:8]
    return f"{_short(local, 63 - 9)}.{digest}"


def desired(
    view: ClusterView, held: Set[tuple[str, str]] = frozenset(), memo: PlanMemo | None = None
) -> _Desired:
    """What the member should hold. ``held``: the (workload, admission) keys
    of the jobs it holds, which are only noted in ``held``, not built (a
    pass built every in-flight gang's job to dispatch a few). ``memo``: what
    the last pass over this cluster worked out, reused and renewed."""
    out = _Desired()
    for central, admitted in sorted(_admitted_here(view, out, memo).items()):
        spec = view.cluster_queues.get(central) or {}
        for generation, (entries, member) in enumerate(_generations(view, spec, admitted)):
            cq = _generation_name(f"qm-{_dns(central)}", generation, 253)
            member.queue["metadata"]["name"] = cq
            out.queues[Ref("ClusterQueue", "", cq)] = member.queue
            for name, placed in member.flavors.items():
                ref = Ref("ResourceFlavor", "", name)
                if ref not in out.queues:
                    out.queues[ref] = _flavor(view, name, placed)
            _jobs(out, entries, cq, generation, held)
    if view.cluster_uid:
        for obj in (*out.namespaces.values(), *out.queues.values(), *out.jobs.values()):
            obj["metadata"]["labels"][CLUSTER_UID_LABEL] = view.cluster_uid
    return out


def _admitted_here(
    view: ClusterView, out: _Desired, memo: PlanMemo | None
) -> dict[str, list[_Admitted]]:
    """The workloads admitted here by central ClusterQueue, each with its
    uses; their Namespaces and WorkloadPriorityClasses noted in ``out``."""
    by_queue: dict[str, list[_Admitted]] = {}
    placements: Placements = {}
    kept = memo.kept(view) if memo is not None else _Kept({}, {}, {})
    entries: dict[tuple[str, int], _Admitted] = {}
    priorities: set[int] = set()
    for workload in view.workloads:
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
        by_queue.setdefault(central, []).append(_Admitted(workload, entry.uses, entry.selectors))
        if workload.namespace not in out.namespaces:
            out.namespaces[workload.namespace] = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": workload.namespace, "labels": _labels()},
            }
        priority = _priority(workload)
        if priority not in priorities:
            priorities.add(priority)
            wpc = Ref("WorkloadPriorityClass", "", priority_class_name(priority))
            out.queues[wpc] = {
                "apiVersion": _API_VERSIONS["WorkloadPriorityClass"],
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": wpc.name, "labels": _labels()},
                "value": priority,
            }
    if memo is not None:
        memo.keep(view.cluster, _Kept(kept.flavors, kept.topologies, entries))
    return by_queue


def _jobs(
    out: _Desired,
    entries: Sequence[_Admitted],
    cq: str,
    generation: int,
    held: Set[tuple[str, str]],
) -> None:
    """The LocalQueues and the jobs of ``entries``, admitted through member
    ClusterQueue ``cq``: jobs the member holds only noted."""
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
                    "apiVersion": _API_VERSIONS["LocalQueue"],
                    "kind": "LocalQueue",
                    "metadata": {
                        "name": queue,
                        "namespace": workload.namespace,
                        "labels": _labels(),
                    },
                    "spec": {"clusterQueue": cq},
                },
            )
        admission = admission_id(workload)
        if (workload.key, admission) in held:
            out.held.add((workload.key, admission))
            continue
        out.jobs[(workload.key, admission)] = _job(workload, queue, entry.selectors, admission)


# -- plan ------------------------------------------------------------------------------------


def _contains(actual: Any, wanted: Any) -> bool:
    """Whether ``actual`` already holds every field of ``wanted`` (so that an
    apply would change nothing; quantities compared canonically)."""
    if isinstance(wanted, Mapping):
        if not isinstance(actual, Mapping):
            return False
        return all(_contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted or str(actual) == str(wanted)


def _job_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (
        str((meta.get("annotations") or {}).get(WORKLOAD_ANNOTATION, "")),
        str((meta.get("labels") or {}).get(ADMISSION_LABEL, "")),
    )


def plan(
    view: ClusterView, actual: Sequence[Mapping[str, Any]], memo: PlanMemo | None = None
) -> Actions:
    """``actual``: the member's objects that carry our managed label;
    ``memo``: as for :func:`desired`."""
    actions = Actions()
    refs = [Ref.of(o) for o in actual]
    jobs = [(r, o, _job_key(o)) for r, o in zip(refs, actual, strict=True) if r.kind in JOB_KINDS]
    present = {key for _, _, key in jobs}
    want = desired(view, present, memo)
    occupied = {ref for ref, _, _ in jobs}
    for ref, obj, key in jobs:
        if key not in want.jobs and key not in want.held:
            actions.draining.append(key[1])
            if not (obj.get("metadata") or {}).get("deletionTimestamp"):
                actions.delete.append(ref)
    on_cluster = dict(zip(refs, actual, strict=True))
    for ns in want.namespaces.values():
        if Ref.of(ns) not in on_cluster:
            actions.apply.append(ns)
    queues = sorted(want.queues.items())
    for kind in reversed(QUEUE_KINDS):  # flavors, then ClusterQueues, then LocalQueues
        for ref, obj in queues:
            if ref.kind == kind and not _contains(on_cluster.get(ref), obj):
                actions.apply.append(obj)
    for key, job in sorted(want.jobs.items()):
        if key not in present and Ref.of(job) not in occupied:
            actions.dispatch.append(job)
    unused = [ref for ref in refs if ref.kind in QUEUE_KINDS and ref not in want.queues]
    for kind in QUEUE_KINDS:
        actions.collect += [ref for ref in unused if ref.kind == kind]
    running = {key for key, _ in present}
    for workload in view.workloads:
        if workload.key in running:
            continue
        if (
            workload.state == "Evicted"
            and (workload.status.get("eviction") or {}).get("cluster") == view.cluster
            and workload.spec.get("active", True) is not False  # deactivated: stays Evicted
        ):
            actions.requeue.append(workload.key)
        elif workload.state == "Cancelling" and workload.admission.get("cluster") == view.cluster:
            actions.cancelled.append(workload.key)
    return actions


# -- sync: member state → central state ------------------------------------------------------

_SUCCEEDED = {"Complete", "Completed", "Succeeded"}


def _true(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def member_status(job: Mapping[str, Any], workload: Mapping[str, Any] | None) -> Obj:
    """What the member says of one of our jobs: ``{phase, at, reason}``,
    phase one of ``Pending``, ``Running``, ``Succeeded``, ``Failed``,
    ``Evicted``. The member Kueue Workload's conditions are the generic
    source (every job kind); the job's own conditions back them up."""
    w_conditions = ((workload or {}).get("status") or {}).get("conditions") or ()
    j_conditions = (job.get("status") or {}).get("conditions") or ()
    finished = _true(w_conditions, "Finished")
    if finished is not None:
        failed = finished.get("reason") == "Failed" or _true(j_conditions, "Failed") is not None
        phase = "Failed" if failed else "Succeeded"
        return {"phase": phase, "at": finished.get("lastTransitionTime"), "reason": phase}
    for condition in j_conditions:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in _SUCCEEDED:
            return {
                "phase": "Succeeded",
                "at": condition.get("lastTransitionTime"),
                "reason": "Succeeded",
            }
        if condition.get("type") == "Failed":
            return {
                "phase": "Failed",
                "at": condition.get("lastTransitionTime"),
                "reason": condition.get("reason") or "Failed",
            }
    evicted = _true(w_conditions, "Evicted")
    if evicted is not None:
        return {
            "phase": "Evicted",
            "at": evicted.get("lastTransitionTime"),
            "reason": evicted.get("reason") or "Evicted",
            "message": evicted.get("message") or "",
        }
    ready = _true(w_conditions, "PodsReady")
    if ready is not None:
        return {"phase": "Running", "at": ready.get("lastTransitionTime"), "reason": "PodsReady"}
    return {"phase": "Pending", "at": None, "reason": ""}
