"""The batch/v1 Job controller (JobSet: :mod:`.jobset`; PyTorchJob and MPIJob:
:mod:`.training`).

It follows kube-controller-manager's: pods carry the
``batch.kubernetes.io/job-tracking`` finalizer until their end is counted in
``status.succeeded`` / ``failed``; a suspended Job's pods are deleted without
counting as failures; ``backoffLimit``, ``activeDeadlineSeconds``,
``completions`` (NonIndexed and Indexed) and ``parallelism`` decide the
``SuccessCriteriaMet``/``Complete`` or ``FailureTarget``/``Failed`` conditions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.api import now_rfc3339
from sim.kubesim.controllers.base import (
    Reconciler,
    controller_of,
    is_true,
    owner_reference,
    set_condition,
)
from sim.kubesim.store import DELETED, Event, clone

__all__ = ["TRACKING_FINALIZER", "JobController", "pod_phase"]

Obj = dict[str, Any]
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
#: ``spec.managedBy`` naming the built-in controller; any other value hands the Job to
#: an external controller (KEP-4368, on by default since 1.32) and this one leaves it alone.
JOB_CONTROLLER_NAME = "kubernetes.io/job-controller"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _ready(pod: Obj) -> bool:
    return pod_phase(pod) == "Running" and is_true(pod, "Ready")


def _index_set(text: str | None) -> set[int]:
    result: set[int] = set()
    for part in (text or "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        result.update(range(int(low), int(high or low) + 1))
    return result


def _index_text(indexes: set[int]) -> str:
    ranges, ordered = [], sorted(indexes)
    start = previous = None
    for index in ordered:
        if start is None:
            start = previous = index
        elif index == previous + 1:  # type: ignore[operator]
            previous = index
        else:
            ranges.append(f"{start}-{previous}" if start != previous else f"{start}")
            start = previous = index
    if start is not None:
        ranges.append(f"{start}-{previous}" if start != previous else f"{start}")
    return ",".join(ranges)


class OwnedPods:
    """Index of pods by their controller's uid, kept from pod events."""

    def __init__(self) -> None:
        self.by_owner: dict[str, dict[tuple[str, str], None]] = defaultdict(dict)

    def observe(self, event: Event) -> str | None:
        before = controller_of(event.prev) if event.prev else None
        after = controller_of(event.obj) if event.type != DELETED else None
        if before and (not after or before.get("uid") != after.get("uid")):
            self.by_owner[before.get("uid", "")].pop(event.key, None)
        if after:
            self.by_owner[after.get("uid", "")][event.key] = None
        return (after or before or {}).get("uid")


class JobController(Reconciler):
    name = "job-controller"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.pods = OwnedPods()
        self.expected_deletions: set[str] = set()

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == "jobs.batch":
            yield event.key
        elif resource_key == "pods":
            self.pods.observe(event)
            owner = controller_of(event.obj)
            if owner and owner.get("kind") == "Job" and owner.get("apiVersion") == "batch/v1":
                yield (event.key[0], owner.get("name", ""))

    def _owned(self, job: Obj) -> list[Obj]:
        pods = []
        for namespace, name in list(self.pods.by_owner.get(job["metadata"]["uid"], {})):
            pod = self.get("pods", namespace, name)
            if pod is not None:
                pods.append(pod)
        return pods

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        job = self.get("jobs.batch", namespace, name)
        if job is None:
            self._release_orphans(namespace, name)
            return
        if job["metadata"].get("deletionTimestamp"):
            return
        if job["spec"].get("managedBy", JOB_CONTROLLER_NAME) != JOB_CONTROLLER_NAME:
            return
        pods = self._owned(job)
        status = clone(job.get("status") or {})
        active = self._count_finished(job, pods, status)
        self._run(job, active, status)

    def _release_orphans(self, namespace: str, name: str) -> None:
        for pod in self.items("pods", namespace):
            owner = controller_of(pod)
            ours = owner and owner.get("kind") == "Job" and owner.get("name") == name
            if ours and TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or ()):
                self._drop_finalizer(pod)

    def _drop_finalizer(self, pod: Obj) -> None:
        self.mutate(
            "pods",
            pod,
            lambda p: p["metadata"].__setitem__(
                "finalizers",
                [f for f in p["metadata"].get("finalizers") or () if f != TRACKING_FINALIZER],
            ),
        )

    def _count_finished(self, job: Obj, pods: list[Obj], status: Obj) -> list[Obj]:
        """Count ended pods into ``status`` (dropping their finalizer); return the active ones."""
        active = []
        indexes = _index_set(status.get("completedIndexes"))
        for pod in pods:
            ended = pod_phase(pod) in ("Succeeded", "Failed") or pod["metadata"].get(
                "deletionTimestamp"
            )
            if not ended:
                active.append(pod)
                continue
            if TRACKING_FINALIZER not in (pod["metadata"].get("finalizers") or ()):
                continue
            uid = pod["metadata"]["uid"]
            if uid in self.expected_deletions:
                self.expected_deletions.discard(uid)
            elif pod_phase(pod) == "Succeeded":
                status["succeeded"] = status.get("succeeded", 0) + 1
                index = (pod["metadata"].get("annotations") or {}).get(INDEX_ANNOTATION)
                if index is not None:
                    indexes.add(int(index))
            else:
                status["failed"] = status.get("failed", 0) + 1
            self._drop_finalizer(pod)
        if job["spec"].get("completionMode") == "Indexed":
            status["completedIndexes"] = _index_text(indexes)
        return active

    def _delete_active(self, job: Obj, active: list[Obj]) -> None:
        for pod in active:
            self.expected_deletions.add(pod["metadata"]["uid"])
            self.delete("pods", pod)
            self.events.emit(
                job, "Job", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}"
            )

    def _run(self, job: Obj, active: list[Obj], status: Obj) -> None:
        spec = job["spec"]
        now = now_rfc3339()
        if is_true(job, "Complete") or is_true(job, "Failed"):
            self._delete_active(job, active)
            self._write(job, status, [])
            return
        if spec.get("suspend"):
            self._delete_active(job, active)
            if not is_true(job, "Suspended"):
                set_condition(
                    status, "Suspended", "True", "JobSuspended", "Job suspended", probe_times=True
                )
                self.events.emit(job, "Job", "Suspended", "Job suspended")
            self._write(job, status, [])
            return
        if is_true(job, "Suspended"):
            set_condition(
                status, "Suspended", "False", "JobResumed", "Job resumed", probe_times=True
            )
            status["startTime"] = now
            self.events.emit(job, "Job", "Resumed", "Job resumed")
        status.setdefault("startTime", now)
        if self._failed(job, active, status) or self._completed(job, active, status):
            self._write(job, status, [])
            return
        active += self._create_pods(job, active, status)
        self._write(job, status, active)

    def _failed(self, job: Obj, active: list[Obj], status: Obj) -> bool:
        spec = job["spec"]
        restarts = sum(
            c.get("restartCount", 0)
            for p in active
            for c in (p.get("status") or {}).get("containerStatuses") or ()
        )
        reason = message = ""
        if status.get("failed", 0) + restarts > spec.get("backoffLimit", 6):
            reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and not reason:
            elapsed = _elapsed(status.get("startTime"))
            if elapsed >= self.scaled(float(deadline)):
                reason, message = (
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                )
            else:
                self.enqueue_after(
                    (job["metadata"]["namespace"], job["metadata"]["name"]),
                    self.scaled(float(deadline)) - elapsed,
                )
        if not reason:
            return False
        self._delete_active(job, active)
        set_condition(status, "FailureTarget", "True", reason, message, probe_times=True)
        set_condition(status, "Failed", "True", reason, message, probe_times=True)
        self.events.emit(job, "Job", reason, message, "Warning")
        return True

    def _completed(self, job: Obj, active: list[Obj], status: Obj) -> bool:
        completions = job["spec"].get("completions")
        succeeded = status.get("succeeded", 0)
        done = succeeded >= completions if completions is not None else succeeded > 0 and not active
        if not done:
            return False
        self._delete_active(job, active)
        for type_ in ("SuccessCriteriaMet", "Complete"):
            set_condition(
                status,
                type_,
                "True",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                probe_times=True,
            )
        status["completionTime"] = now_rfc3339()
        self.events.emit(job, "Job", "Completed", "Job completed")
        return True

    def _create_pods(self, job: Obj, active: list[Obj], status: Obj) -> list[Obj]:
        spec = job["spec"]
        parallelism = spec.get("parallelism", 1)
        completions = spec.get("completions")
        succeeded = status.get("succeeded", 0)
        if completions is not None:
            need = min(parallelism - len(active), completions - succeeded - len(active))
        else:
            need = parallelism - len(active) if succeeded == 0 else 0
        if need <= 0:
            return []
        indexes: list[int | None] = [None] * need
        if spec.get("completionMode") == "Indexed":
            taken = _index_set(status.get("completedIndexes")) | {
                int((p["metadata"].get("annotations") or {}).get(INDEX_ANNOTATION, -1))
                for p in active
            }
            free = [i for i in range(completions or parallelism) if i not in taken]
            indexes = list[int | None](free[:need])
        return [self._create_pod(job, index) for index in indexes]

    def _create_pod(self, job: Obj, index: int | None) -> Obj:
        template = clone(job["spec"].get("template") or {})
        metadata = template.get("metadata") or {}
        labels = dict(metadata.get("labels") or {})
        annotations = dict(metadata.get("annotations") or {})
        prefix = f"{job['metadata']['name']}-"
        if index is not None:
            annotations[INDEX_ANNOTATION] = str(index)
            labels[INDEX_ANNOTATION] = str(index)
            prefix += f"{index}-"
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": prefix,
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner_reference(job)],
                "finalizers": [*(metadata.get("finalizers") or ()), TRACKING_FINALIZER],
            },
            "spec": template.get("spec") or {},
        }
        if not annotations:
            del pod["metadata"]["annotations"]
        created = self.create("pods", pod)
        self.events.emit(
            job, "Job", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}"
        )
        return created

    def _write(self, job: Obj, status: Obj, active: list[Obj]) -> None:
        status["active"] = len(active)
        status["ready"] = sum(1 for pod in active if _ready(pod))
        status["terminating"] = 0
        status["uncountedTerminatedPods"] = {}
        for field in ("active", "succeeded", "failed"):
            if not status.get(field):
                status.pop(field, None)
        self.mutate("jobs.batch", job, lambda j: j.__setitem__("status", status), status=True)


def _elapsed(start: str | None) -> float:
    if not start:
        return 0.0
    from datetime import UTC, datetime

    then = datetime.fromisoformat(start.replace("Z", "+00:00"))
    return (datetime.now(UTC) - then).total_seconds()
