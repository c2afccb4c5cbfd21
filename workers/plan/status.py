"""Sync's reading of a member job: the phase the centre records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from workers.plan.names import SERVING_JOB_KINDS
from workers.plan.serving import available

Obj = dict[str, Any]


# -- sync: member state → central state ------------------------------------------------------

_SUCCEEDED = {"Complete", "Completed", "Succeeded"}


def _true(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def _ray_job(job: Mapping[str, Any]) -> Obj | None:
    """A RayJob's end, as KubeRay writes it: ``jobDeploymentStatus`` ``Complete``
    or ``Failed`` (a RayCluster never ends of itself)."""
    if job.get("kind") != "RayJob":
        return None
    status = job.get("status") or {}
    deployment = status.get("jobDeploymentStatus")
    if deployment not in ("Complete", "Failed"):
        return None
    if deployment == "Complete" and status.get("jobStatus") != "FAILED":
        return {"phase": "Succeeded", "at": status.get("endTime"), "reason": "Succeeded"}
    return {
        "phase": "Failed",
        "at": status.get("endTime"),
        "reason": status.get("reason") or "Failed",
    }


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
    ended = _job_end(job)
    if ended is not None:
        return ended
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
    if _serving_ready(job):
        return {"phase": "Running", "at": None, "reason": "Available"}
    return {"phase": "Pending", "at": None, "reason": ""}


def _serving_ready(job: Mapping[str, Any]) -> bool:
    """A serving object run as one gang (a StatefulSet admitted whole) is
    running once all its replicas are available; it never ends of itself."""
    if job.get("kind") not in SERVING_JOB_KINDS:
        return False
    wanted = (job.get("spec") or {}).get("replicas", 1)
    return isinstance(wanted, int) and wanted > 0 and available(job) >= wanted


def _job_end(job: Mapping[str, Any]) -> Obj | None:
    """The job's own end (``Complete``/``Completed``/``Succeeded`` or
    ``Failed`` condition, a RayJob's ``jobDeploymentStatus``), if it has one."""
    ray = _ray_job(job)
    if ray is not None:
        return ray
    for condition in (job.get("status") or {}).get("conditions") or ():
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
    return None


def volcano_status(job: Mapping[str, Any], group: Mapping[str, Any] | None) -> Obj:
    """What a Volcano member says of one of our jobs, in the phases of
    :func:`member_status`: the job's own end first; then its PodGroup's
    phase (Volcano's ``jobStatus``): ``Pending`` and ``Inqueue`` are
    Pending (not yet placed), ``Running`` (``minMember`` pods placed: the
    whole gang) is Running, ``Completed`` (every placed pod ended) is the
    end the job has not written yet, ``Unknown`` (part of the gang runs, the
    rest cannot be placed: a broken gang) is Evicted, to be requeued whole."""
    ended = _job_end(job)
    if ended is not None:
        return ended
    status = (group or {}).get("status") or {}
    conditions = status.get("conditions") or ()
    phase = status.get("phase") or "Pending"
    if phase == "Running":
        scheduled = _true(conditions, "Scheduled") or {}
        return {"phase": "Running", "at": scheduled.get("lastTransitionTime"), "reason": "Running"}
    if phase == "Completed":
        failed = int(status.get("failed") or 0) > 0
        outcome = "Failed" if failed else "Succeeded"
        return {"phase": outcome, "at": None, "reason": outcome}
    if phase == "Unknown":
        why = _true(conditions, "Unschedulable") or {}
        return {
            "phase": "Evicted",
            "at": why.get("lastTransitionTime"),
            "reason": "PodGroupUnknown",
            "message": str(why.get("message") or "part of the gang cannot run on the member"),
        }
    return {"phase": "Pending", "at": None, "reason": str(phase)}
