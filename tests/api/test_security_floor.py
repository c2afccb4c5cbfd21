"""The security floor over HTTP: what a Workload runs is what is checked
and charged, strings are not booleans, and relaxing the floor is a role of
its own with a ledger entry."""

from __future__ import annotations

import copy
from typing import Any

from tests.api.conftest import Api, gpu_pod, setup_quota
from tests.api.test_resources import _fields, _problem

WORKLOADS = "/v1/namespaces/team-a/workloads"


def _job(template: dict[str, Any], parallelism: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "payload"},
        "spec": {"parallelism": parallelism, "completions": parallelism, "template": template},
    }


def _workload(name: str, job: dict[str, Any], pod_sets: list[dict[str, Any]] | None) -> Any:
    spec: dict[str, Any] = {"queueName": "train", "job": job}
    if pod_sets is not None:
        spec["podSets"] = pod_sets
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": spec,
    }


def _evil() -> dict[str, Any]:
    template = gpu_pod(gpus=1, hostNetwork=True, hostPID=True)
    pod = template["spec"]
    pod.pop("serviceAccountName")
    pod["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    container = pod["containers"][0]
    container["image"] = "evil/miner:latest"
    container["securityContext"]["privileged"] = True
    return template


def test_a_workload_cannot_smuggle_a_job_past_the_floor(api: Api) -> None:
    setup_quota(api.admin)
    clean = [{"name": "main", "count": 1, "template": gpu_pod(gpus=1)}]
    body = _problem(
        api.admin.post(WORKLOADS, json=_workload("smuggled", _job(_evil()), clean)), 422, "invalid"
    )
    assert "spec.podSets[0].template" in _fields(body)
    body = _problem(
        api.admin.post(WORKLOADS, json=_workload("bare", _job(_evil()), None)),
        422,
        "policy-refused",
    )
    prefix = "spec.job.spec.template.spec"
    assert {
        f"{prefix}.hostNetwork",
        f"{prefix}.hostPID",
        f"{prefix}.volumes[0].hostPath",
        f"{prefix}.serviceAccountName",
        f"{prefix}.containers[0].image",
        f"{prefix}.containers[0].securityContext.privileged",
    } <= set(_fields(body))
    for name in ("smuggled", "bare"):
        assert api.admin.get(f"{WORKLOADS}/{name}").status_code == 404


def test_the_quota_charged_is_what_the_job_asks(api: Api) -> None:
    setup_quota(api.admin)
    big = gpu_pod(gpus=1)
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    small = copy.deepcopy(big)
    small["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
    summary = [{"name": "main", "count": 1, "template": small}]
    body = _problem(
        api.admin.post(WORKLOADS, json=_workload("under", _job(big, 20), summary)), 422, "invalid"
    )
    assert {"spec.podSets[0].count", "spec.podSets[0].template"} <= set(_fields(body))
    created = api.admin.post(WORKLOADS, json=_workload("derived", _job(big, 20), None))
    assert created.status_code == 201, created.text
    assert [(p["name"], p["count"]) for p in created.json()["spec"]["podSets"]] == [("main", 20)]
    explained = api.admin.get(f"{WORKLOADS}/derived/explain").json()
    assert explained["requests"]["cpu"] == 20 * 16_000
    assert explained["requests"]["nvidia.com/gpu"] == 20


def test_pod_template_fields_are_typed_and_known(api: Api) -> None:
    setup_quota(api.admin)
    job = _job(gpu_pod(gpus=1))
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "train"}
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"][
        "allowPrivilegeEscalation"
    ] = "false"
    body = _problem(api.admin.post(WORKLOADS, json=job), 422, "invalid")
    assert _fields(body) == [
        "spec.template.spec.containers[0].securityContext.allowPrivilegeEscalation"
    ]
    typo = _job(gpu_pod(gpus=1))
    typo["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "train"}
    typo["spec"]["paralelism"] = 4
    body = _problem(api.admin.post(WORKLOADS, json=typo), 422, "invalid")
    assert _fields(body) == ["spec.paralelism"]
    nulls = _job(gpu_pod(gpus=1))
    nulls["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "train"}
    nulls["metadata"]["annotations"] = None  # a YAML key holding only a comment
    assert api.admin.post(WORKLOADS, json=nulls).status_code == 201


def _cq(api: Api, client: Any, **spec: Any) -> Any:
    current = api.admin.get("/v1/clusterqueues/cq-a").json()
    current["spec"].update(spec)
    return client.put(
        "/v1/clusterqueues/cq-a", json={"metadata": current["metadata"], "spec": current["spec"]}
    )


def test_relaxing_the_floor_takes_the_security_admin_role(api: Api) -> None:
    setup_quota(api.admin)
    queues = api.as_role("queue-admin")
    security = api.as_role("security-admin", name="sec-officer")
    body = _problem(_cq(api, queues, securityPolicy={"level": "baseline"}), 403, "forbidden")
    assert _fields(body) == ["spec.securityPolicy"]
    assert "level: restricted -> baseline" in body["detail"]
    assert _cq(api, queues, stopPolicy="Hold").status_code == 200  # quotas are theirs
    _problem(_cq(api, security, stopPolicy="None"), 403, "forbidden")  # and not the officer's
    relaxed = _cq(api, security, securityPolicy={"level": "baseline", "requireImageDigest": False})
    assert relaxed.status_code == 200, relaxed.text
    # The queue admin's later edits keep the relaxation without relaxing anything.
    assert _cq(api, queues, stopPolicy="None").status_code == 200
    assert _cq(api, queues, securityPolicy={}).status_code == 200  # tightening is anyone's
    entries = (
        api.as_role("auditor")
        .get("/v1/ledger/entries", params={"kind": "security.relaxed"})
        .json()["items"]
    )
    assert [
        (e["body"]["actor"], e["body"]["cluster_queue"], e["body"]["relaxed"]) for e in entries
    ] == [
        (
            "token:sec-officer",
            "cq-a",
            ["level: restricted -> baseline", "requireImageDigest: True -> False"],
        )
    ]
    assert (
        api.admin.get("/v1/clusterqueues/cq-a").json()["spec"]["securityPolicy"]["level"]
        == "restricted"
    )
