"""PyTorchJob and MPIJob (Kubeflow's training operator): pods created directly,
one per replica; a job succeeds when its Master / Launcher does (or all its
pods, without one)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.api import now_rfc3339
from sim.kubesim.controllers.base import (
    Reconciler,
    condition,
    controller_of,
    is_true,
    owner_reference,
    set_condition,
)
from sim.kubesim.controllers.jobs import pod_phase
from sim.kubesim.store import Event, clone

Obj = dict[str, Any]


class ReplicaJobController(Reconciler):
    """PyTorchJob (``kubeflow.org/v1``) and MPIJob (``kubeflow.org/v2beta1``): pods per replica."""

    manager = "training-operator"
    resource_key = ""
    specs_field = ""
    leader = ""
    kind = ""

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == self.resource_key:
            yield event.key
        elif resource_key == "pods":
            owner = controller_of(event.obj)
            if owner and owner.get("kind") == self.kind:
                yield (event.key[0], owner.get("name", ""))

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        job = self.get(self.resource_key, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        spec = job.get("spec") or {}
        suspended = bool((spec.get("runPolicy") or {}).get("suspend"))
        pods = {
            pod["metadata"]["name"]: pod
            for pod in self.items("pods", namespace)
            if (controller_of(pod) or {}).get("uid") == job["metadata"]["uid"]
        }
        status = clone(job.get("status") or {})
        finished = is_true(job, "Succeeded") or is_true(job, "Failed")
        if suspended or finished:
            for pod in pods.values():
                if pod_phase(pod) not in ("Succeeded", "Failed"):
                    self.delete("pods", pod)
            if suspended and not finished:
                set_condition(
                    status,
                    "Suspended",
                    "True",
                    f"{self.kind}Suspended",
                    f"{self.kind} {name} is suspended.",
                )
                set_condition(
                    status,
                    "Running",
                    "False",
                    f"{self.kind}Suspended",
                    f"{self.kind} {name} is suspended.",
                )
            self._write(job, status)
            return
        if is_true(job, "Suspended"):
            set_condition(
                status,
                "Suspended",
                "False",
                f"{self.kind}Resumed",
                f"{self.kind} {name} is resumed.",
            )
        status.setdefault("startTime", now_rfc3339())
        if condition(job, "Created") is None:
            set_condition(
                status,
                "Created",
                "True",
                f"{self.kind}Created",
                f"{self.kind} {namespace}/{name} is created.",
            )
        replica_status: dict[str, Obj] = {}
        for replica_type, replica in (spec.get(self.specs_field) or {}).items():
            counts = {"active": 0, "succeeded": 0, "failed": 0}
            for index in range(int(replica.get("replicas", 1))):
                pod_name = self._pod_name(name, replica_type, index)
                pod = pods.get(pod_name) or self._create_pod(
                    job, replica_type, replica, index, pod_name
                )
                phase = pod_phase(pod)
                counts[
                    "succeeded"
                    if phase == "Succeeded"
                    else "failed"
                    if phase == "Failed"
                    else "active"
                ] += 1
            replica_status[replica_type] = counts
        status["replicaStatuses"] = replica_status
        self._conditions(job, status, replica_status)
        self._write(job, status)

    def _pod_name(self, name: str, replica_type: str, index: int) -> str:
        if replica_type == "Launcher":
            return f"{name}-launcher"
        return f"{name}-{replica_type.lower()}-{index}"

    def _create_pod(
        self, job: Obj, replica_type: str, replica: Obj, index: int, pod_name: str
    ) -> Obj:
        template = clone(replica.get("template") or {})
        metadata = template.get("metadata") or {}
        labels = {
            **(metadata.get("labels") or {}),
            "training.kubeflow.org/job-name": job["metadata"]["name"],
            "training.kubeflow.org/operator-name": self.kind.lower().replace(
                "job", "job-controller"
            ),
            "training.kubeflow.org/replica-type": replica_type.lower(),
            "training.kubeflow.org/replica-index": str(index),
        }
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "annotations": dict(metadata.get("annotations") or {}),
                "ownerReferences": [owner_reference(job)],
            },
            "spec": template.get("spec") or {},
        }
        if metadata.get("finalizers"):  # copied from the template, as GetPodFromTemplate does
            pod["metadata"]["finalizers"] = list(metadata["finalizers"])
        pod["spec"].setdefault("restartPolicy", replica.get("restartPolicy", "Never"))
        if pod["spec"]["restartPolicy"] == "ExitCode":
            pod["spec"]["restartPolicy"] = "Never"
        return self.create("pods", pod)

    def _conditions(self, job: Obj, status: Obj, replicas: dict[str, Obj]) -> None:
        name = job["metadata"]["name"]
        now = now_rfc3339()
        if any(c["failed"] for c in replicas.values()):
            set_condition(
                status, "Running", "False", f"{self.kind}Failed", f"{self.kind} {name} is failed."
            )
            set_condition(
                status,
                "Failed",
                "True",
                f"{self.kind}Failed",
                f"{self.kind} {name} is failed because a replica failed.",
            )
            status["completionTime"] = now
            return
        deciding = {self.leader: replicas[self.leader]} if self.leader in replicas else replicas
        if deciding and all(c["succeeded"] and not c["active"] for c in deciding.values()):
            set_condition(
                status,
                "Running",
                "False",
                f"{self.kind}Succeeded",
                f"{self.kind} {name} is successfully completed.",
            )
            set_condition(
                status,
                "Succeeded",
                "True",
                f"{self.kind}Succeeded",
                f"{self.kind} {name} is successfully completed.",
            )
            status["completionTime"] = now
            return
        set_condition(
            status, "Running", "True", f"{self.kind}Running", f"{self.kind} {name} is running."
        )

    def _write(self, job: Obj, status: Obj) -> None:
        self.mutate(self.resource_key, job, lambda j: j.__setitem__("status", status), status=True)


class PyTorchJobController(ReplicaJobController):
    name = "pytorchjob-controller"
    resource_key = "pytorchjobs.kubeflow.org"
    specs_field = "pytorchReplicaSpecs"
    leader = "Master"
    kind = "PyTorchJob"


class MPIJobController(ReplicaJobController):
    name = "mpijob-controller"
    resource_key = "mpijobs.kubeflow.org"
    specs_field = "mpiReplicaSpecs"
    leader = "Launcher"
    kind = "MPIJob"
