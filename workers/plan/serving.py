"""A serving workload's member objects: one per (cluster, placement) of its
admitted replicas, its replica count the number admitted there.

Each replica of a serving workload is admitted as its own gang
(docs/serving.md), recorded in ``status.replicaAdmissions`` as
``{replica, admission, admittedAt}``. Replicas that share a placement — the
same ClusterQueue and, per pod set, the same flavors and island — run as one
member object (a Deployment, StatefulSet or LeaderWorkerSet) whose
``spec.replicas`` is how many of them are admitted there: the member never
runs ahead of the centre. Its name and admission label come from the
placement, not the count, so scaling changes ``spec.replicas`` of the object
in place (:func:`scale_to`) and the running replicas are not touched.

Pure, like the rest of ``workers.plan``: :func:`workers.plan.desired.desired`
(and its Volcano twin) call it for every workload whose status carries
``replicaAdmissions``; the reconciler creates, scales and deletes what it
plans (workers/reconcile.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from service.domain.jobs import SERVING_KINDS, job_pod_templates
from workers.plan.jobs import _pin, priority_of
from workers.plan.names import (
    ADMISSION_LABEL,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    UID_ANNOTATION,
    WORKLOAD_ANNOTATION,
    WORKLOAD_LABEL,
    job_name,
    managed_labels,
    priority_class_name,
    short_name,
    workload_label,
)
from workers.plan.queues import use_of
from workers.plan.views import ClusterView, Ref, WorkloadView

__all__ = [
    "REPLICA_ADMISSIONS",
    "UNITS_RUN",
    "Part",
    "admission_label",
    "available",
    "is_serving",
    "member_object",
    "object_name",
    "parts",
    "placement",
    "pods_per_unit",
    "scale_to",
    "selectors",
    "unit_view",
    "units",
]

Obj = dict[str, Any]
REPLICA_ADMISSIONS = "replicaAdmissions"
#: The states in which a serving workload's admitted replicas run: the
#: count admitted is what runs, whatever the rest of it waits for.
UNITS_RUN = frozenset({"Pending", "Admitted", "Running"})


def is_serving(workload: WorkloadView) -> bool:
    """Whether the centre admits ``workload`` replica by replica (its status
    lists ``replicaAdmissions``, empty or not) rather than as one gang."""
    return isinstance(workload.status.get(REPLICA_ADMISSIONS), list)


def units(workload: WorkloadView, cluster: str) -> list[Mapping[str, Any]]:
    """The ``replicaAdmissions`` entries of ``workload`` admitted to ``cluster``."""
    return [
        entry
        for entry in workload.status.get(REPLICA_ADMISSIONS) or ()
        if (entry.get("admission") or {}).get("cluster") == cluster
    ]


def unit_view(workload: WorkloadView, entry: Mapping[str, Any]) -> WorkloadView:
    """One admitted replica as the planner sees a gang: the workload with
    ``status.admission`` that replica's (its uses make the member queue's
    quota, as a gang's do)."""
    status = {**workload.status, "admission": entry.get("admission") or {}}
    return WorkloadView(
        workload.namespace,
        workload.name,
        workload.uid,
        workload.spec,
        status,
        workload.annotations,
    )


def admission_label(workload: WorkloadView, key: str) -> str:
    """The ``quartermaster.dev/admission`` label of the member object of the
    placement ``key``: the same whatever the count, so scaling finds it."""
    return f"{workload.uid[:8]}-{key}"


def object_name(workload: WorkloadView, key: str) -> str:
    """The member object of the placement ``key`` (and its PodGroup's, on a
    Volcano member)."""
    return short_name(f"{job_name(workload)}-{key}")


def pods_per_unit(obj: Mapping[str, Any]) -> int:
    """How many pods one replica runs: a LeaderWorkerSet group's ``size``, else one."""
    if obj.get("kind") != "LeaderWorkerSet":
        return 1
    template = ((obj.get("spec") or {}).get("leaderWorkerTemplate")) or {}
    size = template.get("size", 1)
    return size if isinstance(size, int) and size > 0 else 1


def available(obj: Mapping[str, Any]) -> int:
    """The replicas a member object serves with: a Deployment's or
    StatefulSet's ``availableReplicas``, a LeaderWorkerSet's ready groups
    (``readyReplicas``: leader and every worker ready), never more than
    it asks for (a scale-down's pods still going are not counted)."""
    status = obj.get("status") or {}
    field = "readyReplicas" if obj.get("kind") == "LeaderWorkerSet" else "availableReplicas"
    count = status.get(field) or 0
    wanted = (obj.get("spec") or {}).get("replicas")
    count = count if isinstance(count, int) else 0
    return min(count, wanted) if isinstance(wanted, int) else count


class Part:
    """The replicas of one workload admitted to one placement of one cluster."""

    __slots__ = ("admission", "key", "replicas", "workload")

    def __init__(self, workload: WorkloadView, key: str, admission: Mapping[str, Any]) -> None:
        self.workload = workload
        #: A short digest of the placement: names the member object.
        self.key = key
        #: The first replica's admission (all of the part's are alike but for counts).
        self.admission = admission
        self.replicas = 0


def placement(admission: Mapping[str, Any]) -> str:
    """What replicas of one member object share: queue, cluster, and per
    pod set its flavors and islands (not its nodes, nor its time)."""
    shape = {
        "clusterQueue": admission.get("clusterQueue"),
        "cluster": admission.get("cluster"),
        "podSets": sorted(
            (
                str(a.get("name")),
                sorted((a.get("flavors") or {}).items()),
                list(a.get("islands") or ()),
            )
            for a in admission.get("podSetAssignments") or ()
        ),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:8]


def parts(workload: WorkloadView, cluster: str) -> list[Part]:
    """The workload's admitted replicas in ``cluster``, by placement, in a
    stable order (by placement digest)."""
    found: dict[str, Part] = {}
    for entry in workload.status.get(REPLICA_ADMISSIONS) or ():
        admission = entry.get("admission") or {}
        if admission.get("cluster") != cluster:
            continue
        key = placement(admission)
        part = found.get(key)
        if part is None:
            part = found[key] = Part(workload, key, admission)
        part.replicas += 1
    return [found[k] for k in sorted(found)]


def selectors(view: ClusterView, part: Part) -> dict[str, dict[str, str]]:
    """Per pod set, the node selector pinning it to the part's flavors and island."""
    out: dict[str, dict[str, str]] = {}
    for assignment in part.admission.get("podSetAssignments") or ():
        use = use_of(view, assignment, {})
        out.setdefault(str(assignment.get("name")), {}).update(use.selector)
    return out


def _templates(manifest: Obj) -> Iterable[tuple[str, Obj]]:
    found, _ = job_pod_templates(manifest)
    for template in found:
        if isinstance(template.template, dict):
            yield template.name, template.template


def member_object(part: Part, queue: str, selectors: Mapping[str, Mapping[str, str]]) -> Obj:
    """The member Deployment / StatefulSet / LeaderWorkerSet of ``part``:
    the submitted manifest with ``spec.replicas`` = the replicas admitted
    there, labelled for the member's Kueue (queue, priority), each pod set's
    templates pinned to the part's flavors and island."""
    workload = part.workload
    source = workload.spec.get("job")
    if not isinstance(source, Mapping) or source.get("kind") not in SERVING_KINDS:
        raise ValueError(f"{workload.key} carries no serving manifest")
    manifest = copy.deepcopy(dict(source))
    original = manifest.get("metadata") or {}
    admission = admission_label(workload, part.key)
    labels = managed_labels(
        **{
            WORKLOAD_LABEL: workload_label(workload.namespace, workload.name),
            ADMISSION_LABEL: admission,
            QUEUE_LABEL: queue,
            PRIORITY_LABEL: priority_class_name(priority_of(workload)),
        }
    )
    manifest["metadata"] = {
        "name": object_name(workload, part.key),
        "namespace": workload.namespace,
        "labels": {**(original.get("labels") or {}), **labels},
        "annotations": {
            **(original.get("annotations") or {}),
            WORKLOAD_ANNOTATION: workload.key,
            UID_ANNOTATION: workload.uid,
        },
    }
    manifest.pop("status", None)
    manifest.setdefault("spec", {})["replicas"] = part.replicas
    first = next(iter(selectors.values()), {})
    pods = {k: labels[k] for k in (WORKLOAD_LABEL, ADMISSION_LABEL)}
    for name, template in _templates(manifest):
        template.update(_pin(template, selectors.get(name, first), {}, pods, serving=True))
    return manifest


def scale_to(
    wanted: Sequence[Obj], actual: Sequence[Mapping[str, Any]]
) -> tuple[list[Obj], list[tuple[Ref, int]], list[Ref]]:
    """Against what the member holds: the objects to create, the ``(object,
    replicas)`` to scale in place (up or down, the running replicas kept),
    and the objects no replica is admitted to any more (to delete)."""
    held = {Ref.of(o): o for o in actual}
    want = {Ref.of(o): o for o in wanted}
    create = [o for ref, o in sorted(want.items()) if ref not in held]
    scale = [
        (ref, int(o["spec"]["replicas"]))
        for ref, o in sorted(want.items())
        if ref in held and (held[ref].get("spec") or {}).get("replicas") != o["spec"]["replicas"]
    ]
    delete = sorted(ref for ref in held if ref not in want)
    return create, scale, delete
