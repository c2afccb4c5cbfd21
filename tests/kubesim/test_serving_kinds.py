"""The stand-in's apps/v1 and LeaderWorkerSet controllers, through the official client
over HTTP: what a serving workload's member cluster does with a Deployment, a
StatefulSet and a LeaderWorkerSet (docs/kubesim-serving.md).

The manifests are each project's own examples, re-expressed: the Deployment and the
StatefulSet of the Kubernetes documentation ("Deployments": ``nginx-deployment``;
"StatefulSets": ``web``), and kubernetes-sigs/lws ``config/samples/
leaderworkerset_v1_leaderworkerset.yaml`` (``leaderworkerset-sample``), with fewer
replicas and without the volumes and Services the stand-in does not serve.
"""

from __future__ import annotations

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
LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")

FLEET = """
resourceFlavors:
  - name: cpu
    nodeLabels: {example.com/pool: cpu}
clusters:
  - name: serve-1
    nodeGroups:
      - {flavor: cpu, islands: 1, nodesPerIsland: 2, allocatable: {cpu: 64, memory: 256Gi}}
"""

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx-deployment
  labels: {app: nginx}
spec:
  replicas: 3
  selector:
    matchLabels: {app: nginx}
  template:
    metadata:
      labels: {app: nginx}
    spec:
      containers:
        - name: nginx
          image: nginx:1.14.2
          ports: [{containerPort: 80}]
          resources: {requests: {cpu: 100m}}
"""

STATEFULSET = """
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  selector:
    matchLabels: {app: nginx-sts}
  serviceName: nginx
  replicas: 3
  template:
    metadata:
      labels: {app: nginx-sts}
    spec:
      terminationGracePeriodSeconds: 10
      containers:
        - name: nginx
          image: registry.k8s.io/nginx-slim:0.24
          ports: [{containerPort: 80, name: web}]
"""

LEADER_WORKER_SET = """
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: leaderworkerset-sample
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 3
    leaderTemplate:
      metadata:
        labels: {role: leader}
      spec:
        containers:
          - name: nginx
            image: nginxinc/nginx-unprivileged:1.27
            resources: {limits: {cpu: 100m}, requests: {cpu: 50m}}
            ports: [{containerPort: 8080}]
    workerTemplate:
      spec:
        containers:
          - name: nginx
            image: nginxinc/nginx-unprivileged:1.27
            resources: {limits: {cpu: 100m}, requests: {cpu: 50m}}
            ports: [{containerPort: 8080}]
"""

Obj = dict[str, Any]


@pytest.fixture
def member() -> Iterator[RunningCluster]:
    with running_cluster(FLEET, name="serve-1", tls=False, time_scale=0.01) as cluster:
        yield cluster


@pytest.fixture
def api(member: RunningCluster) -> Iterator[client.ApiClient]:
    with member.api_client() as api_client:
        yield api_client


@pytest.fixture
def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def record_pods(member: RunningCluster) -> list[tuple[str, str, str, bool]]:
    """Every pod event from now on, in store order: (type, name, phase, ready)."""
    seen: list[tuple[str, str, str, bool]] = []

    def listen(rtype: Any, event: Event) -> None:
        if rtype.key == "pods":
            status = event.obj.get("status") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or ()
            )
            seen.append((event.type, event.obj["metadata"]["name"], status.get("phase", ""), ready))

    member.run(lambda: member.cluster.store.listeners.append(listen))
    return seen


def live_pods(core: client.CoreV1Api, selector: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(NS, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


# -- Deployment ----------------------------------------------------------------------------


def _available(apps: client.AppsV1Api, name: str, replicas: int) -> client.V1Deployment | None:
    deployment = apps.read_namespaced_deployment(name, NS)
    status = deployment.status
    conditions = {c.type: c for c in status.conditions or ()}
    done = (
        status.available_replicas == replicas
        and status.updated_replicas == replicas
        and (status.replicas or 0) == replicas
        and conditions.get("Available") is not None
        and conditions["Available"].status == "True"
        and conditions.get("Progressing") is not None
        and conditions["Progressing"].reason == "NewReplicaSetAvailable"
    )
    return deployment if done else None


def test_deployment_runs_its_replicas_through_a_replica_set(
    apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    apps.create_namespaced_deployment(NS, yaml.safe_load(DEPLOYMENT))
    deployment = wait_for(
        lambda: _available(apps, "nginx-deployment", 3),
        what="nginx-deployment available",
        seen=lambda: apps.read_namespaced_deployment("nginx-deployment", NS).status,
    )
    assert deployment.status.observed_generation == deployment.metadata.generation
    assert deployment.spec.strategy.rolling_update.max_surge == "25%"
    assert deployment.metadata.annotations["deployment.kubernetes.io/revision"] == "1"
    (rs,) = apps.list_namespaced_replica_set(NS, label_selector="app=nginx").items
    digest = rs.metadata.labels["pod-template-hash"]
    assert rs.metadata.name == f"nginx-deployment-{digest}"
    assert rs.metadata.owner_references[0].kind == "Deployment"
    assert rs.spec.selector.match_labels == {"app": "nginx", "pod-template-hash": digest}
    assert rs.status.ready_replicas == 3
    pods = live_pods(core, "app=nginx")
    assert len(pods) == 3
    for pod in pods:
        assert pod.metadata.name.startswith(f"{rs.metadata.name}-")
        assert pod.metadata.owner_references[0].name == rs.metadata.name
        assert pod.status.phase == "Running"
        assert pod.spec.restart_policy == "Always"


def test_the_scale_subresource_scales_up_and_down(
    apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    apps.create_namespaced_deployment(NS, yaml.safe_load(DEPLOYMENT))
    wait_for(lambda: _available(apps, "nginx-deployment", 3), what="3 available")
    scale = apps.read_namespaced_deployment_scale("nginx-deployment", NS)
    assert isinstance(scale, client.V1Scale)
    assert (scale.spec.replicas, scale.status.replicas) == (3, 3)
    assert scale.status.selector == "app=nginx"

    apps.patch_namespaced_deployment_scale("nginx-deployment", NS, {"spec": {"replicas": 5}})
    wait_for(lambda: _available(apps, "nginx-deployment", 5), what="5 available")
    assert len(live_pods(core, "app=nginx")) == 5

    scale = apps.read_namespaced_deployment_scale("nginx-deployment", NS)
    scale.spec.replicas = 1
    apps.replace_namespaced_deployment_scale("nginx-deployment", NS, scale)
    wait_for(lambda: _available(apps, "nginx-deployment", 1), what="1 available")
    assert len(live_pods(core, "app=nginx")) == 1
    assert len(apps.list_namespaced_replica_set(NS).items) == 1  # a scale is no rollout


def test_a_stale_scale_is_a_conflict(apps: client.AppsV1Api) -> None:
    apps.create_namespaced_deployment(NS, yaml.safe_load(DEPLOYMENT))
    scale = apps.read_namespaced_deployment_scale("nginx-deployment", NS)
    apps.patch_namespaced_deployment("nginx-deployment", NS, {"metadata": {"labels": {"a": "b"}}})
    scale.spec.replicas = 2
    with pytest.raises(ApiException) as refused:
        apps.replace_namespaced_deployment_scale("nginx-deployment", NS, scale)
    assert refused.value.status == 409


def test_a_new_template_rolls_out_to_a_new_replica_set(
    apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    apps.create_namespaced_deployment(NS, yaml.safe_load(DEPLOYMENT))
    wait_for(lambda: _available(apps, "nginx-deployment", 3), what="3 available")
    (first,) = apps.list_namespaced_replica_set(NS).items
    apps.patch_namespaced_deployment(
        "nginx-deployment",
        NS,
        {
            "spec": {
                "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.16"}]}}
            }
        },
    )

    def rolled() -> bool:
        sets = {rs.metadata.name: rs for rs in apps.list_namespaced_replica_set(NS).items}
        old = sets.get(first.metadata.name)
        return (
            len(sets) == 2
            and old is not None
            and old.spec.replicas == 0
            and not old.status.replicas
            and _available(apps, "nginx-deployment", 3) is not None
        )

    wait_for(rolled, what="the rollout to the new template")
    deployment = apps.read_namespaced_deployment("nginx-deployment", NS)
    assert deployment.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    images = {p.spec.containers[0].image for p in live_pods(core, "app=nginx")}
    assert images == {"nginx:1.16"}


def test_a_selector_that_misses_the_template_is_refused_by_field(
    apps: client.AppsV1Api,
) -> None:
    body = yaml.safe_load(DEPLOYMENT)
    body["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    with pytest.raises(ApiException) as refused:
        apps.create_namespaced_deployment(NS, body)
    assert refused.value.status == 422
    assert "spec.template.metadata.labels" in refused.value.body


# -- StatefulSet ---------------------------------------------------------------------------


def _sts_ready(apps: client.AppsV1Api, name: str, replicas: int) -> client.V1StatefulSet | None:
    sts = apps.read_namespaced_stateful_set(name, NS)
    status = sts.status
    done = status.replicas == replicas and (status.ready_replicas or 0) == replicas
    return sts if done else None


def test_statefulset_pods_start_in_ordinal_order(
    member: RunningCluster, apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    seen = record_pods(member)
    apps.create_namespaced_stateful_set(NS, yaml.safe_load(STATEFULSET))
    sts = wait_for(lambda: _sts_ready(apps, "web", 3), what="web ready")
    assert sts.status.current_revision == sts.status.update_revision
    pods = {p.metadata.name: p for p in live_pods(core, "app=nginx-sts")}
    assert sorted(pods) == ["web-0", "web-1", "web-2"]
    for index in range(3):
        pod = pods[f"web-{index}"]
        assert pod.metadata.labels["apps.kubernetes.io/pod-index"] == str(index)
        assert pod.spec.hostname == f"web-{index}" and pod.spec.subdomain == "nginx"
    for index in (1, 2):  # OrderedReady: created only once the one before is ready
        created = seen.index(("ADDED", f"web-{index}", "Pending", False))
        before_ready = next(i for i, e in enumerate(seen) if e[1] == f"web-{index - 1}" and e[3])
        assert before_ready < created, seen


def test_statefulset_scales_down_from_the_highest_ordinal(
    member: RunningCluster, apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    apps.create_namespaced_stateful_set(NS, yaml.safe_load(STATEFULSET))
    wait_for(lambda: _sts_ready(apps, "web", 3), what="web ready")
    seen = record_pods(member)
    apps.patch_namespaced_stateful_set_scale("web", NS, {"spec": {"replicas": 1}})
    wait_for(lambda: _sts_ready(apps, "web", 1), what="web at one")
    assert [p.metadata.name for p in live_pods(core, "app=nginx-sts")] == ["web-0"]
    deleted = [name for kind, name, _, _ in seen if kind == "DELETED"]
    assert deleted == ["web-2", "web-1"]


def test_statefulset_recreates_a_deleted_pod_under_its_name(
    apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    body = yaml.safe_load(STATEFULSET)
    body["spec"]["replicas"] = 2
    apps.create_namespaced_stateful_set(NS, body)
    wait_for(lambda: _sts_ready(apps, "web", 2), what="web ready")
    before = core.read_namespaced_pod("web-1", NS).metadata.uid
    core.delete_namespaced_pod("web-1", NS)

    def replaced() -> bool:
        try:
            pod = core.read_namespaced_pod("web-1", NS)
        except ApiException:
            return False
        return pod.metadata.uid != before and _sts_ready(apps, "web", 2) is not None

    wait_for(replaced, what="web-1 created again")


# -- LeaderWorkerSet -----------------------------------------------------------------------


def _lws(custom: client.CustomObjectsApi) -> Obj:
    return dict(custom.get_namespaced_custom_object(*LWS[:2], NS, LWS[2], "leaderworkerset-sample"))


def _lws_available(custom: client.CustomObjectsApi, groups: int) -> Obj | None:
    lws = _lws(custom)
    status = lws.get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or ()}
    available = conditions.get("Available", {}).get("status") == "True"
    return lws if available and status.get("readyReplicas") == groups else None


def test_leaderworkerset_groups_are_a_leader_and_its_workers(
    custom: client.CustomObjectsApi, apps: client.AppsV1Api, core: client.CoreV1Api
) -> None:
    custom.create_namespaced_custom_object(*LWS[:2], NS, LWS[2], yaml.safe_load(LEADER_WORKER_SET))
    lws = wait_for(
        lambda: _lws_available(custom, 2),
        what="two groups ready",
        seen=lambda: _lws(custom).get("status"),
    )
    status = lws["status"]
    assert status["replicas"] == 2
    assert status["hpaPodSelector"] == (
        "leaderworkerset.sigs.k8s.io/name=leaderworkerset-sample,"
        "leaderworkerset.sigs.k8s.io/worker-index=0"
    )
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["status"] == "False"
    pods = {
        p.metadata.name: p
        for p in live_pods(core, "leaderworkerset.sigs.k8s.io/name=leaderworkerset-sample")
    }
    assert sorted(pods) == [
        "leaderworkerset-sample-0",
        "leaderworkerset-sample-0-1",
        "leaderworkerset-sample-0-2",
        "leaderworkerset-sample-1",
        "leaderworkerset-sample-1-1",
        "leaderworkerset-sample-1-2",
    ]
    for group in (0, 1):
        leader = pods[f"leaderworkerset-sample-{group}"]
        assert leader.metadata.labels["role"] == "leader"
        assert leader.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
        key = leader.metadata.labels["leaderworkerset.sigs.k8s.io/group-key"]
        for worker in (1, 2):
            pod = pods[f"leaderworkerset-sample-{group}-{worker}"]
            labels = pod.metadata.labels
            assert labels["leaderworkerset.sigs.k8s.io/group-index"] == str(group)
            assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == str(worker)
            assert labels["leaderworkerset.sigs.k8s.io/group-key"] == key
            assert pod.metadata.annotations["leaderworkerset.sigs.k8s.io/size"] == "3"
        workers = apps.read_namespaced_stateful_set(f"leaderworkerset-sample-{group}", NS)
        assert workers.metadata.owner_references[0].uid == leader.metadata.uid
        assert workers.spec.replicas == 2 and workers.spec.ordinals.start == 1


def test_leaderworkerset_scales_by_whole_groups(
    custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    custom.create_namespaced_custom_object(*LWS[:2], NS, LWS[2], yaml.safe_load(LEADER_WORKER_SET))
    wait_for(lambda: _lws_available(custom, 2), what="two groups ready")
    custom.patch_namespaced_custom_object_scale(
        *LWS[:2], NS, LWS[2], "leaderworkerset-sample", {"spec": {"replicas": 3}}
    )
    wait_for(lambda: _lws_available(custom, 3), what="three groups ready")
    scale = custom.get_namespaced_custom_object_scale(
        *LWS[:2], NS, LWS[2], "leaderworkerset-sample"
    )
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    selector = "leaderworkerset.sigs.k8s.io/name=leaderworkerset-sample"
    assert len(live_pods(core, selector)) == 9
    custom.patch_namespaced_custom_object_scale(
        *LWS[:2], NS, LWS[2], "leaderworkerset-sample", {"spec": {"replicas": 1}}
    )
    wait_for(
        lambda: _lws_available(custom, 1) and len(live_pods(core, selector)) == 3,
        what="one group left",
    )
    names = sorted(p.metadata.name for p in live_pods(core, selector))
    assert names == [
        "leaderworkerset-sample-0",
        "leaderworkerset-sample-0-1",
        "leaderworkerset-sample-0-2",
    ]


def test_a_failed_worker_recreates_its_whole_group(
    member: RunningCluster, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    custom.create_namespaced_custom_object(*LWS[:2], NS, LWS[2], yaml.safe_load(LEADER_WORKER_SET))
    wait_for(lambda: _lws_available(custom, 2), what="two groups ready")
    leader = core.read_namespaced_pod("leaderworkerset-sample-1", NS).metadata.uid
    other = core.read_namespaced_pod("leaderworkerset-sample-0", NS).metadata.uid
    member.fail_pod(NS, "leaderworkerset-sample-1-2")

    def recreated() -> bool:
        try:
            pod = core.read_namespaced_pod("leaderworkerset-sample-1", NS)
        except ApiException:
            return False
        return pod.metadata.uid != leader and _lws_available(custom, 2) is not None

    wait_for(recreated, what="group 1 recreated and ready")
    assert core.read_namespaced_pod("leaderworkerset-sample-0", NS).metadata.uid == other
    restarted = core.read_namespaced_pod("leaderworkerset-sample-1-2", NS)
    assert not restarted.status.container_statuses[0].restart_count
