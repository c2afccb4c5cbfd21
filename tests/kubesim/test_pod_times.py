"""The stand-in's kubelet as billing reads it (docs/billing.md): a pod's own
timestamps are the instants of its running-interval record truncated to the
second, a Job's pods carry its template's finalizers (as GetPodFromTemplate
copies them), and a deleted pod that carries one is terminated by its
kubelet and kept, readable, until the finalizer goes."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from sim.kubesim.controllers.intervals import second
from sim.kubesim.testing import RunningCluster
from tests.waiting import wait_for

OURS = "quartermaster.dev/usage"


def _job(name: str, duration: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "template": {
                "metadata": {
                    "finalizers": [OURS],
                    "annotations": {"quartermaster.dev/sim-duration": duration},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            },
        },
    }


def _pods(core: client.CoreV1Api, job: str) -> list[Any]:
    return list(core.list_namespaced_pod("default", label_selector=f"job-name={job}").items)


def _records(sim: RunningCluster, job: str) -> dict[str, dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        hooks = (getattr(c, "running_intervals", None) for c in sim.cluster.controllers)
        return next((hook() for hook in hooks if hook is not None), [])

    return {r["name"]: r for r in sim.run(read) if r["labels"].get("job-name") == job}


def _release(core: client.CoreV1Api, pod: Any) -> None:
    patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [OURS]}}
    core.patch_namespaced_pod(
        pod.metadata.name,
        "default",
        patch,
        _content_type="application/strategic-merge-patch+json",
    )


def test_pods_timestamps_are_their_interval_record_to_the_second(
    sim: RunningCluster, batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    batch.create_namespaced_job("default", _job("timed", "150s"))  # 1.5 s at 1/100
    wait_for(
        lambda: (
            len(_pods(core, "timed")) == 2
            and all(p.status.phase == "Succeeded" for p in _pods(core, "timed"))
        ),
        60,
    )
    records = _records(sim, "timed")
    for pod in _pods(core, "timed"):
        assert OURS in (pod.metadata.finalizers or []), "the template's finalizer is copied"
        record = records[pod.metadata.name]
        (state,) = [c.state.terminated for c in pod.status.container_statuses]
        # The typed client parses the timestamps: compare as the API wrote them.
        assert pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") == second(record["start"])
        assert state.finished_at.strftime("%Y-%m-%dT%H:%M:%SZ") == second(record["end"])
        _release(core, pod)
    batch.delete_namespaced_job("timed", "default", propagation_policy="Background")


def test_a_deleted_pod_with_a_finalizer_is_ended_and_kept_until_it_goes(
    sim: RunningCluster, batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    batch.create_namespaced_job("default", _job("held", "100000s"))
    wait_for(
        lambda: (
            len(_pods(core, "held")) == 2
            and all(p.status.phase == "Running" for p in _pods(core, "held"))
        ),
        60,
    )
    batch.delete_namespaced_job("held", "default", propagation_policy="Background")
    wait_for(lambda: all(p.status.phase == "Failed" for p in _pods(core, "held")), 60)
    time.sleep(0.5)  # nothing removes them while our finalizer is there
    kept = _pods(core, "held")
    assert len(kept) == 2 and all(p.metadata.deletion_timestamp for p in kept)
    records = _records(sim, "held")
    for pod in kept:
        (state,) = [c.state.terminated for c in pod.status.container_statuses]
        assert state.finished_at.strftime("%Y-%m-%dT%H:%M:%SZ") == second(
            records[pod.metadata.name]["end"]
        )
        _release(core, pod)
    wait_for(lambda: not _pods(core, "held"), 60)
