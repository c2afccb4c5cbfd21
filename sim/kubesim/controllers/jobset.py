"""The JobSet controller: a JobSet runs as child Jobs (one per replicated-job
replica), as the JobSet controller does: it succeeds by its success policy
(``All`` or ``Any`` of its target replicated jobs' Jobs; All of every Job
without one), and once finished its Jobs still active are deleted
(kubernetes-sigs/jobset ``pkg/controllers/jobset_controller.go``)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.controllers.base import (
    Reconciler,
    condition,
    controller_of,
    is_true,
    owner_reference,
    set_condition,
)
from sim.kubesim.store import Event, clone

Obj = dict[str, Any]


class JobSetController(Reconciler):
    """``jobset.x-k8s.io/v1alpha2``: one child Job per replicated-job replica."""

    name = "jobset-controller"
    manager = "jobset"

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == "jobsets.jobset.x-k8s.io":
            yield event.key
        elif resource_key == "jobs.batch":
            owner = controller_of(event.obj)
            if owner and owner.get("kind") == "JobSet":
                yield (event.key[0], owner.get("name", ""))

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        jobset = self.get("jobsets.jobset.x-k8s.io", namespace, name)
        if jobset is None or jobset["metadata"].get("deletionTimestamp"):
            return
        spec = jobset.get("spec") or {}
        suspended = bool(spec.get("suspend"))
        children = {
            job["metadata"]["name"]: job
            for job in self.items("jobs.batch", namespace)
            if (controller_of(job) or {}).get("uid") == jobset["metadata"]["uid"]
        }
        status = clone(jobset.get("status") or {})
        finished = is_true(jobset, "Completed") or is_true(jobset, "Failed")
        summary = []
        for replicated in spec.get("replicatedJobs") or ():
            counts = {
                "name": replicated["name"],
                "ready": 0,
                "succeeded": 0,
                "failed": 0,
                "active": 0,
                "suspended": 0,
            }
            for index in range(int(replicated.get("replicas", 1))):
                child_name = f"{name}-{replicated['name']}-{index}"
                child = children.get(child_name)
                if child is None and not finished:
                    child = self._create_child(jobset, replicated, index, suspended)
                elif child is not None and not finished:
                    child = self._sync_child(child, replicated, suspended)
                if child is not None:
                    _tally(counts, child)
            summary.append(counts)
        status["replicatedJobsStatus"] = summary
        self._conditions(jobset, status, suspended, summary)
        self.mutate(
            "jobsets.jobset.x-k8s.io",
            jobset,
            lambda j: j.__setitem__("status", status),
            status=True,
        )
        if status.get("terminalState"):
            for child in children.values():
                ended = is_true(child, "Complete") or is_true(child, "Failed")
                if not ended and not child["metadata"].get("deletionTimestamp"):
                    self.delete("jobs.batch", child)

    def _create_child(self, jobset: Obj, replicated: Obj, index: int, suspended: bool) -> Obj:
        template = clone(replicated.get("template") or {})
        name = jobset["metadata"]["name"]
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
            "jobset.sigs.k8s.io/job-index": str(index),
        }
        spec = template.get("spec") or {}
        spec["suspend"] = suspended
        pod_labels = (
            spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
        )
        pod_labels.update({k: v for k, v in labels.items() if k.startswith("jobset.sigs.k8s.io/")})
        child = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{name}-{replicated['name']}-{index}",
                "namespace": jobset["metadata"]["namespace"],
                "labels": labels,
                "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                "ownerReferences": [owner_reference(jobset)],
            },
            "spec": spec,
        }
        return self.create("jobs.batch", child)

    def _sync_child(self, child: Obj, replicated: Obj, suspended: bool) -> Obj:
        if bool(child["spec"].get("suspend")) == suspended:
            return child
        wanted = ((replicated.get("template") or {}).get("spec") or {}).get("template") or {}

        def change(job: Obj) -> None:
            job["spec"]["suspend"] = suspended
            if not suspended:
                pod_spec = job["spec"]["template"].setdefault("spec", {})
                for field in ("nodeSelector", "tolerations", "affinity"):
                    if field in (wanted.get("spec") or {}):
                        pod_spec[field] = clone(wanted["spec"][field])
                    else:
                        pod_spec.pop(field, None)

        return self.mutate("jobs.batch", child, change)

    def _conditions(self, jobset: Obj, status: Obj, suspended: bool, summary: list[Obj]) -> None:
        if is_true(jobset, "Completed") or is_true(jobset, "Failed"):
            return
        if any(c["failed"] for c in summary):
            set_condition(
                status,
                "Failed",
                "True",
                "FailedJobs",
                "jobset failed due to one or more job failures",
            )
            status["terminalState"] = "Failed"
            return
        if _succeeded(jobset.get("spec") or {}, summary):
            set_condition(
                status, "Completed", "True", "AllJobsCompleted", "jobset completed successfully"
            )
            status["terminalState"] = "Completed"
            return
        if suspended:
            set_condition(status, "Suspended", "True", "SuspendedJobs", "jobset is suspended")
        elif condition(jobset, "Suspended") is not None:
            set_condition(status, "Suspended", "False", "ResumeJobs", "jobset is resumed")


def _succeeded(spec: Obj, summary: list[Obj]) -> bool:
    """Whether the success policy holds: ``Any`` Job of the target
    replicated jobs succeeded, or ``All`` of them did (the targets every
    replicated job when it names none; All without a policy)."""
    policy = spec.get("successPolicy") or {}
    replicas = {r["name"]: int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or ()}
    targets = set(policy.get("targetReplicatedJobs") or ()) or set(replicas)
    chosen = [c for c in summary if c["name"] in targets]
    if policy.get("operator") == "Any":
        return any(c["succeeded"] for c in chosen)
    expected = sum(replicas[c["name"]] for c in chosen)
    return bool(expected) and sum(c["succeeded"] for c in chosen) >= expected


def _tally(counts: Obj, job: Obj) -> None:
    status = job.get("status") or {}
    if is_true(job, "Complete"):
        counts["succeeded"] += 1
    elif is_true(job, "Failed"):
        counts["failed"] += 1
    elif job["spec"].get("suspend"):
        counts["suspended"] += 1
    else:
        counts["active"] += 1
        if status.get("ready", 0) >= job["spec"].get("parallelism", 1):
            counts["ready"] += 1
