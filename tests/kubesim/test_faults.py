"""Fault injection through the admin endpoint, seen by the official client."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.kubesim.testing import RunningCluster
from tests.kubesim.conftest import queued_job
from tests.waiting import wait_for


@pytest.fixture
def admin(sim: RunningCluster) -> Iterator[httpx.Client]:
    """The cluster's admin endpoint (never partitioned); faults are cleared afterwards."""
    headers = {"Authorization": f"Bearer {sim.admin_token}"}
    with httpx.Client(base_url=sim.admin_url, headers=headers, timeout=10) as http:
        yield http
        http.delete("/_admin/faults").raise_for_status()
        http.delete("/_admin/partition").raise_for_status()


@pytest.fixture
def quick(sim: RunningCluster) -> Iterator[client.CoreV1Api]:
    """A client that neither retries nor waits long, to observe faults as they are."""
    config = sim.configuration()
    config.retries = 0
    with client.ApiClient(config) as api_client:
        yield client.CoreV1Api(api_client)


def _timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def test_admin_endpoint_needs_the_admin_token(sim: RunningCluster) -> None:
    plain = {"Authorization": f"Bearer {sim.token}"}
    with httpx.Client(base_url=sim.admin_url, headers=plain) as http:
        assert http.get("/_admin/faults").status_code == 403
    with httpx.Client(base_url=sim.admin_url) as http:
        assert http.get("/_admin/faults").status_code == 401
    # ... and the API port does not serve the admin endpoint to ordinary users either.
    tls = ssl.create_default_context(cafile=str(sim.ca_file))
    with httpx.Client(base_url=sim.url, headers=plain, verify=tls) as http:
        assert http.get("/_admin/faults").status_code == 403


def test_added_latency_applies_to_the_chosen_verbs_and_resources(
    admin: httpx.Client, quick: client.CoreV1Api
) -> None:
    # A latency far above what any request takes on a busy machine, so that
    # "not delayed" is a comparison with it rather than a speed bound.
    faults = admin.put(
        "/_admin/faults", json={"latencyMs": 3000, "verbs": ["list"], "resources": ["nodes"]}
    ).json()
    assert faults["latencyMs"] == 3000
    assert _timed(quick.list_node) >= 3.0
    assert _timed(lambda: quick.read_namespace("default")) < 3.0
    admin.delete("/_admin/faults")
    assert _timed(quick.list_node) < 3.0


def test_error_rate_answers_with_the_configured_5xx(
    admin: httpx.Client, quick: client.CoreV1Api
) -> None:
    admin.put("/_admin/faults", json={"errorRate": 1.0, "errorCode": 503})
    with pytest.raises(ApiException) as unavailable:
        quick.list_namespace()
    assert unavailable.value.status == 503
    assert unavailable.value.headers["Retry-After"] == "1"

    admin.put("/_admin/faults", json={"errorRate": 0.5, "errorCode": 500})
    failures = 0
    for _ in range(60):
        try:
            quick.read_namespace("default")
        except ApiException as error:
            assert error.status == 500
            failures += 1
    assert 10 <= failures <= 50  # p=0.5 over 60 calls: outside this is ~1e-6 likely


def test_partition_refuses_connections_until_healed(
    admin: httpx.Client, quick: client.CoreV1Api, sim: RunningCluster
) -> None:
    assert quick.read_namespace("default").metadata.name == "default"
    assert admin.post("/_admin/partition", json={}).json()["partitioned"] is True
    # The open keep-alive connection is cut; then new connections are refused.
    with pytest.raises(urllib3.exceptions.MaxRetryError) as cut:
        quick.read_namespace("default", _request_timeout=2)
    assert isinstance(
        cut.value.reason,
        (urllib3.exceptions.ProtocolError, urllib3.exceptions.NewConnectionError),
    )
    with pytest.raises(urllib3.exceptions.MaxRetryError) as refused:
        quick.read_namespace("default", _request_timeout=2)
    assert isinstance(refused.value.reason, urllib3.exceptions.NewConnectionError)
    assert "Connection refused" in str(refused.value.reason)
    assert admin.get("/_admin/state").json()["name"] == sim.name  # the admin side stays up
    admin.delete("/_admin/partition")
    assert wait_for(lambda: _reachable(quick))

    # A timed partition heals by itself.
    admin.post("/_admin/partition", json={"seconds": 0.3})
    assert not _reachable(quick)
    assert wait_for(lambda: _reachable(quick))


def test_blackhole_partition_holds_requests_until_healed(
    admin: httpx.Client, quick: client.CoreV1Api
) -> None:
    admin.post("/_admin/partition", json={"mode": "blackhole"})
    with pytest.raises(urllib3.exceptions.MaxRetryError) as held:
        quick.read_namespace("default", _request_timeout=0.3)
    assert isinstance(held.value.reason, urllib3.exceptions.ReadTimeoutError)
    admin.delete("/_admin/partition")
    assert quick.read_namespace("default").metadata.name == "default"


def _reachable(core: client.CoreV1Api) -> bool:
    try:
        core.read_namespace("default", _request_timeout=1)
    except urllib3.exceptions.HTTPError:
        return False
    return True


def _running_pods(core: client.CoreV1Api, job: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod("vision", label_selector=f"job-name={job}").items
    return [p for p in pods if p.status.phase == "Running"]


def _job_failed(batch: client.BatchV1Api, name: str) -> str:
    job = batch.read_namespaced_job_status(name, "vision")
    failed = [c for c in job.status.conditions or () if c.type == "Failed" and c.status == "True"]
    return str(failed[0].reason) if failed else ""


def test_node_not_ready_taints_the_node_and_evicts_its_pods(
    admin: httpx.Client, batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    node = "east-1-h100-i0-n3"
    job = queued_job("on-lost-node", duration="1h", node_selector={"kubernetes.io/hostname": node})
    # Tolerate the unreachable node for 10 s (0.1 s at this cluster's 1/100 speed).
    job["spec"]["template"]["spec"]["tolerations"].append(
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 10,
        }
    )
    batch.create_namespaced_job("vision", job)
    pod = wait_for(lambda: _running_pods(core, "on-lost-node"))[0]
    assert pod.spec.node_name == node

    admin.post(f"/_admin/nodes/{node}/ready", json={"ready": False}).raise_for_status()
    lost = core.read_node(node)
    ready = next(c for c in lost.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("Unknown", "NodeStatusUnknown")
    assert {(t.key, t.effect) for t in lost.spec.taints} >= {
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoSchedule"),
    }
    assert wait_for(lambda: _job_failed(batch, "on-lost-node")) == "BackoffLimitExceeded"

    admin.post(f"/_admin/nodes/{node}/ready", json={"ready": True}).raise_for_status()
    healed = core.read_node(node)
    assert not [t for t in healed.spec.taints or () if t.key == "node.kubernetes.io/unreachable"]


def test_injected_pod_failure_fails_the_job_and_finishes_its_workload(
    admin: httpx.Client, batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    batch.create_namespaced_job("vision", queued_job("doomed", duration="1h"))
    pod = wait_for(lambda: _running_pods(core, "doomed"))[0]
    response = admin.post(
        f"/_admin/pods/vision/{pod.metadata.name}/fail", json={"exitCode": 3, "reason": "OOMKilled"}
    )
    assert response.json()["status"]["phase"] == "Failed"
    terminated = response.json()["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "OOMKilled")
    assert wait_for(lambda: _job_failed(batch, "doomed")) == "BackoffLimitExceeded"

    def finished() -> dict[str, Any] | None:
        workloads = client.CustomObjectsApi(batch.api_client).list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", "vision", "workloads"
        )["items"]
        for workload in workloads:
            if workload["metadata"]["ownerReferences"][0]["name"] != "doomed":
                continue
            for condition in (workload.get("status") or {}).get("conditions") or ():
                if condition["type"] == "Finished" and condition["status"] == "True":
                    return dict(condition)
        return None

    assert wait_for(finished)["reason"] == "Failed"


def test_sim_exit_annotation_makes_a_job_fail_on_its_own(
    batch: client.BatchV1Api,
) -> None:
    batch.create_namespaced_job("vision", queued_job("exits", duration="10s", exit_code=2))
    assert wait_for(lambda: _job_failed(batch, "exits")) == "BackoffLimitExceeded"
