"""A RayJob end to end through the real processes (issue 22): submitted over HTTP,
admitted by the centre, applied by the workers to a stand-in Kueue member with its
queue label and every pod template pinned to the admitted island, run there by the
member's Kueue and KubeRay stand-ins (head, then worker group, then the submitter),
and read back by sync as running, then finished ``Succeeded``; its quota released,
its usage in the ledger.

The RayJob is KubeRay's ``ray-operator/config/samples/ray-job.sample.yaml``
(``rayjob-sample``), re-expressed: the same head and ``small-group`` worker group
(here on GPUs, one node each), a submitter pod template (the centre requires one),
pods that pass the security floor, and a simulated run time on the submitter.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import sqlalchemy as sa

from tests.waiting import LONG_CEILING, wait_for
from tests.workers.stack import (
    FAST,
    GPU,
    ISLAND,
    Stack,
    base_manifests,
    local_queue,
    pod_template,
    team_queue,
    write_fleet,
)

NS = "team-a"


def _ray_pod(name: str, gpus: int, duration: str | None = None) -> dict[str, Any]:
    template = pod_template({"cpu": "2", "memory": "16Gi", GPU: gpus}, duration)
    template["spec"]["containers"][0]["name"] = name
    del template["spec"]["restartPolicy"]
    return template


def rayjob_sample() -> dict[str, Any]:
    head = _ray_pod("ray-head", 8)
    worker = _ray_pod("ray-worker", 8)
    submitter = _ray_pod("ray-job-submitter", 0, "400s")
    submitter["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "500m", "memory": "200Mi"}
    submitter["spec"]["restartPolicy"] = "Never"
    for template in (head, worker):
        template["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": ISLAND}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rayjob-sample", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "entrypoint": "python /home/ray/samples/sample_code.py",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 10,
            "runtimeEnvYAML": "pip:\n  - requests==2.26.0\n  - pendulum==2.1.2\n",
            "submitterPodTemplate": submitter,
            "rayClusterSpec": {
                "rayVersion": "2.46.0",
                "headGroupSpec": {"rayStartParams": {}, "template": head},
                "workerGroupSpecs": [
                    {
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 5,
                        "groupName": "small-group",
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
        },
    }


@pytest.fixture
def stack(engine: sa.Engine, database_url: str, broker: str, tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, database_url, broker, FAST) as running:
        yield running


def _status(engine: sa.Engine, name: str, namespace: str = NS) -> dict[str, Any]:
    with engine.connect() as conn:
        found = conn.exec_driver_sql(
            "SELECT status FROM resources WHERE kind = 'Workload' "
            "AND namespace = %(ns)s AND name = %(name)s",
            {"ns": namespace, "name": name},
        ).scalar_one_or_none()
    return dict(found or {})


def _events(engine: sa.Engine) -> list[str]:
    """The workload's event types, in order."""
    with engine.connect() as conn:
        return list(
            conn.exec_driver_sql(
                "SELECT type FROM events WHERE type LIKE 'Workload%%' "
                "AND data::text LIKE '%%rayjob-sample%%' ORDER BY position"
            ).scalars()
        )


def _ledger(engine: sa.Engine, name: str = "rayjob-sample") -> list[tuple[str, dict[str, Any]]]:
    """The ledger entries that name workload ``name``, in order."""
    with engine.connect() as conn:
        return [
            (kind, dict(body))
            for kind, body in conn.exec_driver_sql(
                "SELECT kind, body FROM ledger_entries WHERE body::text LIKE %(like)s ORDER BY seq",
                {"like": f"%{name}%"},
            )
        ]


def test_a_kuberay_sample_rayjob_runs_through_the_centre_to_succeeded(
    stack: Stack, engine: sa.Engine, tmp_path: Path
) -> None:
    fleet = write_fleet(tmp_path / "fleet.yaml", {"m1": (2, 2)})
    manifests = [*base_manifests(), team_queue(NS, 32), local_queue(NS, NS)]
    stack.start(fleet, 1, manifests, time_scale=0.01)
    (member,) = stack.members
    seen: dict[str, Any] = {}
    with stack.client() as api:
        response = api.post(f"/v1/namespaces/{NS}/workloads", json=rayjob_sample())
        assert response.status_code == 201, response.text
        spec = response.json()["spec"]
        assert [(p["name"], p["count"]) for p in spec["podSets"]] == [
            ("head", 1),
            ("small-group", 1),
            ("submitter", 1),
        ]

        def running() -> bool:
            status = _status(engine, "rayjob-sample")
            seen["status"] = status
            return status.get("state") == "Running"

        try:
            wait_for(running, LONG_CEILING, "the RayJob running", seen=lambda: seen)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from None
        admission = seen["status"]["admission"]
        with kubernetes.config.new_client_from_config(
            config_file=str(stack.kubeconfig), context=member.name
        ) as client:
            custom = kubernetes.client.CustomObjectsApi(client)
            rayjob = custom.get_namespaced_custom_object(
                "ray.io", "v1", NS, "rayjobs", "rayjob-sample"
            )
            assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
            pinned = _templates(rayjob)
            for name, template in pinned.items():  # every pod template pinned
                selector = template["spec"]["nodeSelector"]
                assert selector.get("example.com/gpu") == "h100", (name, selector, admission)
                if name != "submitter":  # the GPU pod sets asked for an island
                    assert selector.get(ISLAND), (name, selector, admission)
        finished = wait_for(
            lambda: (
                _status(engine, "rayjob-sample").get("state") == "Finished"
                and _status(engine, "rayjob-sample")
            ),
            LONG_CEILING,
            "the RayJob finished",
            seen=lambda: _status(engine, "rayjob-sample"),
        )
    assert finished["outcome"] == "succeeded", finished
    events = _events(engine)
    order = [e for e in events if e in ("WorkloadAdmitted", "WorkloadRunning", "WorkloadFinished")]
    assert order == ["WorkloadAdmitted", "WorkloadRunning", "WorkloadFinished"], events
    # What its pods ran is metered once the member's pods are read (after the end).
    wait_for(
        lambda: "workload.ran" in [kind for kind, _ in _ledger(engine)],
        LONG_CEILING,
        "its pods' runs in the ledger",
        seen=lambda: [kind for kind, _ in _ledger(engine)],
    )
    ledger = _ledger(engine)
    decisions = [(k, b) for k, b in ledger if k in ("workload.admitted", "workload.finished")]
    assert [kind for kind, _ in decisions] == ["workload.admitted", "workload.finished"], ledger
    closed = decisions[1][1]
    assert closed["outcome"] == "succeeded" and closed["gpu_seconds"] > 0, closed


def _templates(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = copy.deepcopy(rayjob["spec"])
    cluster = spec["rayClusterSpec"]
    out = {"head": cluster["headGroupSpec"]["template"], "submitter": spec["submitterPodTemplate"]}
    for group in cluster["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]
    return out
