"""KubeRay's RayCluster and RayJob controllers (ray-project/kuberay,
``ray-operator/controllers/ray/raycluster_controller.go`` and
``rayjob_controller.go``); what is modelled and what is not: docs/kubesim-serving.md.

A RayCluster runs a head pod ``<cluster>-head-<random>`` and, per worker group,
``replicas * numOfHosts`` pods ``<cluster>-<group>-worker-<random>``; pods that end are
replaced; ``state`` becomes ``ready`` once every pod runs and is ready (and stays so),
``suspended`` once a suspended cluster's pods are gone.

A RayJob (``K8sJobMode``) goes ``New`` → ``Initializing`` (its RayCluster
``<job>-<random>`` is created) → ``Running`` once the cluster is ready and the submitter
Job ``<job>`` is created → ``Complete`` or ``Failed`` when the submitter ends, with
``jobStatus`` ``PENDING`` → ``RUNNING`` → ``SUCCEEDED`` / ``FAILED`` as the Ray
dashboard would report it; with ``shutdownAfterJobFinishes`` its cluster is deleted
``ttlSecondsAfterFinished`` later. ``suspend`` goes ``Suspending`` (cluster and
submitter deleted) → ``Suspended``, and back to ``New`` when lifted.

The Ray nodes of a RayJob's cluster serve until the cluster is deleted: their pods
carry an empty ``quartermaster.dev/sim-duration`` (run until deleted) whatever their
template says, so a job's run time is its submitter's.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Hashable, Iterable
from datetime import UTC, datetime
from typing import Any, cast

from sim.kubesim.api import now_rfc3339
from sim.kubesim.controllers.apps import live, owned, ready
from sim.kubesim.controllers.base import (
    Reconciler,
    condition,
    controller_of,
    is_true,
    owner_reference,
    pod_requests,
    set_condition,
)
from sim.kubesim.controllers.jobs import pod_phase
from sim.kubesim.controllers.nodes import DURATION_ANNOTATION, EXIT_ANNOTATION
from sim.kubesim.store import Event, clone

__all__ = ["RayClusterController", "RayJobController"]

Obj = dict[str, Any]
RAYCLUSTERS = "rayclusters.ray.io"
RAYJOBS = "rayjobs.ray.io"
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
ORIGIN_KIND_LABEL = "ray.io/originated-from-crd"
ORIGIN_NAME_LABEL = "ray.io/originated-from-cr-name"
_ALPHABET = string.ascii_lowercase + string.digits
DASHBOARD_PORT = 8265


def _random(length: int = 5) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def _owner_key(event: Event, kind: str) -> Iterable[Hashable]:
    owner = controller_of(event.obj) or (controller_of(event.prev) if event.prev else None)
    if owner and owner.get("kind") == kind and owner.get("apiVersion", "").startswith("ray.io/"):
        yield (event.key[0], owner.get("name", ""))


def worker_count(group: Obj) -> int:
    """A worker group's pods: ``replicas`` (within min and max) times ``numOfHosts``."""
    replicas = int(group.get("replicas", group.get("minReplicas", 0)) or 0)
    replicas = max(replicas, int(group.get("minReplicas", 0) or 0))
    if group.get("maxReplicas") is not None:
        replicas = min(replicas, int(group["maxReplicas"]))
    return replicas * int(group.get("numOfHosts", 1) or 1)


class RayClusterController(Reconciler):
    name = "kuberay-operator"
    manager = "ray-operator"

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == RAYCLUSTERS:
            yield event.key
        elif resource_key == "pods":
            yield from _owner_key(event, "RayCluster")

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        cluster = self.get(RAYCLUSTERS, namespace, name)
        if cluster is None or cluster["metadata"].get("deletionTimestamp"):
            return
        spec = cluster.get("spec") or {}
        pods = owned(self, "pods", cluster)
        for pod in pods:  # a Ray node that ended is deleted, then created again
            if pod_phase(pod) in ("Succeeded", "Failed") and not pod["metadata"].get(
                "deletionTimestamp"
            ):
                self.delete("pods", pod)
        pods = [pod for pod in pods if live(pod)]
        if spec.get("suspend"):
            for pod in pods:
                self.delete("pods", pod)
            pods = []
        else:
            pods += self._scale(cluster, pods)
        self._status(cluster, pods)

    def _scale(self, cluster: Obj, pods: list[Obj]) -> list[Obj]:
        spec = cluster.get("spec") or {}
        created = []
        heads = [p for p in pods if _labels(p).get(NODE_TYPE_LABEL) == "head"]
        if not heads:
            head = (spec.get("headGroupSpec") or {}).get("template") or {}
            created.append(self._create_pod(cluster, head, "head", "headgroup"))
        for group in spec.get("workerGroupSpecs") or ():
            if group.get("suspend"):
                continue
            group_name = group.get("groupName", "")
            have = [
                p
                for p in pods
                if _labels(p).get(NODE_TYPE_LABEL) == "worker"
                and _labels(p).get(GROUP_LABEL) == group_name
            ]
            wanted = worker_count(group)
            for _ in range(wanted - len(have)):
                created.append(
                    self._create_pod(cluster, group.get("template") or {}, "worker", group_name)
                )
            for pod in have[wanted:]:
                self.delete("pods", pod)
        return created

    def _create_pod(self, cluster: Obj, template: Obj, node_type: str, group: str) -> Obj:
        name = cluster["metadata"]["name"]
        metadata = template.get("metadata") or {}
        prefix = f"{name}-head-" if node_type == "head" else f"{name}-{group}-worker-"
        labels = {
            **(metadata.get("labels") or {}),
            CLUSTER_LABEL: name,
            NODE_TYPE_LABEL: node_type,
            GROUP_LABEL: group,
            "ray.io/is-ray-node": "yes",
            "ray.io/identifier": f"{name}-{node_type}",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
        annotations = dict(metadata.get("annotations") or {})
        if _of_ray_job(cluster):
            annotations.pop(EXIT_ANNOTATION, None)
            annotations[DURATION_ANNOTATION] = ""  # a Ray node serves until deleted
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": prefix,
                "namespace": cluster["metadata"]["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner_reference(cluster)],
            },
            "spec": clone(template.get("spec") or {}),
        }
        if metadata.get("finalizers"):
            pod["metadata"]["finalizers"] = list(metadata["finalizers"])
        pod["spec"].setdefault("restartPolicy", "Always")
        created = self.create("pods", pod)
        self.events.emit(
            cluster,
            "RayCluster",
            "CreatedHeadPod" if node_type == "head" else "CreatedWorkerPod",
            f"Created {node_type} Pod {created['metadata']['namespace']}/"
            f"{created['metadata']['name']}",
        )
        return created

    def _status(self, cluster: Obj, pods: list[Obj]) -> None:
        spec = cluster.get("spec") or {}
        groups = spec.get("workerGroupSpecs") or ()
        workers = [p for p in pods if _labels(p).get(NODE_TYPE_LABEL) == "worker"]
        head = next((p for p in pods if _labels(p).get(NODE_TYPE_LABEL) == "head"), None)
        status = clone(cluster.get("status") or {})
        desired = sum(worker_count(g) for g in groups if not g.get("suspend"))
        ready_workers = sum(1 for p in workers if ready(p))
        status.update(
            desiredWorkerReplicas=desired,
            minWorkerReplicas=sum(
                int(g.get("minReplicas", 0) or 0) * int(g.get("numOfHosts", 1) or 1) for g in groups
            ),
            maxWorkerReplicas=sum(
                int(g.get("maxReplicas", 0) or 0) * int(g.get("numOfHosts", 1) or 1) for g in groups
            ),
            readyWorkerReplicas=ready_workers,
            availableWorkerReplicas=sum(1 for p in workers if pod_phase(p) == "Running"),
            observedGeneration=cluster["metadata"].get("generation", 1),
        )
        status.update(_desired_resources(spec))
        if head is not None:
            pod_status = head.get("status") or {}
            status["head"] = {
                k: v
                for k, v in (
                    ("podName", head["metadata"]["name"]),
                    ("podIP", pod_status.get("podIP")),
                    ("serviceName", f"{cluster['metadata']['name']}-head-svc"),
                )
                if v
            }
        head_ready = head is not None and ready(head)
        set_condition(
            status,
            "HeadPodReady",
            "True" if head_ready else "False",
            "HeadPodRunningAndReady" if head_ready else "HeadPodNotFound",
            "" if head_ready else "Head Pod is not running and ready",
        )
        all_ready = head_ready and len(workers) == desired and ready_workers == desired
        if spec.get("suspend") and not pods:
            status["state"] = "suspended"
            status.pop("head", None)
        elif all_ready:
            status["state"] = "ready"
        if all_ready and condition(cluster, "RayClusterProvisioned") is None:
            set_condition(
                status,
                "RayClusterProvisioned",
                "True",
                "AllPodRunningAndReadyFirstTime",
                "All Ray Pods are ready for the first time",
            )
        if status.get("state") != (cluster.get("status") or {}).get("state"):
            times = status.setdefault("stateTransitionTimes", {})
            times[status["state"]] = now_rfc3339()
        status["lastUpdateTime"] = now_rfc3339()
        if status == {**(cluster.get("status") or {}), "lastUpdateTime": status["lastUpdateTime"]}:
            return  # nothing but the clock moved
        self.mutate(RAYCLUSTERS, cluster, lambda c: c.__setitem__("status", status), status=True)


def _desired_resources(spec: Obj) -> Obj:
    """``desiredCPU`` / ``desiredMemory`` / ``desiredGPU``: every pod's requests summed."""
    totals: dict[str, int] = {}
    templates = [((spec.get("headGroupSpec") or {}).get("template") or {}, 1)]
    templates += [
        (group.get("template") or {}, worker_count(group))
        for group in spec.get("workerGroupSpecs") or ()
        if not group.get("suspend")
    ]
    for template, count in templates:
        for resource, amount in pod_requests(template.get("spec") or {}).items():
            totals[resource] = totals.get(resource, 0) + amount * count
    cpu = totals.get("cpu", 0)
    return {
        "desiredCPU": f"{cpu // 1000}" if cpu % 1000 == 0 else f"{cpu}m",
        "desiredMemory": str(totals.get("memory", 0)),
        "desiredGPU": str(totals.get("nvidia.com/gpu", 0)),
        "desiredTPU": str(totals.get("google.com/tpu", 0)),
    }


def _labels(obj: Obj) -> dict[str, str]:
    return cast(dict[str, str], obj["metadata"].get("labels") or {})


def _of_ray_job(cluster: Obj) -> bool:
    return (controller_of(cluster) or {}).get("kind") == "RayJob"


def _elapsed(since: str | None) -> float:
    if not since:
        return 0.0
    then = datetime.fromisoformat(since.replace("Z", "+00:00"))
    return (datetime.now(UTC) - then).total_seconds()


class RayJobController(Reconciler):
    name = "kuberay-operator-rayjob"
    manager = "ray-operator"

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == RAYJOBS:
            yield event.key
        elif resource_key in (RAYCLUSTERS, "jobs.batch"):
            yield from _owner_key(event, "RayJob")

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        job = self.get(RAYJOBS, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        status = clone(job.get("status") or {})
        phase = status.get("jobDeploymentStatus") or "New"
        step = {
            "New": self._new,
            "Initializing": self._initializing,
            "Running": self._running,
            "Suspending": self._suspending,
            "Suspended": self._suspended,
            "Complete": self._finished,
            "Failed": self._finished,
        }.get(phase)
        if step is None:
            return
        step(job, status)
        status["observedGeneration"] = job["metadata"].get("generation", 1)
        self.mutate(RAYJOBS, job, lambda j: j.__setitem__("status", status), status=True)

    # -- the states ------------------------------------------------------------------------

    def _new(self, job: Obj, status: Obj) -> None:
        """``initRayJobStatusIfNeed``: the job id and cluster name fixed before anything
        is created, so that no retry submits twice or makes a second cluster."""
        name = job["metadata"]["name"]
        spec = job.get("spec") or {}
        status.update(
            jobDeploymentStatus="Initializing",
            jobId=spec.get("jobId") or f"{name}-{_random(8)}",
            rayClusterName=status.get("rayClusterName") or f"{name}-{_random()}",
            startTime=now_rfc3339(),
            jobStatus="",
        )

    def _initializing(self, job: Obj, status: Obj) -> None:
        spec = job.get("spec") or {}
        if spec.get("suspend"):
            status["jobDeploymentStatus"] = "Suspending"
            self.enqueue(_key(job))
            return
        cluster = self._cluster(job, status)
        if (cluster.get("status") or {}).get("state") != "ready":
            return
        namespace = job["metadata"]["namespace"]
        status["dashboardURL"] = (
            f"{cluster['metadata']['name']}-head-svc.{namespace}.svc.cluster.local:{DASHBOARD_PORT}"
        )
        if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
            self._submitter(job, status)
        status["jobDeploymentStatus"] = "Running"
        status["jobStatus"] = "PENDING"
        status["rayClusterStatus"] = clone(cluster.get("status") or {})

    def _running(self, job: Obj, status: Obj) -> None:
        spec = job.get("spec") or {}
        if spec.get("suspend"):
            status["jobDeploymentStatus"] = "Suspending"
            self.enqueue(_key(job))
            return
        cluster = self.get(RAYCLUSTERS, job["metadata"]["namespace"], status["rayClusterName"])
        if cluster is not None:
            status["rayClusterStatus"] = clone(cluster.get("status") or {})
        submitter = self.get("jobs.batch", job["metadata"]["namespace"], job["metadata"]["name"])
        if submitter is None:
            return
        if is_true(submitter, "Complete"):
            self._end(job, status, "SUCCEEDED", "Complete", "")
        elif is_true(submitter, "Failed"):
            self._end(job, status, "FAILED", "Failed", "AppFailed")
        elif (submitter.get("status") or {}).get("active"):
            status["jobStatus"] = "RUNNING" if _submitter_running(self, submitter) else "PENDING"

    def _end(self, job: Obj, status: Obj, outcome: str, phase: str, reason: str) -> None:
        status.update(jobStatus=outcome, jobDeploymentStatus=phase, endTime=now_rfc3339())
        status["succeeded" if outcome == "SUCCEEDED" else "failed"] = 1
        if reason:
            status["reason"] = reason
            status["message"] = "Job entrypoint command failed"
        else:
            status["message"] = "Job finished successfully."
        self.enqueue(_key(job))

    def _finished(self, job: Obj, status: Obj) -> None:
        """``shutdownAfterJobFinishes``: the cluster goes ``ttlSecondsAfterFinished`` after."""
        spec = job.get("spec") or {}
        if not spec.get("shutdownAfterJobFinishes") or not status.get("rayClusterName"):
            return
        wait = self.scaled(float(spec.get("ttlSecondsAfterFinished", 0) or 0))
        left = wait - _elapsed(status.get("endTime"))
        if left > 0:
            self.enqueue_after(_key(job), left)
            return
        cluster = self.get(RAYCLUSTERS, job["metadata"]["namespace"], status["rayClusterName"])
        if cluster is not None:
            self.delete(RAYCLUSTERS, cluster)
            self.events.emit(
                job,
                "RayJob",
                "DeletedRayCluster",
                f"Deleted RayCluster {job['metadata']['namespace']}/{status['rayClusterName']}",
            )

    def _suspending(self, job: Obj, status: Obj) -> None:
        """Delete the cluster and the submitter, and only then say ``Suspended``."""
        namespace = job["metadata"]["namespace"]
        cluster = self.get(RAYCLUSTERS, namespace, status.get("rayClusterName") or "")
        submitter = self.get("jobs.batch", namespace, job["metadata"]["name"])
        for key, obj in ((RAYCLUSTERS, cluster), ("jobs.batch", submitter)):
            if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                self.delete(key, obj, propagation="Background")
        if cluster is not None or submitter is not None:
            return
        for field in ("rayClusterStatus", "dashboardURL", "jobId", "message", "reason"):
            status.pop(field, None)
        status.update(rayClusterName="", jobStatus="", jobDeploymentStatus="Suspended")

    def _suspended(self, job: Obj, status: Obj) -> None:
        if not (job.get("spec") or {}).get("suspend"):
            status.update(jobStatus="", jobDeploymentStatus="New")
            self.enqueue(_key(job))

    # -- what a RayJob creates -------------------------------------------------------------

    def _cluster(self, job: Obj, status: Obj) -> Obj:
        namespace = job["metadata"]["namespace"]
        existing = self.get(RAYCLUSTERS, namespace, status["rayClusterName"])
        if existing is not None:
            return existing
        spec = job.get("spec") or {}
        labels = {
            **(job["metadata"].get("labels") or {}),
            ORIGIN_KIND_LABEL: "RayJob",
            ORIGIN_NAME_LABEL: job["metadata"]["name"],
        }
        cluster: Obj = {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {
                "name": status["rayClusterName"],
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [owner_reference(job)],
            },
            "spec": clone(spec.get("rayClusterSpec") or {}),
        }
        created = self.create(RAYCLUSTERS, cluster)
        self.events.emit(
            job,
            "RayJob",
            "CreatedRayCluster",
            f"Created RayCluster {namespace}/{cluster_name(created)}",
        )
        return created

    def _submitter(self, job: Obj, status: Obj) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if self.get("jobs.batch", namespace, name) is not None:
            return
        spec = job.get("spec") or {}
        template = clone(spec.get("submitterPodTemplate") or {})
        template.setdefault("spec", {}).setdefault("restartPolicy", "Never")
        meta = template.setdefault("metadata", {})
        meta["labels"] = {
            **(meta.get("labels") or {}),
            ORIGIN_KIND_LABEL: "RayJob",
            ORIGIN_NAME_LABEL: name,
        }
        submitter: Obj = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {ORIGIN_KIND_LABEL: "RayJob", ORIGIN_NAME_LABEL: name},
                "ownerReferences": [owner_reference(job)],
            },
            "spec": {
                "backoffLimit": int((spec.get("submitterConfig") or {}).get("backoffLimit", 2)),
                "template": template,
            },
        }
        self.create("jobs.batch", submitter)
        self.events.emit(
            job, "RayJob", "CreatedSubmitterJob", f"Created Kubernetes Job {namespace}/{name}"
        )


def cluster_name(cluster: Obj) -> str:
    return str(cluster["metadata"]["name"])


def _key(job: Obj) -> tuple[str, str]:
    return (job["metadata"]["namespace"], job["metadata"]["name"])


def _submitter_running(controller: Reconciler, submitter: Obj) -> bool:
    return any(pod_phase(pod) == "Running" for pod in owned(controller, "pods", submitter))
