"""Kueue's job framework: which kinds are jobs, how a queued job is suspended, becomes a
Workload, starts on its flavors' nodes, reports its pods ready and finishes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.kubesim.api import Context, Resource
from sim.kubesim.controllers.base import (
    condition,
    controller_of,
    is_true,
    owner_reference,
    set_condition,
)
from sim.kubesim.controllers.kueue.reconciler import KueueReconciler
from sim.kubesim.controllers.kueue.workload import (
    FLAVORS,
    JOB_UID_LABEL,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    RESOURCE_IN_USE,
    WORKLOADS,
    pod_set_template,
    workload_name,
)
from sim.kubesim.store import clone

__all__ = ["JOB_KINDS", "JobKind", "JobReconciler", "managed_by_parent", "suspend_queued_jobs"]

Obj = dict[str, Any]


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
        if self.key == RAYJOBS:
            sets = _ray_podsets(spec.setdefault("rayClusterSpec", {}))
            if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
                sets.append(("submitter", 1, spec.setdefault("submitterPodTemplate", {})))
            return sets
        if self.key == RAYCLUSTERS:
            return _ray_podsets(spec)
        return [
            (
                replica_type.lower(),
                int(replica.get("replicas", 1)),
                replica.setdefault("template", {}),
            )
            for replica_type, replica in (spec.get(self.specs_field) or {}).items()
        ]

    def finished(self, job: Obj) -> tuple[bool, bool, str]:
        if self.key == RAYJOBS:  # rayjob_controller.go Finished
            status = job.get("status") or {}
            done = status.get("jobDeploymentStatus") in ("Complete", "Failed")
            succeeded = status.get("jobStatus") != "FAILED"
            return done, done and succeeded, status.get("message") or ""
        if self.key == RAYCLUSTERS:  # a RayCluster never finishes on its own
            return False, False, ""
        success = {"jobs.batch": "Complete", "jobsets.jobset.x-k8s.io": "Completed"}.get(
            self.key, "Succeeded"
        )
        if is_true(job, success):
            return True, True, "Job finished successfully"
        failed = condition(job, "Failed")
        if failed is not None and failed.get("status") == "True":
            return True, False, failed.get("message") or "Job failed"
        return False, False, ""


RAYJOBS = "rayjobs.ray.io"
RAYCLUSTERS = "rayclusters.ray.io"


def _ray_podsets(cluster: Obj) -> list[tuple[str, int, Obj]]:
    """``head`` (1) and one pod set per worker group (``raycluster.BuildPodSets``)."""
    head = cluster.setdefault("headGroupSpec", {})
    sets = [("head", 1, head.setdefault("template", {}))]
    for group in cluster.get("workerGroupSpecs") or ():
        count = int(group.get("replicas", 1)) * int(group.get("numOfHosts", 1) or 1)
        sets.append((str(group.get("groupName", "")), count, group.setdefault("template", {})))
    return sets


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
        JobKind(RAYJOBS, "RayJob", ("spec", "suspend")),
        JobKind(RAYCLUSTERS, "RayCluster", ("spec", "suspend")),
    )
}
_MANAGED_KINDS = {kind.kind for kind in JOB_KINDS.values()}


def managed_by_parent(job: Obj) -> bool:
    owner = controller_of(job)
    return owner is not None and owner.get("kind") in _MANAGED_KINDS


def suspend_queued_jobs(
    operation: str, resource: Resource, obj: Obj, old: Obj | None, ctx: Context
) -> None:
    """Kueue's mutating webhook: a queued job starts suspended."""
    kind = JOB_KINDS.get(resource.rtype.key)
    if kind is None or operation != "CREATE":
        return
    if (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL) and not managed_by_parent(obj):
        kind.set_suspend(obj, True)


class JobReconciler(KueueReconciler):
    """Jobs of the kinds in :data:`JOB_KINDS`, kept in step with their Workloads."""

    def _reconcile_job(self, kind_key: str, namespace: str, name: str) -> None:
        kind = JOB_KINDS[kind_key]
        job = self.get(kind_key, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if not queue or managed_by_parent(job):
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
            pod_sets.append({"name": name, "count": count, "template": pod_set_template(template)})
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
        if kind.key in (RAYJOBS, RAYCLUSTERS):  # PodsReady: the cluster's state is ready
            cluster = status.get("rayClusterStatus") if kind.key == RAYJOBS else status
            wanted = sum(count for _, count, _ in kind.podsets(clone(job)))
            return wanted if (cluster or {}).get("state") == "ready" else 0
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
