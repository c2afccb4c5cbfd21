"""A Kueue-like controller: jobs become Workloads, Workloads are admitted against
ClusterQueue quota and flavors, admitted jobs are unsuspended and pinned to their
flavors' nodes, and their state flows back into Workload conditions.

It reproduces what Kueue (``pkg/controller/jobframework``, ``pkg/scheduler``,
``flavorassigner``) does in the cases Quartermaster exercises on a member
cluster — and no more:

* a job labelled ``kueue.x-k8s.io/queue-name`` is suspended on create (the
  webhook) and gets a Workload ``<kind>-<name>-<hash>`` owning its pod sets;
* each cycle, pending Workloads are taken by priority then age; each pod set
  gets, per resource group, the first flavor whose labels and taints suit it
  and whose quota (nominal, plus what the cohort lends within
  ``borrowingLimit``) fits; ``StrictFIFO`` queues stop at the first that does
  not fit; a pod set whose template asks
  ``kueue.x-k8s.io/podset-required-topology`` also needs one domain of that
  topology level with room for all its pods;
* admission writes ``status.admission`` and ``QuotaReserved``/``Admitted``;
  failing to fit writes ``QuotaReserved=False`` with Kueue's reason text;
* an admitted job gets the flavors' node labels and tolerations and runs;
  ``PodsReady`` and ``Finished`` follow the job; a finished Workload frees its
  quota; ``spec.active=false`` and ``stopPolicy: HoldAndDrain`` evict.

Not simulated: preemption, admission checks, fair sharing and Cohort-level
quotas (the central service decides those; member queues only mirror it).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from sim.kubesim.api import Context, Resource
from sim.kubesim.controllers.base import (
    Reconciler,
    condition,
    controller_of,
    is_true,
    owner_reference,
    pod_requests,
    set_condition,
)
from sim.kubesim.controllers.nodes import matches_node, node_ready, tolerates
from sim.kubesim.quantity import canonical_list, resource_quantity
from sim.kubesim.selectors import match_selector_object
from sim.kubesim.store import DELETED, Event, clone

__all__ = ["JOB_KINDS", "QUEUE_LABEL", "KueueController", "suspend_queued_jobs"]

Obj = dict[str, Any]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
WORKLOADS = "workloads.kueue.x-k8s.io"
CLUSTER_QUEUES = "clusterqueues.kueue.x-k8s.io"
LOCAL_QUEUES = "localqueues.kueue.x-k8s.io"
FLAVORS = "resourceflavors.kueue.x-k8s.io"
_CYCLE = ("cycle",)
_QUEUE_OBJECTS = (
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    FLAVORS,
    "cohorts.kueue.x-k8s.io",
    "workloadpriorityclasses.kueue.x-k8s.io",
    "namespaces",
    "nodes",
)


# -- job kinds -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobKind:
    """How Kueue's job framework sees one kind: suspension, pod sets, completion."""

    key: str
    kind: str
    suspend_path: tuple[str, ...]
    specs_field: str = ""

    def suspended(self, job: Obj) -> bool:
        node: Any = job
        for part in self.suspend_path:
            node = (node or {}).get(part)
        return bool(node)

    def set_suspend(self, job: Obj, value: bool) -> None:
        node = job
        for part in self.suspend_path[:-1]:
            node = node.setdefault(part, {})
        node[self.suspend_path[-1]] = value

    def podsets(self, job: Obj) -> list[tuple[str, int, Obj]]:
        """``(name, count, pod template)``; templates are live references into ``job``."""
        spec = job.setdefault("spec", {})
        if self.key == "jobs.batch":
            parallelism = int(spec.get("parallelism", 1))
            completions = spec.get("completions")
            count = min(parallelism, int(completions)) if completions is not None else parallelism
            return [("main", count, spec.setdefault("template", {}))]
        if self.key == "jobsets.jobset.x-k8s.io":
            sets = []
            for replicated in spec.get("replicatedJobs") or ():
                job_spec = replicated.setdefault("template", {}).setdefault("spec", {})
                count = int(replicated.get("replicas", 1)) * int(job_spec.get("parallelism", 1))
                sets.append((replicated["name"], count, job_spec.setdefault("template", {})))
            return sets
        return [
            (
                replica_type.lower(),
                int(replica.get("replicas", 1)),
                replica.setdefault("template", {}),
            )
            for replica_type, replica in (spec.get(self.specs_field) or {}).items()
        ]

    def finished(self, job: Obj) -> tuple[bool, bool, str]:
        success = {"jobs.batch": "Complete", "jobsets.jobset.x-k8s.io": "Completed"}.get(
            self.key, "Succeeded"
        )
        if is_true(job, success):
            return True, True, "Job finished successfully"
        failed = condition(job, "Failed")
        if failed is not None and failed.get("status") == "True":
            return True, False, failed.get("message") or "Job failed"
        return False, False, ""


JOB_KINDS: dict[str, JobKind] = {
    kind.key: kind
    for kind in (
        JobKind("jobs.batch", "Job", ("spec", "suspend")),
        JobKind("jobsets.jobset.x-k8s.io", "JobSet", ("spec", "suspend")),
        JobKind(
            "pytorchjobs.kubeflow.org",
            "PyTorchJob",
            ("spec", "runPolicy", "suspend"),
            "pytorchReplicaSpecs",
        ),
        JobKind(
            "mpijobs.kubeflow.org", "MPIJob", ("spec", "runPolicy", "suspend"), "mpiReplicaSpecs"
        ),
    )
}
_MANAGED_KINDS = {kind.kind for kind in JOB_KINDS.values()}


def _managed_by_parent(job: Obj) -> bool:
    owner = controller_of(job)
    return owner is not None and owner.get("kind") in _MANAGED_KINDS


def suspend_queued_jobs(
    operation: str, resource: Resource, obj: Obj, old: Obj | None, ctx: Context
) -> None:
    """Kueue's mutating webhook: a queued job starts suspended."""
    kind = JOB_KINDS.get(resource.rtype.key)
    if kind is None or operation != "CREATE":
        return
    if (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL) and not _managed_by_parent(obj):
        kind.set_suspend(obj, True)


def workload_name(kind: str, job_name: str, job_uid: str) -> str:
    digest = hashlib.sha256(f"{job_name}/{job_uid}".encode()).hexdigest()[:5]
    prefix = f"{kind.lower()}-{job_name}"[: 63 - 6].rstrip("-.")
    return f"{prefix}-{digest}"


# -- quota arithmetic ----------------------------------------------------------------------


@dataclass(slots=True)
class Quota:
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None

    @property
    def lendable(self) -> int:
        return self.nominal if self.lending_limit is None else min(self.lending_limit, self.nominal)

    @property
    def guaranteed(self) -> int:
        return self.nominal - self.lendable


def _amount(resource: str, value: Any) -> int:
    from service.domain.quantity import canonical_amount

    return canonical_amount(resource, value)


def _quotas(cq: Obj) -> dict[tuple[str, str], Quota]:
    quotas = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            for resource in flavor.get("resources") or ():
                name = resource["name"]
                borrowing = resource.get("borrowingLimit")
                lending = resource.get("lendingLimit")
                quotas[(flavor["name"], name)] = Quota(
                    _amount(name, resource.get("nominalQuota", 0)),
                    None if borrowing is None else _amount(name, borrowing),
                    None if lending is None else _amount(name, lending),
                )
    return quotas


def _cohort(cq: Obj) -> str:
    spec = cq.get("spec") or {}
    return spec.get("cohortName") or spec.get("cohort") or ""


def _insufficient(resource: str, flavor: str, lack: str) -> str:
    return f"insufficient unused quota for {resource} in flavor {flavor}, {lack} more needed"


class Ledger:
    """Reserved usage per (ClusterQueue, flavor, resource) during one cycle."""

    def __init__(self, cqs: dict[str, Obj]) -> None:
        self.cqs = cqs
        self.quotas = {name: _quotas(cq) for name, cq in cqs.items()}
        self.used: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
        self.cohorts: dict[str, list[str]] = defaultdict(list)
        for name, cq in cqs.items():
            if _cohort(cq):
                self.cohorts[_cohort(cq)].append(name)

    def add(self, cq: str, usage: Iterable[tuple[str, str, int]]) -> None:
        for flavor, resource, amount in usage:
            self.used[cq][(flavor, resource)] += amount

    def _cohort_free(self, cohort: str, key: tuple[str, str]) -> int:
        free = 0
        for member in self.cohorts[cohort]:
            quota = self.quotas[member].get(key)
            if quota is None:
                continue
            free += quota.lendable - max(0, self.used[member][key] - quota.guaranteed)
        return free

    def check(self, cq: str, flavor: str, resource: str, request: int) -> str | None:
        """``None`` when ``request`` more fits; else Kueue's reason."""
        key = (flavor, resource)
        quota = self.quotas[cq].get(key)
        if quota is None:
            return f"insufficient quota for {resource} in flavor {flavor} in ClusterQueue"
        used = self.used[cq][key]
        cohort = _cohort(self.cqs[cq])

        def shown(amount: int) -> str:
            return resource_quantity(resource, amount)

        if not cohort:
            if request > quota.nominal:
                return (
                    f"insufficient quota for {resource} in flavor {flavor}, request > maximum "
                    f"capacity ({shown(request)} > {shown(quota.nominal)})"
                )
            if used + request > quota.nominal:
                return _insufficient(resource, flavor, shown(used + request - quota.nominal))
            return None
        pool = sum(
            self.quotas[m][key].lendable for m in self.cohorts[cohort] if key in self.quotas[m]
        )
        ceiling = quota.guaranteed + pool
        if quota.borrowing_limit is not None:
            ceiling = min(ceiling, quota.nominal + quota.borrowing_limit)
        if request > ceiling:
            return (
                f"insufficient quota for {resource} in flavor {flavor}, request > maximum capacity "
                f"({shown(request)} > {shown(ceiling)})"
            )
        own_free = max(0, quota.guaranteed - used)
        available = own_free + self._cohort_free(cohort, key)
        limit_left = (
            None if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit - used
        )
        if request > available or (limit_left is not None and request > limit_left):
            lack = request - min(available, limit_left if limit_left is not None else available)
            return _insufficient(resource, flavor, shown(lack))
        return None


# -- the controller ------------------------------------------------------------------------


class KueueController(Reconciler):
    name = "kueue"
    manager = "kueue"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.workload_of: dict[str, tuple[str, str]] = {}
        self.topology: dict[str, dict[str, dict[str, str]]] = {}
        self.core.admission.append(suspend_queued_jobs)
        for workload in self.items(WORKLOADS):
            self._index(workload)
        self.enqueue(_CYCLE)

    def stop(self) -> None:
        super().stop()
        if suspend_queued_jobs in self.core.admission:
            self.core.admission.remove(suspend_queued_jobs)

    def _index(self, workload: Obj, *, deleted: bool = False) -> None:
        owner = controller_of(workload)
        if owner is None:
            return
        key = (workload["metadata"]["namespace"], workload["metadata"]["name"])
        if deleted:
            if self.workload_of.get(owner.get("uid", "")) == key:
                del self.workload_of[owner["uid"]]
        else:
            self.workload_of[owner.get("uid", "")] = key

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key in JOB_KINDS:
            yield ("job", resource_key, *event.key)
        elif resource_key == WORKLOADS:
            self._index(event.obj, deleted=event.type == DELETED)
            yield ("workload", *event.key)
            owner = controller_of(event.obj)
            if owner is not None:
                for kind in JOB_KINDS.values():
                    if kind.kind == owner.get("kind"):
                        yield ("job", kind.key, event.key[0], owner.get("name", ""))
            yield _CYCLE
        elif resource_key == "pods":
            owner = controller_of(event.obj)
            if owner and owner.get("kind") in ("PyTorchJob", "MPIJob"):
                key = (
                    "pytorchjobs.kubeflow.org"
                    if owner["kind"] == "PyTorchJob"
                    else "mpijobs.kubeflow.org"
                )
                yield ("job", key, event.key[0], owner.get("name", ""))
        elif resource_key in _QUEUE_OBJECTS:
            if resource_key in (CLUSTER_QUEUES, FLAVORS) and event.type != DELETED:
                yield ("finalizer", resource_key, *event.key)
            yield _CYCLE

    def reconcile(self, key: Hashable) -> None:
        kind = key[0]  # type: ignore[index]
        if kind == "job":
            self._reconcile_job(*key[1:])  # type: ignore[index]
        elif kind == "workload":
            self._reconcile_workload(*key[1:])  # type: ignore[index]
        elif kind == "cycle":
            self._cycle()
        elif kind == "finalizer":
            self._ensure_finalizer(*key[1:])  # type: ignore[index]

    # -- jobs ------------------------------------------------------------------------------

    def _reconcile_job(self, kind_key: str, namespace: str, name: str) -> None:
        kind = JOB_KINDS[kind_key]
        job = self.get(kind_key, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if not queue or _managed_by_parent(job):
            return
        workload_key = self.workload_of.get(job["metadata"]["uid"])
        workload = self.get(WORKLOADS, *workload_key) if workload_key else None
        done, succeeded, message = kind.finished(job)
        if workload is None:
            if not done:
                self._create_workload(kind, job, queue)
            return
        if done:
            self._finish(workload, succeeded, message)
            return
        admitted = is_true(workload, "Admitted") and not is_true(workload, "Finished")
        if admitted and kind.suspended(job):
            self._start(kind, job, workload)
        elif not admitted and not kind.suspended(job):
            self._stop(kind, job, workload)
        elif admitted:
            self._pods_ready(kind, job, workload)

    def _create_workload(self, kind: JobKind, job: Obj, queue: str) -> None:
        view = clone(job)
        pod_sets = []
        for name, count, template in kind.podsets(view):
            pod_sets.append({"name": name, "count": count, "template": _template(template)})
        spec: Obj = {"queueName": queue, "podSets": pod_sets, "active": True}
        priority_class = (job["metadata"].get("labels") or {}).get(PRIORITY_LABEL)
        if priority_class:
            wpc = self.get("workloadpriorityclasses.kueue.x-k8s.io", "", priority_class)
            if wpc is not None:
                spec["priorityClassRef"] = {
                    "group": "kueue.x-k8s.io",
                    "kind": "WorkloadPriorityClass",
                    "name": priority_class,
                }
                spec["priority"] = int(wpc.get("value", 0))
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": workload_name(kind.kind, job["metadata"]["name"], job["metadata"]["uid"]),
                "namespace": job["metadata"]["namespace"],
                "labels": {JOB_UID_LABEL: job["metadata"]["uid"]},
                "ownerReferences": [owner_reference(job)],
                "finalizers": [RESOURCE_IN_USE],
            },
            "spec": spec,
        }
        created = self.create(WORKLOADS, workload)
        self._index(created)
        self.events.emit(
            job,
            kind.kind,
            "CreatedWorkload",
            f"Created Workload: {created['metadata']['namespace']}/{created['metadata']['name']}",
        )

    def _flavor_patch(self, workload: Obj) -> dict[str, tuple[dict[str, str], list[Obj]]]:
        """Per pod set: node labels and tolerations its assigned flavors add to the pods."""
        result = {}
        topology = self.topology.get(workload["metadata"]["uid"], {})
        for assignment in (workload.get("status") or {}).get("admission", {}).get(
            "podSetAssignments"
        ) or ():
            labels: dict[str, str] = {}
            tolerations: list[Obj] = []
            for flavor_name in dict.fromkeys((assignment.get("flavors") or {}).values()):
                flavor = self.get(FLAVORS, "", flavor_name) or {}
                labels.update((flavor.get("spec") or {}).get("nodeLabels") or {})
                tolerations += (flavor.get("spec") or {}).get("tolerations") or []
            labels.update(topology.get(assignment["name"], {}))
            result[assignment["name"]] = (labels, tolerations)
        return result

    def _start(self, kind: JobKind, job: Obj, workload: Obj) -> None:
        patches = self._flavor_patch(workload)

        def run(obj: Obj) -> None:
            for name, _, template in kind.podsets(obj):
                labels, tolerations = patches.get(name, ({}, []))
                spec = template.setdefault("spec", {})
                if labels:
                    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **labels}
                existing = spec.get("tolerations") or []
                added = [t for t in tolerations if t not in existing]
                if added:
                    spec["tolerations"] = existing + added
            kind.set_suspend(obj, False)

        self.mutate(kind.key, job, run)
        cq = workload["status"]["admission"]["clusterQueue"]
        self.events.emit(job, kind.kind, "Started", f"Admitted by clusterQueue {cq}")

    def _stop(self, kind: JobKind, job: Obj, workload: Obj) -> None:
        suspended = self.mutate(kind.key, job, lambda obj: kind.set_suspend(obj, True))
        originals = {
            ps["name"]: ps.get("template") or {} for ps in workload["spec"].get("podSets") or ()
        }

        def restore(obj: Obj) -> None:
            for name, _, template in kind.podsets(obj):
                original = (originals.get(name) or {}).get("spec") or {}
                spec = template.setdefault("spec", {})
                for field in ("nodeSelector", "tolerations"):
                    if field in original:
                        spec[field] = clone(original[field])
                    else:
                        spec.pop(field, None)

        self.mutate(kind.key, suspended, restore)
        self.events.emit(job, kind.kind, "Stopped", "Not admitted by cluster queue")

    def _pods_ready(self, kind: JobKind, job: Obj, workload: Obj) -> None:
        wanted = sum(ps.get("count", 1) for ps in workload["spec"].get("podSets") or ())
        ready = self._ready_pods(kind, job)
        previous = condition(workload, "PodsReady") or {}
        was_ready = previous.get("status") == "True"
        recovering = previous.get("reason") == "WaitForRecovery"
        if ready >= wanted:
            reason, message, status = (
                "Started",
                "All pods reached readiness and the workload is running",
                "True",
            )
            if previous.get("reason") in ("WaitForRecovery", "Recovered"):
                reason = "Recovered"
        elif was_ready or recovering:
            reason, message, status = (
                "WaitForRecovery",
                "At least one pod has failed, waiting for recovery",
                "False",
            )
        else:
            reason, message, status = "WaitForStart", "Not all pods are ready or succeeded", "False"
        if (previous.get("status"), previous.get("reason")) == (status, reason):
            return
        self.mutate(
            WORKLOADS,
            workload,
            lambda w: set_condition(
                w.setdefault("status", {}), "PodsReady", status, reason, message
            ),
            status=True,
        )

    def _ready_pods(self, kind: JobKind, job: Obj) -> int:
        status = job.get("status") or {}
        if kind.key == "jobs.batch":
            return int(status.get("ready", 0)) + int(status.get("succeeded", 0))
        if kind.key == "jobsets.jobset.x-k8s.io":
            total = 0
            for child in self.items("jobs.batch", job["metadata"]["namespace"]):
                if (controller_of(child) or {}).get("uid") == job["metadata"]["uid"]:
                    child_status = child.get("status") or {}
                    total += int(child_status.get("ready", 0)) + int(
                        child_status.get("succeeded", 0)
                    )
            return total
        total = 0
        for pod in self.items("pods", job["metadata"]["namespace"]):
            if (controller_of(pod) or {}).get("uid") == job["metadata"]["uid"]:
                phase = (pod.get("status") or {}).get("phase")
                total += phase == "Succeeded" or (phase == "Running" and is_true(pod, "Ready"))
        return total

    def _finish(self, workload: Obj, succeeded: bool, message: str) -> None:
        if is_true(workload, "Finished"):
            if RESOURCE_IN_USE in (workload["metadata"].get("finalizers") or ()):
                self._drop_finalizer(workload)
            return
        reason = "Succeeded" if succeeded else "Failed"

        def finished(w: Obj) -> None:
            set_condition(w.setdefault("status", {}), "Finished", "True", reason, message)

        updated = self.mutate(WORKLOADS, workload, finished, status=True)
        self._drop_finalizer(updated)
        self.events.emit(updated, "Workload", "Finished", message)

    def _drop_finalizer(self, workload: Obj) -> None:
        self.mutate(
            WORKLOADS,
            workload,
            lambda w: w["metadata"].__setitem__(
                "finalizers",
                [f for f in w["metadata"].get("finalizers") or () if f != RESOURCE_IN_USE],
            ),
        )

    # -- workloads -------------------------------------------------------------------------

    def _reconcile_workload(self, namespace: str, name: str) -> None:
        workload = self.get(WORKLOADS, namespace, name)
        if workload is None:
            return
        if workload["metadata"].get("deletionTimestamp"):
            if RESOURCE_IN_USE in (workload["metadata"].get("finalizers") or ()):
                self._drop_finalizer(workload)
            return
        owner = controller_of(workload)
        if owner is not None and self._owner_gone(workload, owner):
            self._drop_finalizer(workload)
            self.delete(WORKLOADS, self.get(WORKLOADS, namespace, name) or workload)
            return
        if is_true(workload, "QuotaReserved") and not is_true(workload, "Finished"):
            self._maybe_evict(workload)

    def _owner_gone(self, workload: Obj, owner: Obj) -> bool:
        for kind in JOB_KINDS.values():
            if kind.kind == owner.get("kind"):
                job = self.get(kind.key, workload["metadata"]["namespace"], owner.get("name", ""))
                return job is None or job["metadata"]["uid"] != owner.get("uid")
        return False

    def _maybe_evict(self, workload: Obj) -> None:
        reason = message = ""
        if workload["spec"].get("active") is False:
            reason, message = "Deactivated", "The workload is deactivated"
        else:
            cq_name = workload["status"].get("admission", {}).get("clusterQueue", "")
            cq = self.get(CLUSTER_QUEUES, "", cq_name)
            if cq is not None and (cq.get("spec") or {}).get("stopPolicy") == "HoldAndDrain":
                reason, message = "ClusterQueueStopped", "The ClusterQueue is stopped"
        if reason:
            self._evict(workload, reason, message)

    def _evict(self, workload: Obj, reason: str, message: str) -> None:
        def evicted(w: Obj) -> None:
            status = w.setdefault("status", {})
            set_condition(status, "Evicted", "True", reason, message)
            set_condition(status, "QuotaReserved", "False", "Pending", message)
            set_condition(
                status, "Admitted", "False", "NoReservation", "The workload has no reservation"
            )
            if condition(w, "PodsReady") is not None:
                set_condition(
                    status,
                    "PodsReady",
                    "False",
                    "WaitForStart",
                    "Not all pods are ready or succeeded",
                )
            requeued = reason != "Deactivated"
            set_condition(status, "Requeued", "True" if requeued else "False", reason, message)
            status.pop("admission", None)

        self.mutate(WORKLOADS, workload, evicted, status=True)
        self.topology.pop(workload["metadata"]["uid"], None)
        self.events.emit(workload, "Workload", "EvictedDue" + reason, message)

    def _ensure_finalizer(self, resource_key: str, namespace: str, name: str) -> None:
        obj = self.get(resource_key, namespace, name)
        if obj is None:
            return
        finalizers = obj["metadata"].get("finalizers") or []
        in_use = self._in_use(resource_key, name)
        if obj["metadata"].get("deletionTimestamp"):
            if not in_use and RESOURCE_IN_USE in finalizers:
                self.mutate(
                    resource_key,
                    obj,
                    lambda o: o["metadata"].__setitem__(
                        "finalizers", [f for f in finalizers if f != RESOURCE_IN_USE]
                    ),
                )
            return
        if RESOURCE_IN_USE not in finalizers:
            self.mutate(
                resource_key,
                obj,
                lambda o: o["metadata"].__setitem__("finalizers", [*finalizers, RESOURCE_IN_USE]),
            )

    def _in_use(self, resource_key: str, name: str) -> bool:
        for workload in self.items(WORKLOADS):
            if not _reserving(workload):
                continue
            admission = workload["status"].get("admission") or {}
            if resource_key == CLUSTER_QUEUES and admission.get("clusterQueue") == name:
                return True
            if resource_key == FLAVORS:
                for assignment in admission.get("podSetAssignments") or ():
                    if name in (assignment.get("flavors") or {}).values():
                        return True
        return False

    # -- the admission cycle ---------------------------------------------------------------

    def _cycle(self) -> None:
        cqs = {cq["metadata"]["name"]: cq for cq in self.items(CLUSTER_QUEUES)}
        ledger = Ledger(cqs)
        workloads = self.items(WORKLOADS)
        for workload in workloads:
            if _reserving(workload):
                admission = workload["status"]["admission"]
                if admission.get("clusterQueue") in cqs:
                    ledger.add(admission["clusterQueue"], _usage(admission))
        pending = sorted(
            (w for w in workloads if _pending(w)),
            key=lambda w: (
                -int(w["spec"].get("priority", 0)),
                w["metadata"].get("creationTimestamp", ""),
                w["metadata"]["name"],
            ),
        )
        blocked: set[str] = set()
        placements = _Placements(self)
        for workload in pending:
            self._consider(workload, cqs, ledger, blocked, placements)
        for for_cleanup in list(self.topology):
            if not any(w["metadata"]["uid"] == for_cleanup for w in workloads):
                self.topology.pop(for_cleanup, None)
        self._queue_statuses(cqs, ledger, self.items(WORKLOADS))

    def _consider(
        self,
        workload: Obj,
        cqs: dict[str, Obj],
        ledger: Ledger,
        blocked: set[str],
        placements: _Placements,
    ) -> None:
        namespace = workload["metadata"]["namespace"]
        queue = workload["spec"].get("queueName", "")
        lq = self.get(LOCAL_QUEUES, namespace, queue)
        if lq is None:
            self._pending(workload, "Inadmissible", f"LocalQueue {queue} doesn't exist")
            return
        cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
        cq = cqs.get(cq_name)
        if cq is None:
            self._pending(workload, "Inadmissible", f"ClusterQueue {cq_name} doesn't exist")
            return
        inactive = self._inactive_reason(cq)
        if inactive:
            self._pending(workload, "Inadmissible", f"ClusterQueue {cq_name} is inactive")
            return
        ns = self.get("namespaces", "", namespace)
        ns_labels = (ns or {}).get("metadata", {}).get("labels") or {}
        if not match_selector_object((cq.get("spec") or {}).get("namespaceSelector"), ns_labels):
            self._pending(
                workload, "Inadmissible", "Workload namespace doesn't match ClusterQueue selector"
            )
            return
        if cq_name in blocked:
            self._pending(
                workload,
                "Pending",
                "Workload is waiting for the head of its StrictFIFO ClusterQueue",
            )
            return
        assignment, message = self._assign(workload, cq_name, cq, ledger, placements)
        if assignment is None:
            self._pending(workload, "Pending", message)
            if (cq.get("spec") or {}).get("queueingStrategy") == "StrictFIFO":
                blocked.add(cq_name)
            return
        ledger.add(cq_name, _usage({"podSetAssignments": assignment}))
        self._admit(workload, cq_name, assignment)

    def _inactive_reason(self, cq: Obj) -> str:
        spec = cq.get("spec") or {}
        if spec.get("stopPolicy", "None") != "None":
            return "Stopped"
        missing = self._missing_flavors(cq)
        return "FlavorNotFound" if missing else ""

    def _missing_flavors(self, cq: Obj) -> list[str]:
        names = [
            f["name"]
            for g in (cq.get("spec") or {}).get("resourceGroups") or ()
            for f in g.get("flavors") or ()
        ]
        return [name for name in names if self.get(FLAVORS, "", name) is None]

    def _assign(
        self, workload: Obj, cq_name: str, cq: Obj, ledger: Ledger, placements: _Placements
    ) -> tuple[list[Obj] | None, str]:
        groups = (cq.get("spec") or {}).get("resourceGroups") or []
        assignments = []
        trial: Counter[tuple[str, str]] = Counter()
        topology: dict[str, dict[str, str]] = {}
        for pod_set in workload["spec"].get("podSets") or ():
            template = pod_set.get("template") or {}
            count = int(pod_set.get("count", 1))
            per_pod = pod_requests(template.get("spec") or {})
            total = {name: amount * count for name, amount in per_pod.items() if amount}
            flavors: dict[str, str] = {}
            for resource in total:
                if not any(resource in g.get("coveredResources", ()) for g in groups):
                    return (
                        None,
                        f"couldn't assign flavors to pod set {pod_set['name']}: "
                        f"resource {resource} unavailable in ClusterQueue",
                    )
            domain: dict[str, str] = {}
            for group in groups:
                wanted = {r: a for r, a in total.items() if r in group.get("coveredResources", ())}
                if not wanted:
                    continue
                chosen, reasons, chosen_domain = self._pick_flavor(
                    cq_name, group, pod_set, wanted, per_pod, count, ledger, trial, placements
                )
                if chosen is None:
                    return (
                        None,
                        f"couldn't assign flavors to pod set {pod_set['name']}: "
                        f"{', '.join(reasons)}",
                    )
                domain.update(chosen_domain)
                for resource, amount in wanted.items():
                    flavors[resource] = chosen
                    trial[(chosen, resource)] += amount
            if domain:
                topology[pod_set["name"]] = domain
            assignments.append(
                {
                    "name": pod_set["name"],
                    "flavors": flavors,
                    "resourceUsage": {r: resource_quantity(r, a) for r, a in total.items()},
                    "count": count,
                }
            )
        self.topology[workload["metadata"]["uid"]] = topology
        return assignments, ""

    def _pick_flavor(
        self,
        cq_name: str,
        group: Obj,
        pod_set: Obj,
        wanted: dict[str, int],
        per_pod: dict[str, int],
        count: int,
        ledger: Ledger,
        trial: Counter[tuple[str, str]],
        placements: _Placements,
    ) -> tuple[str | None, list[str], dict[str, str]]:
        template_spec = (pod_set.get("template") or {}).get("spec") or {}
        label_keys = {
            key
            for entry in group.get("flavors") or ()
            for key in ((self.get(FLAVORS, "", entry["name"]) or {}).get("spec") or {}).get(
                "nodeLabels", {}
            )
        }
        reasons: list[str] = []
        for entry in group.get("flavors") or ():
            flavor = self.get(FLAVORS, "", entry["name"]) or {"spec": {}}
            problem = _flavor_mismatch(entry["name"], flavor, template_spec, label_keys)
            if problem:
                reasons.append(problem)
                continue
            misses = [
                why
                for resource, amount in wanted.items()
                if (
                    why := ledger.check(
                        cq_name, entry["name"], resource, amount + trial[(entry["name"], resource)]
                    )
                )
            ]
            if misses:
                reasons.extend(misses)
                continue
            domain, why = placements.find(pod_set, flavor, per_pod, count)
            if why:
                reasons.append(why)
                continue
            return entry["name"], [], domain
        return None, reasons, {}

    def _pending(self, workload: Obj, reason: str, message: str) -> None:
        current = condition(workload, "QuotaReserved")
        if current is not None and (
            current.get("status"),
            current.get("reason"),
            current.get("message"),
        ) == (
            "False",
            reason,
            message,
        ):
            return

        def pending(w: Obj) -> None:
            set_condition(w.setdefault("status", {}), "QuotaReserved", "False", reason, message)

        self.mutate(WORKLOADS, workload, pending, status=True)

    def _admit(self, workload: Obj, cq_name: str, assignments: list[Obj]) -> None:
        def admitted(w: Obj) -> None:
            status = w.setdefault("status", {})
            status["admission"] = {"clusterQueue": cq_name, "podSetAssignments": assignments}
            set_condition(
                status,
                "QuotaReserved",
                "True",
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {cq_name}",
            )
            set_condition(status, "Admitted", "True", "Admitted", "The workload is admitted")
            if is_true(w, "Evicted"):
                set_condition(status, "Evicted", "False", "QuotaReserved", "Previously: evicted")
            if condition(w, "Requeued") is not None:
                set_condition(
                    status, "Requeued", "True", "QuotaReserved", "The workload was requeued"
                )

        updated = self.mutate(WORKLOADS, workload, admitted, status=True)
        self.events.emit(
            updated,
            "Workload",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}, wait time since queued was 0s",
        )
        self.events.emit(
            updated,
            "Workload",
            "Admitted",
            f"Admitted by ClusterQueue {cq_name}, wait time since reservation was 0s",
        )

    # -- queue statuses --------------------------------------------------------------------

    def _queue_statuses(self, cqs: dict[str, Obj], ledger: Ledger, workloads: list[Obj]) -> None:
        per_cq: dict[str, Counter[str]] = defaultdict(Counter)
        per_lq: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        lq_usage: dict[tuple[str, str], Counter[tuple[str, str]]] = defaultdict(Counter)
        lq_target = {
            (lq["metadata"]["namespace"], lq["metadata"]["name"]): (lq.get("spec") or {}).get(
                "clusterQueue", ""
            )
            for lq in self.items(LOCAL_QUEUES)
        }
        for workload in workloads:
            lq_key = (workload["metadata"]["namespace"], workload["spec"].get("queueName", ""))
            cq_name = lq_target.get(lq_key, "")
            if _reserving(workload):
                state = "admitted" if is_true(workload, "Admitted") else "reserving"
                cq_name = workload["status"]["admission"].get("clusterQueue", cq_name)
                for flavor, resource, amount in _usage(workload["status"]["admission"]):
                    lq_usage[lq_key][(flavor, resource)] += amount
                per_cq[cq_name]["reserving"] += 1
                per_lq[lq_key]["reserving"] += 1
                if state == "admitted":
                    per_cq[cq_name]["admitted"] += 1
                    per_lq[lq_key]["admitted"] += 1
            elif _pending(workload):
                per_cq[cq_name]["pending"] += 1
                per_lq[lq_key]["pending"] += 1
        for name, cq in cqs.items():
            self._write_cq_status(cq, per_cq[name], ledger)
        for lq in self.items(LOCAL_QUEUES):
            key = (lq["metadata"]["namespace"], lq["metadata"]["name"])
            self._write_lq_status(lq, per_lq[key], lq_usage[key], cqs)

    def _write_cq_status(self, cq: Obj, counts: Counter[str], ledger: Ledger) -> None:
        name = cq["metadata"]["name"]
        flavors = []
        for group in (cq.get("spec") or {}).get("resourceGroups") or ():
            for entry in group.get("flavors") or ():
                resources = []
                for resource in entry.get("resources") or ():
                    used = ledger.used[name][(entry["name"], resource["name"])]
                    nominal = ledger.quotas[name][(entry["name"], resource["name"])].nominal
                    resources.append(
                        {
                            "name": resource["name"],
                            "total": resource_quantity(resource["name"], used),
                            "borrowed": resource_quantity(resource["name"], max(0, used - nominal)),
                        }
                    )
                flavors.append({"name": entry["name"], "resources": resources})
        inactive = self._inactive_reason(cq)

        def status(obj: Obj) -> None:
            st = obj.setdefault("status", {})
            st.update(
                pendingWorkloads=counts["pending"],
                reservingWorkloads=counts["reserving"],
                admittedWorkloads=counts["admitted"],
                flavorsReservation=flavors,
                flavorsUsage=clone(flavors),
            )
            if inactive == "FlavorNotFound":
                missing = ", ".join(self._missing_flavors(cq))
                set_condition(
                    st,
                    "Active",
                    "False",
                    "FlavorNotFound",
                    "Can't admit new workloads: references missing ResourceFlavor(s): "
                    f"[{missing}].",
                )
            elif inactive == "Stopped":
                set_condition(
                    st, "Active", "False", "Stopped", "Can't admit new workloads: is stopped."
                )
            else:
                set_condition(st, "Active", "True", "Ready", "Can admit new workloads")

        self.mutate(CLUSTER_QUEUES, cq, status, status=True)

    def _write_lq_status(
        self, lq: Obj, counts: Counter[str], usage: Counter[tuple[str, str]], cqs: dict[str, Obj]
    ) -> None:
        flavors: dict[str, list[Obj]] = defaultdict(list)
        for (flavor, resource), amount in sorted(usage.items()):
            flavors[flavor].append({"name": resource, "total": resource_quantity(resource, amount)})
        listed = [{"name": flavor, "resources": resources} for flavor, resources in flavors.items()]
        cq_name = (lq.get("spec") or {}).get("clusterQueue", "")

        def status(obj: Obj) -> None:
            st = obj.setdefault("status", {})
            st.update(
                pendingWorkloads=counts["pending"],
                reservingWorkloads=counts["reserving"],
                admittedWorkloads=counts["admitted"],
                flavorsReservation=listed,
                flavorsUsage=clone(listed),
            )
            if cq_name in cqs:
                set_condition(
                    st, "Active", "True", "Ready", "Can submit new workloads to localQueue"
                )
            else:
                set_condition(
                    st,
                    "Active",
                    "False",
                    "ClusterQueueDoesNotExist",
                    "Can't submit new workloads to clusterQueue",
                )

        self.mutate(LOCAL_QUEUES, lq, status, status=True)


def _template(template: Obj) -> Obj:
    """A pod template as a Workload pod set keeps it (labels, annotations and spec).

    Kueue decodes the job into Go types (quantities canonical) and, in
    ``workload.AdjustResources``, requests what a container limits but does not request.
    """
    metadata = template.get("metadata") or {}
    kept = {k: clone(metadata[k]) for k in ("labels", "annotations") if metadata.get(k)}
    spec = clone(template.get("spec") or {})
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        for key in ("limits", "requests"):
            if key in resources:
                resources[key] = canonical_list(resources[key])
        if resources.get("limits"):
            resources["requests"] = {**resources["limits"], **(resources.get("requests") or {})}
    return {"metadata": kept, "spec": spec}


def _reserving(workload: Obj) -> bool:
    return (
        is_true(workload, "QuotaReserved")
        and not is_true(workload, "Finished")
        and bool((workload.get("status") or {}).get("admission"))
    )


def _pending(workload: Obj) -> bool:
    return (
        workload["spec"].get("active", True) is not False
        and not is_true(workload, "QuotaReserved")
        and not is_true(workload, "Finished")
        and not workload["metadata"].get("deletionTimestamp")
    )


def _usage(admission: Obj) -> list[tuple[str, str, int]]:
    usage = []
    for assignment in admission.get("podSetAssignments") or ():
        flavors = assignment.get("flavors") or {}
        for resource, amount in (assignment.get("resourceUsage") or {}).items():
            if resource in flavors:
                usage.append((flavors[resource], resource, _amount(resource, amount)))
    return usage


def _flavor_mismatch(name: str, flavor: Obj, spec: Obj, label_keys: set[str]) -> str:
    flavor_spec = flavor.get("spec") or {}
    tolerations = (spec.get("tolerations") or []) + (flavor_spec.get("tolerations") or [])
    for taint in flavor_spec.get("nodeTaints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            value = taint.get("value", "")
            shown = f"{taint.get('key')}{'=' + value if value else ''}:{taint.get('effect')}"
            return f"untolerated taint {{{shown}}} in flavor {name}"
    selector = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if k in label_keys}
    restricted: Obj = {"nodeSelector": selector}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        terms = []
        for term in affinity.get("nodeSelectorTerms") or ():
            expressions = [
                e for e in term.get("matchExpressions") or () if e.get("key") in label_keys
            ]
            terms.append({"matchExpressions": expressions})
        restricted["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    fake_node = {"metadata": {"name": "", "labels": flavor_spec.get("nodeLabels") or {}}}
    if not matches_node(restricted, fake_node):
        return f"flavor {name} doesn't match node affinity"
    return ""


class _Placements:
    """Free node capacity for topology-constrained pod sets within one cycle."""

    def __init__(self, controller: KueueController) -> None:
        self.controller = controller
        self._free: dict[str, Counter[str]] | None = None

    def _capacity(self) -> dict[str, Counter[str]]:
        if self._free is None:
            free: dict[str, Counter[str]] = {}
            for node in self.controller.items("nodes"):
                if not node_ready(node) or (node.get("spec") or {}).get("unschedulable"):
                    continue
                allocatable = (node.get("status") or {}).get("allocatable") or {}
                free[node["metadata"]["name"]] = Counter(
                    pod_requests({"containers": [{"resources": {"requests": allocatable}}]})
                )
            for pod in self.controller.items("pods"):
                node_name = (pod.get("spec") or {}).get("nodeName")
                if node_name in free and (pod.get("status") or {}).get("phase") not in (
                    "Succeeded",
                    "Failed",
                ):
                    free[node_name].subtract(pod_requests(pod["spec"]))
            self._free = free
        return self._free

    def find(
        self, pod_set: Obj, flavor: Obj, per_pod: dict[str, int], count: int
    ) -> tuple[dict[str, str], str]:
        annotations = ((pod_set.get("template") or {}).get("metadata") or {}).get(
            "annotations"
        ) or {}
        level = annotations.get(REQUIRED_TOPOLOGY) or annotations.get(PREFERRED_TOPOLOGY)
        if not level:
            return {}, ""
        required = REQUIRED_TOPOLOGY in annotations
        template_spec = (pod_set.get("template") or {}).get("spec") or {}
        flavor_labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
        domains: dict[str, list[str]] = defaultdict(list)
        for node in self.controller.items("nodes"):
            labels = node["metadata"].get("labels") or {}
            if level not in labels or any(labels.get(k) != v for k, v in flavor_labels.items()):
                continue
            if node["metadata"]["name"] in self._capacity() and matches_node(template_spec, node):
                domains[labels[level]].append(node["metadata"]["name"])
        best: tuple[int, str] | None = None
        for value, nodes in domains.items():
            fits = sum(self._fits(self._capacity()[n], per_pod) for n in nodes)
            if fits >= count and (best is None or fits < best[0]):
                best = (fits, value)
        if best is None:
            if not required:
                return {}, ""
            name = flavor.get("metadata", {}).get("name", "")
            return (
                {},
                f'topology "{level}" doesn\'t allow to fit any of {count} pod(s) in flavor {name}',
            )
        self._reserve(domains[best[1]], per_pod, count)
        return {level: best[1]}, ""

    @staticmethod
    def _fits(free: Counter[str], per_pod: dict[str, int]) -> int:
        counts = [free.get(r, 0) // a for r, a in per_pod.items() if a > 0]
        return max(0, min(counts)) if counts else 10**6

    def _reserve(self, nodes: list[str], per_pod: dict[str, int], count: int) -> None:
        left = count
        for name in nodes:
            free = self._capacity()[name]
            take = min(left, self._fits(free, per_pod))
            for resource, amount in per_pod.items():
                free[resource] -= amount * take
            left -= take
            if left <= 0:
                return
