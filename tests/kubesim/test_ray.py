"""The stand-in's KubeRay controllers through the official client over HTTP: a
RayCluster comes up ``ready``; a RayJob brings up its cluster, then its submitter,
and ends ``SUCCEEDED`` / ``Complete`` (or ``FAILED`` / ``Failed``), its cluster deleted
after; a suspended RayJob holds nothing until it is let go (docs/kubesim-serving.md).

The RayJob is KubeRay's ``ray-operator/config/samples/ray-job.sample.yaml``
(``rayjob-sample``), re-expressed: the same head and ``small-group`` worker group, with
a submitter pod template (the centre requires one) and a simulated run time on it, and
without the ConfigMap volume of the sample's code.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.kubesim.store import Event
from sim.kubesim.testing import RunningCluster, running_cluster
from tests.waiting import wait_for

NS = "default"
RAY = ("ray.io", "v1")

FLEET = """
resourceFlavors:
  - name: cpu
    nodeLabels: {example.com/pool: cpu}
clusters:
  - name: ray-1
    nodeGroups:
      - {flavor: cpu, islands: 1, nodesPerIsland: 2, allocatable: {cpu: 64, memory: 256Gi}}
"""

RAY_JOB = """
apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: rayjob-sample
spec:
  entrypoint: python /home/ray/samples/sample_code.py
  shutdownAfterJobFinishes: true
  ttlSecondsAfterFinished: 10
  runtimeEnvYAML: |
    pip:
      - requests==2.26.0
      - pendulum==2.1.2
    env_vars:
      counter_name: "test_counter"
  submitterPodTemplate:
    metadata:
      annotations: {quartermaster.dev/sim-duration: 60s}
    spec:
      restartPolicy: Never
      containers:
        - name: ray-job-submitter
          image: rayproject/ray:2.46.0
          resources: {requests: {cpu: 500m, memory: 200Mi}}
  rayClusterSpec:
    rayVersion: '2.46.0'
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
            - name: ray-head
              image: rayproject/ray:2.46.0
              ports:
                - {containerPort: 6379, name: gcs-server}
                - {containerPort: 8265, name: dashboard}
                - {containerPort: 10001, name: client}
              resources:
                limits: {cpu: "1"}
                requests: {cpu: 200m}
    workerGroupSpecs:
      - replicas: 1
        minReplicas: 1
        maxReplicas: 5
        groupName: small-group
        rayStartParams: {}
        template:
          spec:
            containers:
              - name: ray-worker
                image: rayproject/ray:2.46.0
                resources:
                  limits: {cpu: "1"}
                  requests: {cpu: 200m}
"""

Obj = dict[str, Any]


@pytest.fixture
def member() -> Iterator[RunningCluster]:
    with running_cluster(FLEET, name="ray-1", tls=False, time_scale=0.01) as cluster:
        yield cluster


@pytest.fixture
def api(member: RunningCluster) -> Iterator[client.ApiClient]:
    with member.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _get(custom: client.CustomObjectsApi, plural: str, name: str) -> Obj | None:
    try:
        return dict(custom.get_namespaced_custom_object(*RAY, NS, plural, name))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _status(custom: client.CustomObjectsApi, name: str = "rayjob-sample") -> Obj:
    return (_get(custom, "rayjobs", name) or {}).get("status") or {}


def record(member: RunningCluster) -> list[tuple[str, str, str, str]]:
    """Every write from now on, in store order: (resource, type, name, RayCluster state)."""
    seen: list[tuple[str, str, str, str]] = []

    def listen(rtype: Any, event: Event) -> None:
        state = (
            (event.obj.get("status") or {}).get("state", "")
            if rtype.key == "rayclusters.ray.io"
            else ""
        )
        seen.append((rtype.key, event.type, event.obj["metadata"]["name"], state))

    member.run(lambda: member.cluster.store.listeners.append(listen))
    return seen


def _ray_cluster(rayjob: Obj) -> Obj:
    cluster = copy.deepcopy(rayjob["spec"]["rayClusterSpec"])
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "raycluster-sample"},
        "spec": cluster,
    }


def test_a_raycluster_comes_up_ready(
    custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    body = _ray_cluster(yaml.safe_load(RAY_JOB))
    body["spec"]["workerGroupSpecs"][0].update(replicas=2, numOfHosts=2)
    custom.create_namespaced_custom_object(*RAY, NS, "rayclusters", body)
    cluster = wait_for(
        lambda: (
            (c := _get(custom, "rayclusters", "raycluster-sample"))
            and (c.get("status") or {}).get("state") == "ready"
            and c
        ),
        what="raycluster-sample ready",
    )
    status = cluster["status"]
    assert status["desiredWorkerReplicas"] == 4 and status["readyWorkerReplicas"] == 4
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["HeadPodReady"]["status"] == "True"
    assert conditions["RayClusterProvisioned"]["status"] == "True"
    pods = core.list_namespaced_pod(NS, label_selector="ray.io/cluster=raycluster-sample").items
    heads = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "head"]
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    assert len(heads) == 1 and heads[0].metadata.name.startswith("raycluster-sample-head-")
    assert status["head"]["podName"] == heads[0].metadata.name
    assert len(workers) == 4
    assert all(p.metadata.name.startswith("raycluster-sample-small-group-worker-") for p in workers)


def test_a_rayjob_runs_its_cluster_then_its_submitter_to_success(
    custom: client.CustomObjectsApi, core: client.CoreV1Api, member: RunningCluster
) -> None:
    seen = record(member)
    custom.create_namespaced_custom_object(*RAY, NS, "rayjobs", yaml.safe_load(RAY_JOB))
    running = wait_for(
        lambda: _status(custom).get("jobDeploymentStatus") == "Running" and _status(custom),
        what="rayjob Running",
        seen=lambda: _status(custom),
    )
    cluster_name = running["rayClusterName"]
    assert cluster_name.startswith("rayjob-sample-")
    cluster = _get(custom, "rayclusters", cluster_name)
    assert cluster is not None and cluster["status"]["state"] == "ready"
    assert cluster["metadata"]["ownerReferences"][0]["kind"] == "RayJob"
    assert running["dashboardURL"].endswith(":8265")
    submitter = client.BatchV1Api(core.api_client).read_namespaced_job("rayjob-sample", NS)
    assert submitter.metadata.owner_references[0].kind == "RayJob"
    ready_at = next(
        i
        for i, (key, kind, _, state) in enumerate(seen)
        if key == "rayclusters.ray.io" and state == "ready"
    )
    submitted_at = seen.index(("jobs.batch", "ADDED", "rayjob-sample", ""))
    head_at = next(i for i, e in enumerate(seen) if e[0] == "pods" and "-head-" in e[2])
    assert head_at < ready_at < submitted_at
    wait_for(
        lambda: _status(custom).get("jobStatus") == "RUNNING",
        what="the Ray job RUNNING",
        seen=lambda: _status(custom),
    )
    done = wait_for(
        lambda: _status(custom).get("jobDeploymentStatus") == "Complete" and _status(custom),
        what="rayjob Complete",
        seen=lambda: _status(custom),
    )
    assert done["jobStatus"] == "SUCCEEDED" and done["succeeded"] == 1
    assert done["endTime"] >= done["startTime"]
    wait_for(
        lambda: _get(custom, "rayclusters", cluster_name) is None,
        what="the cluster deleted after ttlSecondsAfterFinished",
    )
    heads = core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={cluster_name}").items
    assert all(p.metadata.deletion_timestamp for p in heads)


def test_a_rayjob_whose_entrypoint_fails_is_failed(custom: client.CustomObjectsApi) -> None:
    body = yaml.safe_load(RAY_JOB)
    body["spec"]["submitterPodTemplate"]["metadata"]["annotations"][
        "quartermaster.dev/sim-exit"
    ] = "1"
    body["spec"]["submitterConfig"] = {"backoffLimit": 0}
    custom.create_namespaced_custom_object(*RAY, NS, "rayjobs", body)
    failed = wait_for(
        lambda: _status(custom).get("jobDeploymentStatus") == "Failed" and _status(custom),
        what="rayjob Failed",
        seen=lambda: _status(custom),
    )
    assert failed["jobStatus"] == "FAILED" and failed["reason"] == "AppFailed"
    assert failed["failed"] == 1


def test_a_suspended_rayjob_holds_nothing_until_resumed(
    custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    body = yaml.safe_load(RAY_JOB)
    body["spec"]["suspend"] = True
    custom.create_namespaced_custom_object(*RAY, NS, "rayjobs", body)
    suspended = wait_for(
        lambda: _status(custom).get("jobDeploymentStatus") == "Suspended" and _status(custom),
        what="rayjob Suspended",
        seen=lambda: _status(custom),
    )
    assert suspended["rayClusterName"] == ""
    assert custom.list_namespaced_custom_object(*RAY, NS, "rayclusters")["items"] == []
    assert core.list_namespaced_pod(NS).items == []
    custom.patch_namespaced_custom_object(
        *RAY, NS, "rayjobs", "rayjob-sample", {"spec": {"suspend": False}}
    )
    done = wait_for(
        lambda: _status(custom).get("jobDeploymentStatus") == "Complete" and _status(custom),
        what="rayjob Complete after resume",
        seen=lambda: _status(custom),
    )
    assert done["jobStatus"] == "SUCCEEDED"


def test_a_running_rayjob_suspended_gives_back_its_cluster(
    custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    body = yaml.safe_load(RAY_JOB)
    body["spec"]["submitterPodTemplate"]["metadata"]["annotations"][
        "quartermaster.dev/sim-duration"
    ] = "1h"
    custom.create_namespaced_custom_object(*RAY, NS, "rayjobs", body)
    wait_for(lambda: _status(custom).get("jobStatus") == "RUNNING", what="RUNNING")
    custom.patch_namespaced_custom_object(
        *RAY, NS, "rayjobs", "rayjob-sample", {"spec": {"suspend": True}}
    )
    wait_for(
        lambda: _status(custom).get("jobDeploymentStatus") == "Suspended",
        what="Suspended",
        seen=lambda: _status(custom),
    )
    assert custom.list_namespaced_custom_object(*RAY, NS, "rayclusters")["items"] == []
    batch = client.BatchV1Api(core.api_client)
    assert batch.list_namespaced_job(NS).items == []
