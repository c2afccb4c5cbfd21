"""The Volcano Job controller (``batch.volcano.sh/v1alpha1`` Job, "vcjob").

As Volcano's ``pkg/controllers/job``: a Job gets one PodGroup named
``<job>-<job uid>`` (``minMember`` = ``minAvailable``, ``minResources`` the first
``minAvailable`` pods' requests, its queue, priority class and network
topology) and, once that group has left ``Pending``, pods
``<job>-<task>-<index>`` carrying the group annotation and Volcano's
``volcano.sh/*`` labels. ``status.state.phase`` goes ``Pending`` → ``Running``
(``minAvailable`` pods running or ended) → ``Completed`` (every pod ended and
at least ``minSuccess``, default ``minAvailable``, succeeded) or ``Failed``.
The admission webhook's defaults and refusals come first
(:meth:`VolcanoJobController.admit`). Not simulated: lifecycle policies,
``maxRetry`` restarts, job plugins, ``dependsOn``, volumes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.api import Context, Resource, now_rfc3339
from sim.kubesim.controllers.base import Reconciler, controller_of, owner_reference, pod_requests
from sim.kubesim.controllers.volcano.podgroup import (
    GROUP_ANNOTATION,
    PODGROUPS,
    QUEUES,
    SCHEDULER_NAME,
    VCJOBS,
    add,
)
from sim.kubesim.errors import ApiError
from sim.kubesim.quantity import resource_quantity
from sim.kubesim.store import DELETED, Event, clone

__all__ = ["VolcanoJobController", "podgroup_name"]

Obj = dict[str, Any]
API_VERSION = "batch.volcano.sh/v1alpha1"
_ENDED = ("Succeeded", "Failed")
_FINAL = ("Completed", "Failed")


def podgroup_name(job: Obj) -> str:
    """Volcano's name for a Job's PodGroup: ``<job name>-<job uid>``."""
    return f"{job['metadata']['name']}-{job['metadata']['uid']}"


def _tasks(job: Obj) -> list[Obj]:
    return list((job.get("spec") or {}).get("tasks") or ())


def _replicas(job: Obj) -> int:
    return sum(int(task.get("replicas", 0)) for task in _tasks(job))


def _denied(message: str) -> ApiError:
    """What kube-apiserver answers when Volcano's validating webhook refuses a Job."""
    return ApiError(
        400,
        "BadRequest",
        f'admission webhook "validatejob.volcano.sh" denied the request: {message}',
    )


class VolcanoJobController(Reconciler):
    """``vc-controller-manager``'s job controller."""

    name = "vc-controller-manager"
    manager = "vc-controller-manager"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.serve_webhook(self.admit)
        for job in self.items(VCJOBS):
            self.enqueue(_key(job))

    # -- the webhooks ------------------------------------------------------------------

    def admit(
        self, operation: str, resource: Resource, obj: Obj, old: Obj | None, ctx: Context
    ) -> None:
        """Volcano's mutating then validating webhook for Jobs, on create."""
        if resource.rtype.key != VCJOBS or operation != "CREATE":
            return
        spec = obj.setdefault("spec", {})
        spec.setdefault("schedulerName", SCHEDULER_NAME)
        for index, task in enumerate(spec.get("tasks") or ()):
            task.setdefault("name", f"default{index}")
            task.setdefault("minAvailable", int(task.get("replicas", 0)))
        spec.setdefault(
            "minAvailable", sum(int(t["minAvailable"]) for t in spec.get("tasks") or ())
        )
        self._validate(obj)

    def _validate(self, job: Obj) -> None:
        spec = job["spec"]
        if not _tasks(job):
            raise _denied("No task specified in job spec")
        names = [str(task["name"]) for task in _tasks(job)]
        if len(set(names)) != len(names):
            raise _denied(
                f"duplicated task name {sorted(n for n in names if names.count(n) > 1)[0]}"
            )
        if int(spec["minAvailable"]) > _replicas(job):
            raise _denied("job 'minAvailable' should not be greater than total replicas in tasks")
        queue = self.get(QUEUES, "", str(spec.get("queue") or "default"))
        if queue is None:
            missing = f'queues.scheduling.volcano.sh "{spec.get("queue")}" not found'
            raise _denied(f"unable to find job queue: {missing}")
        state = (queue.get("status") or {}).get("state") or "Open"
        if state != "Open":
            queue_name = spec.get("queue")
            raise _denied(
                "can only submit job to queue with state `Open`, "
                f"queue `{queue_name}` status is `{state}`"
            )

    # -- the controller ----------------------------------------------------------------

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == VCJOBS and event.type != DELETED:
            yield event.key
        elif resource_key in ("pods", PODGROUPS):
            owner = controller_of(event.obj)
            if owner and owner.get("apiVersion") == API_VERSION and owner.get("kind") == "Job":
                yield (event.key[0], owner.get("name", ""))

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        job = self.get(VCJOBS, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        group = self._ensure_group(job)
        pods = self._pods(job)
        phase = self._phase(job)
        if phase not in _FINAL and (group.get("status") or {}).get("phase", "Pending") != "Pending":
            pods += self._create_missing(job, group, pods)
        self._write(job, pods)

    def _pods(self, job: Obj) -> list[Obj]:
        uid = job["metadata"]["uid"]
        return [
            pod
            for pod in self.items("pods", job["metadata"]["namespace"])
            if (controller_of(pod) or {}).get("uid") == uid
        ]

    def _phase(self, job: Obj) -> str:
        return str(((job.get("status") or {}).get("state") or {}).get("phase") or "Pending")

    def _ensure_group(self, job: Obj) -> Obj:
        namespace = job["metadata"]["namespace"]
        existing = self.get(PODGROUPS, namespace, podgroup_name(job))
        if existing is not None:
            return existing
        spec = job["spec"]
        group_spec: Obj = {
            "minMember": int(spec.get("minAvailable", 0)),
            "minResources": self._min_resources(job),
            "queue": spec.get("queue") or "default",
        }
        for field in ("priorityClassName", "networkTopology"):
            if spec.get(field):
                group_spec[field] = clone(spec[field])
        return self.create(
            PODGROUPS,
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": {
                    "name": podgroup_name(job),
                    "namespace": namespace,
                    "ownerReferences": [owner_reference(job)],
                    "annotations": dict(job["metadata"].get("annotations") or {}),
                },
                "spec": group_spec,
            },
        )

    def _min_resources(self, job: Obj) -> dict[str, str]:
        """The requests of the first ``minAvailable`` pods, tasks in order."""
        left = int(job["spec"].get("minAvailable", 0))
        total: dict[str, int] = {}
        for task in _tasks(job):
            count = min(left, int(task.get("replicas", 0)))
            requests = pod_requests(((task.get("template") or {}).get("spec")) or {})
            add(total, {name: amount * count for name, amount in requests.items()})
            left -= count
        return {name: resource_quantity(name, amount) for name, amount in sorted(total.items())}

    def _create_missing(self, job: Obj, group: Obj, pods: list[Obj]) -> list[Obj]:
        have = {pod["metadata"]["name"] for pod in pods}
        created = []
        for task in _tasks(job):
            for index in range(int(task.get("replicas", 0))):
                name = f"{job['metadata']['name']}-{task['name']}-{index}"
                if name not in have:
                    created.append(self.create("pods", self._pod(job, group, task, index, name)))
        return created

    def _pod(self, job: Obj, group: Obj, task: Obj, index: int, name: str) -> Obj:
        template = clone(task.get("template") or {})
        metadata = template.get("metadata") or {}
        spec = template.get("spec") or {}
        spec.setdefault("schedulerName", job["spec"].get("schedulerName") or SCHEDULER_NAME)
        if job["spec"].get("priorityClassName"):
            spec.setdefault("priorityClassName", job["spec"]["priorityClassName"])
        job_name, queue = job["metadata"]["name"], str(job["spec"].get("queue") or "default")
        annotations = {
            **(metadata.get("annotations") or {}),
            "volcano.sh/task-index": str(index),
            "volcano.sh/task-spec": task["name"],
            GROUP_ANNOTATION: group["metadata"]["name"],
            "volcano.sh/job-name": job_name,
            "volcano.sh/queue-name": queue,
            "volcano.sh/job-version": str((job.get("status") or {}).get("version", 0)),
            "volcano.sh/template-uid": f"{job_name}-{task['name']}",
            "volcano.sh/job-retry-count": str((job.get("status") or {}).get("retryCount", 0)),
        }
        labels = {
            **(metadata.get("labels") or {}),
            "volcano.sh/task-index": str(index),
            "volcano.sh/job-name": job_name,
            "volcano.sh/task-spec": task["name"],
            "volcano.sh/job-namespace": job["metadata"]["namespace"],
            "volcano.sh/queue-name": queue,
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner_reference(job)],
            },
            "spec": spec,
        }

    # -- status ------------------------------------------------------------------------

    def _next_phase(self, job: Obj, counts: Counter[str]) -> str:
        phase = self._phase(job)
        if phase in _FINAL:
            return phase
        spec = job["spec"]
        minimum = int(spec.get("minAvailable", 0))
        replicas = _replicas(job)
        if counts["Succeeded"] + counts["Failed"] >= replicas > 0:
            success = int(spec.get("minSuccess") or minimum)
            return "Completed" if counts["Succeeded"] >= success else "Failed"
        if counts["Running"] + counts["Succeeded"] + counts["Failed"] >= max(minimum, 1):
            return "Running"
        return phase

    def _write(self, job: Obj, pods: list[Obj]) -> None:
        counts = Counter(str((p.get("status") or {}).get("phase", "Pending")) for p in pods)
        phase = self._next_phase(job, counts)
        status = clone(job.get("status") or {})
        if self._phase(job) != phase or "state" not in status:
            now = now_rfc3339()
            status["state"] = {"phase": phase, "lastTransitionTime": now}
            status.setdefault("conditions", []).append({"status": phase, "lastTransitionTime": now})
        status["minAvailable"] = int(job["spec"].get("minAvailable", 0))
        for field, pod_phase in (
            ("pending", "Pending"),
            ("running", "Running"),
            ("succeeded", "Succeeded"),
            ("failed", "Failed"),
        ):
            status[field] = counts[pod_phase]
        status["taskStatusCount"] = self._task_counts(pods)
        status.setdefault("version", 0)
        status.setdefault("retryCount", 0)
        self.mutate(VCJOBS, job, lambda j: j.__setitem__("status", status), status=True)

    def _task_counts(self, pods: list[Obj]) -> dict[str, Any]:
        tasks: dict[str, Counter[str]] = {}
        for pod in pods:
            task = (pod["metadata"].get("labels") or {}).get("volcano.sh/task-spec", "")
            tasks.setdefault(task, Counter())[
                str((pod.get("status") or {}).get("phase", "Pending"))
            ] += 1
        return {task: {"phase": dict(counter)} for task, counter in sorted(tasks.items())}


def _key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
