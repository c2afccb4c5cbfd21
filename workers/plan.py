"""Pure planners: what one member cluster should hold, given the centre's
decisions, against what it holds; and the events sync derives from it.

No I/O here: the reconciler (workers/reconcile.py) loads the read models and
lists the member cluster, calls :func:`plan`, and carries the actions out.

The centre stays the only quota authority. Each member ClusterQueue
``qm-<cq>`` has, per member flavor (``qm-<flavor>-<island>``: the flavor's
node labels plus the island's label), a nominal quota of exactly what the
centre admitted there, and no cohort and no preemption: it cannot admit what
the centre did not (nothing else is queued to it and there is no room), nor
block what it admitted (the quota is raised before the job is created).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.domain.quantity import canonical_resources, format_amount
from workers.clusters import Ref

__all__ = [
    "ADMISSION_LABEL",
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
    "job_name",
    "member_status",
    "plan",
]

Obj = dict[str, Any]

MANAGED_LABEL = "quartermaster.dev/managed"
MANAGED = f"{MANAGED_LABEL}=true"
WORKLOAD_LABEL = "quartermaster.dev/workload"
ADMISSION_LABEL = "quartermaster.dev/admission"
WORKLOAD_ANNOTATION = "quartermaster.dev/workload"
UID_ANNOTATION = "quartermaster.dev/workload-uid"
PRIORITY_ANNOTATION = "quartermaster.dev/priority"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SIM_ANNOTATIONS = ("quartermaster.dev/sim-duration", "quartermaster.dev/sim-exit")
JOB_KINDS = ("Job", "JobSet", "PyTorchJob", "MPIJob")
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
#: Kueue's CRD caps (ClusterQueue resourceGroups[].flavors, ResourceFlavor nodeLabels).
MAX_FLAVORS = 64


@dataclass(frozen=True)
class WorkloadView:
    """A central workload as the reconciler sees it (its read-model row)."""

    namespace: str
    name: str
    uid: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, Any] = field(default_factory=dict)

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
    raw = (
        f"{workload.uid}/{workload.admission.get('cluster')}/{workload.admission.get('admittedAt')}"
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def workload_label(namespace: str, name: str) -> str:
    return _short(f"{namespace}.{name}")


def priority_class_name(priority: int) -> str:
    """One member WorkloadPriorityClass per priority value (not per central
    class: a class whose value changes must not re-rank running gangs)."""
    return f"qm-p{priority}" if priority >= 0 else f"qm-m{-priority}"


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


def _island_label(view: ClusterView, flavor: str) -> str | None:
    spec = view.flavors.get(flavor) or {}
    topology = view.topologies.get(str(spec.get("topologyName") or "")) or {}
    levels = topology.get("levels") or ()
    return str(levels[0]["nodeLabel"]) if levels else None


def _pod_set_flavors(
    view: ClusterView, assignment: Mapping[str, Any]
) -> dict[str, tuple[str, dict[str, str]]]:
    """Resource → (member flavor name, its node labels) of one pod set."""
    islands = list(assignment.get("islands") or ())
    island = islands[0] if len(islands) == 1 else None
    out = {}
    for resource, flavor in (assignment.get("flavors") or {}).items():
        key = _island_label(view, flavor)
        labels = {
            str(k): str(v)
            for k, v in ((view.flavors.get(flavor) or {}).get("nodeLabels") or {}).items()
        }
        pinned = island if key is not None else None
        if pinned is not None and key is not None:
            labels[key] = str(pinned)
        out[str(resource)] = (flavor_name(flavor, pinned), labels)
    return out


def _flavor(
    view: ClusterView, name: str, central: str, labels: Mapping[str, str], island: str | None
) -> Obj:
    source = view.flavors.get(central) or {}
    # Kueue allows 8 node labels; the island's is the one that must stay.
    first = [(k, v) for k, v in labels.items() if k == island]
    rest = sorted((k, v) for k, v in labels.items() if k != island)
    spec: Obj = {"nodeLabels": dict((first + rest)[:8])}
    for key in ("nodeTaints", "tolerations"):
        if source.get(key):
            spec[key] = copy.deepcopy(list(source[key]))
    return {
        "apiVersion": _API_VERSIONS["ResourceFlavor"],
        "kind": "ResourceFlavor",
        "metadata": {"name": name, "labels": _labels()},
        "spec": spec,
    }


def _cluster_queue(name: str, quota: Mapping[str, Mapping[str, int]]) -> Obj:
    resources = sorted({r for amounts in quota.values() for r in amounts})
    flavors = [
        {
            "name": flavor,
            "resources": [
                {"name": r, "nominalQuota": format_amount(r, amounts.get(r, 0))} for r in resources
            ],
        }
        for flavor, amounts in sorted(quota.items())[:MAX_FLAVORS]
    ]
    return {
        "apiVersion": _API_VERSIONS["ClusterQueue"],
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": _labels()},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": resources, "flavors": flavors}],
        },
    }


def _pin(
    template: Mapping[str, Any],
    selector: Mapping[str, str],
    extra: Mapping[str, str],
    labels: Mapping[str, str],
) -> Obj:
    """A pod template pinned to its flavors' (and island's) node labels, its
    pods labelled with the workload and admission they belong to."""
    out = copy.deepcopy(dict(template))
    meta = out.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    annotations = meta.setdefault("annotations", {})
    for key, value in extra.items():
        annotations.setdefault(key, value)
    spec = out.setdefault("spec", {})
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
    the name of its pod set (as service/app/workloads.py names them)."""
    spec = job.get("spec") or {}
    kind = job.get("kind")
    if kind == "Job":
        yield "main", spec.setdefault("template", {})
    elif kind == "JobSet":
        for i, replicated in enumerate(spec.get("replicatedJobs") or ()):
            name = str(replicated.get("name") or f"job-{i}")
            template = replicated.setdefault("template", {}).setdefault("spec", {})
            yield name, template.setdefault("template", {})
    else:
        field_name = "pytorchReplicaSpecs" if kind == "PyTorchJob" else "mpiReplicaSpecs"
        for replica_type, replica in (spec.get(field_name) or {}).items():
            yield str(replica_type).lower(), replica.setdefault("template", {})


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


def desired(view: ClusterView) -> _Desired:
    out = _Desired()
    quotas: dict[str, dict[str, dict[str, int]]] = {}
    local_queues: dict[tuple[str, str], str] = {}
    for workload in view.workloads:
        if workload.state not in RUNS_HERE or workload.admission.get("cluster") != view.cluster:
            continue
        cq = f"qm-{_dns(str(workload.admission['clusterQueue']))}"
        queue = _short(f"qm-{_dns(str(workload.spec.get('queueName', 'default')))}")
        selectors: dict[str, dict[str, str]] = {}
        quota = quotas.setdefault(cq, {})
        for assignment in workload.admission.get("podSetAssignments") or ():
            selector = selectors.setdefault(str(assignment.get("name")), {})
            usage = canonical_resources(dict(assignment.get("resourceUsage") or {}))
            member = _pod_set_flavors(view, assignment)
            for resource, (name, labels) in member.items():
                central = assignment["flavors"][resource]
                ref = Ref("ResourceFlavor", "", name)
                island_key = _island_label(view, central)
                out.queues.setdefault(ref, _flavor(view, name, central, labels, island_key))
                bucket = quota.setdefault(name, {})
                bucket[resource] = bucket.get(resource, 0) + usage.get(resource, 0)
                selector.update(labels)
        out.namespaces.setdefault(
            workload.namespace,
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": workload.namespace, "labels": _labels()},
            },
        )
        local_queues[(workload.namespace, queue)] = cq
        priority = _priority(workload)
        wpc = priority_class_name(priority)
        out.queues.setdefault(
            Ref("WorkloadPriorityClass", "", wpc),
            {
                "apiVersion": _API_VERSIONS["WorkloadPriorityClass"],
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": wpc, "labels": _labels()},
                "value": priority,
            },
        )
        admission = admission_id(workload)
        out.jobs[(workload.key, admission)] = _job(workload, queue, selectors, admission)
    for cq, quota in quotas.items():
        out.queues[Ref("ClusterQueue", "", cq)] = _cluster_queue(cq, quota)
    for (namespace, queue), cq in local_queues.items():
        out.queues[Ref("LocalQueue", namespace, queue)] = {
            "apiVersion": _API_VERSIONS["LocalQueue"],
            "kind": "LocalQueue",
            "metadata": {"name": queue, "namespace": namespace, "labels": _labels()},
            "spec": {"clusterQueue": cq},
        }
    return out


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


def plan(view: ClusterView, actual: Sequence[Mapping[str, Any]]) -> Actions:
    """``actual``: the member's objects that carry our managed label."""
    want = desired(view)
    actions = Actions()
    jobs = [o for o in actual if o.get("kind") in JOB_KINDS]
    present = {_job_key(o) for o in jobs}
    occupied = {Ref.of(o) for o in jobs}
    for obj in jobs:
        if _job_key(obj) not in want.jobs:
            actions.draining.append(_job_key(obj)[1])
            if not (obj.get("metadata") or {}).get("deletionTimestamp"):
                actions.delete.append(Ref.of(obj))
    on_cluster = {Ref.of(o): o for o in actual}
    for ns in want.namespaces.values():
        if Ref.of(ns) not in on_cluster:
            actions.apply.append(ns)
    for kind in reversed(QUEUE_KINDS):  # flavors, then ClusterQueues, then LocalQueues
        for ref, obj in sorted(want.queues.items()):
            if ref.kind == kind and not _contains(on_cluster.get(ref), obj):
                actions.apply.append(obj)
    for key, job in sorted(want.jobs.items()):
        if key not in present and Ref.of(job) not in occupied:
            actions.dispatch.append(job)
    in_use = {ref for ref in want.queues}
    for kind in QUEUE_KINDS:
        for obj in actual:
            ref = Ref.of(obj)
            if ref.kind == kind and ref not in in_use:
                actions.collect.append(ref)
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
