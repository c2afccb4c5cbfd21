"""What a Volcano member should hold: per central ClusterQueue a Volcano
``Queue`` whose ``capability`` is exactly what the centre admitted there,
per admitted gang a ``PodGroup`` and the job, scheduled by ``volcano``.

The contract is the Kueue mirror's (``queues.py``): the member can never
admit what the centre did not, nor block what it did. Volcano's enqueue
lets a PodGroup into its Queue only while the Queue's groups' resources
plus the group's ``minResources`` stay within ``capability`` on every
resource the capability names (a resource it leaves out is unlimited), so
the capability names every resource the central ClusterQueue covers, 0
where nothing is admitted: a rival group in the Queue finds no room, and
each of our groups, whose ``minResources`` is what the centre reserved for
it, always does (the capability is raised before the group is created).
The Queue is not ``reclaimable`` and has no ``deserved`` or ``guarantee``:
Volcano's reclaim and preempt actions have nothing to take; the centre
decides preemption and deletes the whole group. docs/volcano.md says why
and where each rule comes from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

from service.domain.jobs import VOLCANO_JOB, job_kind, job_pod_templates
from service.domain.quantity import canonical_amount, format_amount
from workers.plan.desired import Admitted, PlanMemo, admitted_here
from workers.plan.jobs import member_job, priority_of
from workers.plan.names import (
    ADMISSION_LABEL,
    API_VERSIONS,
    CLUSTER_UID_LABEL,
    COMMAND_API_VERSION,
    COMMAND_NAMESPACE,
    GROUP_KIND,
    GROUP_NAME_ANNOTATION,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    UID_ANNOTATION,
    VOLCANO_SCHEDULER,
    WORKLOAD_ANNOTATION,
    WORKLOAD_LABEL,
    admission_id,
    dns_label,
    job_name,
    managed_labels,
    priority_class_name,
    short_name,
    workload_label,
)
from workers.plan.queues import Desired
from workers.plan.serving import (
    admission_label,
    is_serving,
    member_object,
    object_name,
    parts,
    placement,
    pods_per_unit,
    selectors,
)
from workers.plan.views import ClusterView, Obj, Ref, WorkloadView

#: The network topology of a gang placed in one island: inside one tier-1
#: HyperNode (one NVLink / RDMA domain), never spread over more.
ISLAND_TOPOLOGY = {"mode": "hard", "highestTierAllowed": 1}


def priority_class(priority: int) -> tuple[Ref, Obj]:
    """``qm-p<priority>``: the Kubernetes PriorityClass a PodGroup names
    (Volcano orders groups by it); never preempting, since the centre alone
    preempts."""
    ref = Ref("PriorityClass", "", priority_class_name(priority))
    return ref, {
        "apiVersion": API_VERSIONS["PriorityClass"],
        "kind": "PriorityClass",
        "metadata": {"name": ref.name, "labels": managed_labels()},
        "value": priority,
        "preemptionPolicy": "Never",
        "description": "Quartermaster: the centre's priority of the gangs it admitted here",
    }


def _selected(member: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether a HyperNode member (``type: Node``) selects ``node``: by
    ``exactMatch`` name, ``regexMatch`` pattern (the whole name) or
    ``labelMatch`` labels."""
    selector = member.get("selector") or {}
    meta = node.get("metadata") or {}
    name = str(meta.get("name"))
    if "exactMatch" in selector:
        return bool((selector["exactMatch"] or {}).get("name") == name)
    if "regexMatch" in selector:
        pattern = str((selector["regexMatch"] or {}).get("pattern") or "")
        try:
            return re.fullmatch(pattern, name) is not None
        except re.error:
            return False
    wanted = ((selector.get("labelMatch") or {}).get("matchLabels")) or {}
    labels = meta.get("labels") or {}
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def tier_one_islands(
    hypernodes: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]]
) -> dict[str, str]:
    """Node name → the tier-1 HyperNode it belongs to (the first by name, if
    several claim it): a Volcano member's islands where it has them."""
    tier_one = sorted(
        (h for h in hypernodes if str((h.get("spec") or {}).get("tier")) == "1"),
        key=lambda h: str(h["metadata"]["name"]),
    )
    out: dict[str, str] = {}
    for node in nodes:
        name = str(node["metadata"]["name"])
        for hypernode in tier_one:
            members = (hypernode.get("spec") or {}).get("members") or ()
            if any(m.get("type", "Node") == "Node" and _selected(m, node) for m in members):
                out[name] = str(hypernode["metadata"]["name"])
                break
    return out


def queue_name(central: str) -> str:
    return short_name(f"qm-{dns_label(central)}")


def _covered(spec: Mapping[str, Any]) -> set[str]:
    return {
        str(resource)
        for group in spec.get("resourceGroups") or ()
        for resource in group.get("coveredResources") or ()
    }


def _usage(entries: Iterable[Admitted]) -> dict[str, int]:
    total: dict[str, int] = {}
    for entry in entries:
        for use in entry.uses:
            for resource, amount in use.usage.items():
                total[resource] = total.get(resource, 0) + amount
    return total


def member_queue(name: str, spec: Mapping[str, Any], entries: Sequence[Admitted]) -> Obj:
    """The Volcano Queue of one central ClusterQueue: its capability the sum
    of what the centre admitted here, on every resource it covers."""
    usage = _usage(entries)
    capability = {r: format_amount(r, usage.get(r, 0)) for r in sorted(_covered(spec) | {*usage})}
    return {
        "apiVersion": API_VERSIONS["Queue"],
        "kind": "Queue",
        "metadata": {"name": name, "labels": managed_labels()},
        # deserved = capability: what the capacity plugin (which needs one)
        # would let other queues reclaim is nothing beyond what we hold.
        "spec": {
            "weight": 1,
            "reclaimable": False,
            "capability": capability,
            "deserved": dict(capability),
        },
    }


def emptied_queue(queue: Mapping[str, Any]) -> Obj:
    """A Queue of ours that no admission uses any more, as we keep it: 0 of
    every resource its capability named."""
    meta = queue.get("metadata") or {}
    named = ((queue.get("spec") or {}).get("capability") or {}).keys()
    capability = {str(r): format_amount(str(r), 0) for r in sorted(named)}
    return {
        "apiVersion": API_VERSIONS["Queue"],
        "kind": "Queue",
        "metadata": {"name": meta["name"], "labels": dict(meta.get("labels") or {})},
        "spec": {
            "weight": 1,
            "reclaimable": False,
            "capability": capability,
            "deserved": dict(capability),
        },
    }


def close_command(queue: Mapping[str, Any]) -> dict[str, Any]:
    """The Command that asks Volcano's queue controller to close ``queue``
    (a deleted Cluster's collection: Volcano deletes only a Closed Queue),
    shaped as ``vcctl queue operate --action close`` makes it (in
    ``default``, owned by the Queue); named after the Queue, so that an
    attempt repeated before the controller took it asks once."""
    meta = queue.get("metadata") or {}
    target = {
        "apiVersion": str(queue.get("apiVersion")),
        "kind": "Queue",
        "name": str(meta.get("name")),
        "uid": str(meta.get("uid")),
        "controller": True,
    }
    return {
        "apiVersion": COMMAND_API_VERSION,
        "kind": "Command",
        "metadata": {
            "name": short_name(f"{target['name']}-closequeue"),
            "namespace": COMMAND_NAMESPACE,
            "labels": managed_labels(),
            "ownerReferences": [target],
        },
        "target": target,
        "action": "CloseQueue",
    }


def _island(workload: WorkloadView) -> str | None:
    """The one island the gang was placed in, when it asked for one."""
    asked = any(
        (ps.get("topologyRequest") or {}).get("required")
        for ps in workload.spec.get("podSets") or ()
    )
    islands = {
        str(i)
        for a in workload.admission.get("podSetAssignments") or ()
        for i in a.get("islands") or ()
    }
    return next(iter(islands)) if asked and len(islands) == 1 else None


def _placement_of(entry: Admitted) -> str:
    return placement(entry.workload.admission)


def _pods(workload: WorkloadView) -> int:
    return sum(int(a.get("count") or 0) for a in workload.admission.get("podSetAssignments") or ())


def _threshold(workload: WorkloadView) -> tuple[int, dict[str, int]] | None:
    """A Volcano Job's own gang threshold, where it asks fewer pods than the
    centre admitted: its ``minAvailable`` and the requests of that many pods,
    tasks in order (as Volcano's job controller sums a group's
    ``minResources``); ``None`` for every other workload."""
    source = workload.spec.get("job")
    if not isinstance(source, Mapping) or job_kind(source) != VOLCANO_JOB:
        return None
    wanted = (source.get("spec") or {}).get("minAvailable")
    assignments = workload.admission.get("podSetAssignments") or ()
    if not isinstance(wanted, int) or not 0 < wanted < _pods(workload):
        return None
    left, total = wanted, dict[str, int]()
    for assignment in assignments:
        count = int(assignment.get("count") or 0)
        take = min(left, count)
        for resource, quantity in (assignment.get("resourceUsage") or {}).items() if take else ():
            amount = canonical_amount(str(resource), quantity) * take // count
            total[str(resource)] = total.get(str(resource), 0) + amount
        left -= take
    return wanted, total


def pod_group(entry: Admitted, queue: str, admission: str) -> Obj:
    """The gang's PodGroup: all its pods (``minMember``) and all the centre
    reserved (``minResources``) at once, in its queue, at its priority. A
    Volcano Job that asks to start with fewer (``minAvailable``) gets that
    threshold, as Volcano's own controller would give it; the centre still
    reserved (and the Queue still holds) room for every pod."""
    workload = entry.workload
    threshold = _threshold(workload)
    members, reserved = threshold or (_pods(workload), _usage([entry]))
    spec: Obj = {
        "minMember": members,
        "minResources": {r: format_amount(r, a) for r, a in sorted(reserved.items())},
        "queue": queue,
        "priorityClassName": priority_class_name(priority_of(workload)),
    }
    if _island(workload) is not None:
        spec["networkTopology"] = dict(ISLAND_TOPOLOGY)
    return {
        "apiVersion": API_VERSIONS[GROUP_KIND],
        "kind": GROUP_KIND,
        "metadata": {
            "name": job_name(workload),
            "namespace": workload.namespace,
            "labels": managed_labels(
                **{
                    WORKLOAD_LABEL: workload_label(workload.namespace, workload.name),
                    ADMISSION_LABEL: admission,
                }
            ),
            "annotations": {WORKLOAD_ANNOTATION: workload.key, UID_ANNOTATION: workload.uid},
        },
        "spec": spec,
    }


def _island_keys(view: ClusterView) -> set[str]:
    """The node labels that name an island in the centre's topologies."""
    return {
        str(levels[0]["nodeLabel"])
        for topology in view.topologies.values()
        if (levels := topology.get("levels") or ())
    }


def _hyper_pins(view: ClusterView, workload: WorkloadView) -> dict[str, Sequence[str]]:
    """Per pod set placed in an island that is a tier-1 HyperNode, its nodes."""
    out: dict[str, Sequence[str]] = {}
    for assignment in workload.admission.get("podSetAssignments") or ():
        islands = list(assignment.get("islands") or ())
        if len(islands) == 1 and str(islands[0]) in view.hyper_islands:
            out[str(assignment.get("name"))] = view.hyper_islands[str(islands[0])]
    return out


def _pin_to_nodes(spec: Obj, keys: set[str], nodes: Sequence[str]) -> None:
    """Pinned to a HyperNode's nodes by hostname (its island has no label
    of its own), instead of by the island label."""
    spec["nodeSelector"] = {
        k: v for k, v in (spec.get("nodeSelector") or {}).items() if k not in keys
    }
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}
        ]
    }
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = list(required.get("nodeSelectorTerms") or ()) or [{}]
    # Terms are ORed: the hostnames go into each, so that every one holds them.
    required["nodeSelectorTerms"] = [
        {**t, "matchExpressions": [*(t.get("matchExpressions") or ()), *term["matchExpressions"]]}
        for t in terms
    ]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity


def volcano_job(view: ClusterView, entry: Admitted, group: str, admission: str) -> Obj:
    """The member job (as for Kueue members: pinned per pod set to its
    island, by hostname where the island is a tier-1 HyperNode), its pods
    scheduled by ``volcano`` as members of ``group``; without Kueue's queue
    and priority labels, which nothing reads there."""
    job = member_job(entry.workload, "", entry.selectors, admission)
    _by_volcano(view, job, entry.workload, group)
    return job


def _by_volcano(view: ClusterView, job: Obj, workload: WorkloadView, group: str) -> None:
    """``job``'s pods scheduled by ``volcano`` as members of ``group``,
    pinned by hostname where ``workload``'s admitted island is a tier-1
    HyperNode; without Kueue's queue and priority labels."""
    labels = job["metadata"]["labels"]
    for key in (QUEUE_LABEL, PRIORITY_LABEL):
        labels.pop(key, None)
    pins = _hyper_pins(view, workload) if view.hyper_islands else {}
    keys = _island_keys(view) if pins else set()
    found, _ = job_pod_templates(job)
    # One template and one pin: the same pod set, whatever the template is called.
    only = next(iter(pins.values())) if len(pins) == 1 and len(found) == 1 else None
    for template in found:
        pod = template.template
        if not isinstance(pod, dict):
            continue
        meta = pod["metadata"] = dict(pod.get("metadata") or {})
        meta["annotations"] = {**(meta.get("annotations") or {}), GROUP_NAME_ANNOTATION: group}
        pod["spec"] = {**(pod.get("spec") or {}), "schedulerName": VOLCANO_SCHEDULER}
        nodes = pins.get(template.name) or only
        if nodes:
            _pin_to_nodes(pod["spec"], keys, nodes)


def _serving(
    out: Desired,
    view: ClusterView,
    workload: WorkloadView,
    queue: str,
    entries: Sequence[Admitted],
    held: Set[tuple[str, str]],
) -> None:
    """A serving workload's member objects on a Volcano member, each with a
    PodGroup of its own: ``minMember`` one replica's pods (a replica, a
    LeaderWorkerSet group, starts whole; the rest join one by one as the
    object scales), ``minResources`` what the centre reserved for the
    replicas admitted to that placement (``entries``: every replica of
    the workload here, by the placement it shares)."""
    for part in parts(workload, view.cluster):
        key = (workload.key, admission_label(workload, part.key))
        placed = [e for e in entries if _placement_of(e) == part.key]
        if not placed:
            continue
        name = object_name(workload, part.key)
        group = pod_group(placed[0], queue, key[1])
        group["metadata"]["name"] = name
        group["spec"]["minMember"] = pods_per_unit(workload.spec.get("job") or {})
        usage = _usage(placed)
        group["spec"]["minResources"] = {r: format_amount(r, a) for r, a in sorted(usage.items())}
        out.groups[key] = group
        out.replicas[key] = part.replicas
        if key in held:
            out.held.add(key)
            continue
        obj = member_object(part, "", selectors(view, part))
        _by_volcano(view, obj, placed[0].workload, name)
        out.jobs[key] = obj


def volcano_desired(
    view: ClusterView, held: Set[tuple[str, str]] = frozenset(), memo: PlanMemo | None = None
) -> Desired:
    """What a Volcano member should hold; ``held`` and ``memo`` as for
    :func:`workers.plan.desired.desired`."""
    out = Desired()
    for central, entries in sorted(admitted_here(view, out, memo, priority_class).items()):
        name = queue_name(central)
        spec = view.cluster_queues.get(central) or {}
        out.queues[Ref("Queue", "", name)] = member_queue(name, spec, entries)
        replicas: dict[str, list[Admitted]] = {}
        for entry in entries:
            if is_serving(entry.workload):
                replicas.setdefault(entry.workload.key, []).append(entry)
                continue
            admission = admission_id(entry.workload)
            key = (entry.workload.key, admission)
            if key in held:
                out.held.add(key)
                continue
            group = pod_group(entry, name, admission)
            out.groups[key] = group
            out.jobs[key] = volcano_job(view, entry, group["metadata"]["name"], admission)
        for placed in replicas.values():
            _serving(out, view, placed[0].workload, name, placed, held)
    if view.cluster_uid:
        for obj in (
            *out.namespaces.values(),
            *out.queues.values(),
            *out.jobs.values(),
            *out.groups.values(),
        ):
            obj["metadata"]["labels"][CLUSTER_UID_LABEL] = view.cluster_uid
    return out
