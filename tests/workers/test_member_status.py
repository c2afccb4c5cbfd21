"""Sync's reading of a member job's phase (workers/plan/status.py), for the kinds
whose end is not a condition: a RayJob ends as KubeRay writes it, in
``jobDeploymentStatus`` and ``jobStatus``; a RayCluster never ends of itself."""

from __future__ import annotations

from typing import Any

import pytest

from workers.plan import member_status

END = "2026-12-02T17:00:00Z"


def _rayjob(**status: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "status": status}


def _workload(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "lastTransitionTime": END}
                for t, r in conditions
            ]
        }
    }


@pytest.mark.parametrize(
    ("job", "workload", "phase", "reason"),
    [
        (
            _rayjob(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", endTime=END),
            None,
            "Succeeded",
            "Succeeded",
        ),
        (
            _rayjob(
                jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed", endTime=END
            ),
            None,
            "Failed",
            "AppFailed",
        ),
        (
            _rayjob(jobDeploymentStatus="Failed", reason="DeadlineExceeded", endTime=END),
            None,
            "Failed",
            "DeadlineExceeded",
        ),
        (
            _rayjob(jobDeploymentStatus="Running", jobStatus="RUNNING"),
            _workload(("PodsReady", "Started")),
            "Running",
            "PodsReady",
        ),
        (_rayjob(jobDeploymentStatus="Initializing"), None, "Pending", ""),
        (_rayjob(jobDeploymentStatus="Suspended"), None, "Pending", ""),
        # The member Kueue's Workload says it first: its word is taken.
        (
            _rayjob(jobDeploymentStatus="Running"),
            _workload(("Finished", "Failed")),
            "Failed",
            "Failed",
        ),
        (
            {"kind": "RayCluster", "status": {"state": "ready"}},
            _workload(("PodsReady", "Started")),
            "Running",
            "PodsReady",
        ),
    ],
)
def test_a_ray_kind_reads_as_kuberay_writes_it(
    job: dict[str, Any], workload: dict[str, Any] | None, phase: str, reason: str
) -> None:
    seen = member_status(job, workload)
    assert (seen["phase"], seen["reason"]) == (phase, reason)
    if phase in ("Succeeded", "Failed"):
        assert seen["at"] == END
