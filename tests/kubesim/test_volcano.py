"""A Volcano member: Volcano's CRDs served and validated, and the Volcano-like scheduler
and Job controller, through the official client over HTTP.

The member has two fabric islands of two 8-GPU nodes each (no HyperNodes unless a test
makes them, so the island label stands in for tier 1). Pods that hold a node for the
length of a test ("blockers") are the default scheduler's, pinned by hostname, and
deleted when the test wants their room back. The Volcano Job is Volcano's own
``example/job.yaml`` (volcano-sh/volcano), re-expressed: the same tasks, gang and
queue, without the volumes, plugins and priority class the stand-in does not model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.fleet import FleetError, load_fleet
from sim.kubesim.testing import RunningCluster, running_clusters
from tests.kubesim.conftest import status_body
from tests.waiting import wait_for

SCHEDULING = ("scheduling.volcano.sh", "v1beta1")
BATCH = ("batch.volcano.sh", "v1alpha1")
TOPOLOGY = ("topology.volcano.sh", "v1alpha1")
NS = "default"
ISLAND = "example.com/fabric-block"

FLEET = """
topologies:
  - name: gpu-fabric
    levels: [example.com/fabric-block, kubernetes.io/hostname]
resourceFlavors:
  - name: h100
    nodeLabels: {example.com/gpu: h100}
    topologyName: gpu-fabric
clusters:
  - name: vc-1
    backend: volcano
    nodeGroups:
      - {flavor: h100, islands: 2, nodesPerIsland: 2,
         allocatable: {cpu: 96, memory: 1Ti, nvidia.com/gpu: 8}}
  - name: kq-1
    nodeGroups:
      - {flavor: h100, islands: 1, nodesPerIsland: 2,
         allocatable: {cpu: 96, memory: 1Ti, nvidia.com/gpu: 8}}
"""

#: volcano-sh/volcano example/job.yaml, re-expressed (see the module docstring).
EXAMPLE_JOB = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: test-job
spec:
  minAvailable: 3
  schedulerName: volcano
  policies:
    - event: PodEvicted
      action: RestartJob
  maxRetry: 5
  queue: default
  tasks:
    - replicas: 6
      name: "default-nginx"
      template:
        metadata:
          name: web
          annotations: {quartermaster.dev/sim-duration: 5s}
        spec:
          containers:
            - image: nginx
              imagePullPolicy: IfNotPresent
              name: nginx
              resources:
                requests:
                  cpu: "1"
          restartPolicy: OnFailure
"""

Obj = dict[str, Any]


@pytest.fixture
def members() -> Iterator[list[RunningCluster]]:
    """A fresh Volcano member (and a Kueue one) per test: capacity is the subject."""
    with running_clusters(FLEET, ("vc-1", "kq-1"), tls=False, time_scale=0.01) as clusters:
        yield clusters


@pytest.fixture
def api(members: list[RunningCluster]) -> Iterator[client.ApiClient]:
    with members[0].api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


# -- builders ------------------------------------------------------------------------------


def _node(island: int, k: int) -> str:
    return f"vc-1-h100-i{island}-n{k}"


def _pod(name: str, group: str | None, gpus: int = 8, node: str | None = None) -> Obj:
    spec: Obj = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "train",
                "image": "registry.example/train:1",
                "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "4"}},
            }
        ],
    }
    metadata: Obj = {"name": name, "annotations": {"quartermaster.dev/sim-duration": "1h"}}
    if group is not None:
        spec["schedulerName"] = "volcano"
        metadata["annotations"]["scheduling.k8s.io/group-name"] = group
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _podgroup(name: str, members: int, gpus: int, **spec: Any) -> Obj:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {
            "minMember": members,
            "minResources": {"nvidia.com/gpu": str(gpus), "cpu": str(4 * members)},
            **spec,
        },
    }


def _create_group(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, group: Obj, size: int
) -> list[str]:
    name = group["metadata"]["name"]
    custom.create_namespaced_custom_object(*SCHEDULING, NS, "podgroups", group)
    pods = [f"{name}-{i}" for i in range(size)]
    for pod in pods:
        core.create_namespaced_pod(NS, _pod(pod, name))
    return pods


def _block(core: client.CoreV1Api, *nodes: str) -> list[str]:
    """A default-scheduler pod holding all 8 GPUs of each node, until deleted."""
    names = []
    for node in nodes:
        name = f"blocker-{node}"
        core.create_namespaced_pod(NS, _pod(name, None, node=node))
        names.append(name)
    wait_for(lambda: all(_node_of(core, n) for n in names), what="blockers bound")
    return names


def _node_of(core: client.CoreV1Api, pod: str) -> str | None:
    node: str | None = core.read_namespaced_pod(pod, NS).spec.node_name
    return node


def _group(custom: client.CustomObjectsApi, name: str) -> Obj:
    found: Obj = custom.get_namespaced_custom_object(*SCHEDULING, NS, "podgroups", name)
    return found


def _phase(custom: client.CustomObjectsApi, name: str) -> str:
    return str((_group(custom, name).get("status") or {}).get("phase", ""))


def _condition(custom: client.CustomObjectsApi, name: str, type_: str) -> Obj | None:
    for entry in (_group(custom, name).get("status") or {}).get("conditions") or ():
        if entry["type"] == type_ and entry["status"] == "True":
            found: Obj = entry
            return found
    return None


def _event_reasons(core: client.CoreV1Api, name: str) -> set[str]:
    events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}")
    return {event.reason for event in events.items}


def _labels(core: client.CoreV1Api, node: str) -> dict[str, str]:
    labels: dict[str, str] = core.read_node(node).metadata.labels
    return labels


# -- discovery and schemas -----------------------------------------------------------------


def test_a_volcano_member_serves_volcanos_kinds_and_not_kueues(
    members: list[RunningCluster],
) -> None:
    served = {}
    for member in members:
        with member.api_client() as api_client:
            groups = client.ApisApi(api_client).get_api_versions().groups
            served[member.name] = {group.name for group in groups}
    volcano = {"scheduling.volcano.sh", "batch.volcano.sh", "topology.volcano.sh"}
    assert volcano <= served["vc-1"]
    assert "kueue.x-k8s.io" not in served["vc-1"]
    assert "kueue.x-k8s.io" in served["kq-1"]
    assert not volcano & served["kq-1"]


def test_the_fleet_file_names_a_members_backend_and_refuses_an_unknown_one() -> None:
    fleet = load_fleet(FLEET)
    assert (fleet.backend("vc-1"), fleet.backend("kq-1")) == ("volcano", "kueue")
    with pytest.raises(FleetError, match="backend 'slurm' is not one of kueue, volcano"):
        load_fleet(FLEET.replace("backend: volcano", "backend: slurm"))


def test_volcano_installs_its_default_queue_and_the_crd_defaults_apply(
    custom: client.CustomObjectsApi,
) -> None:
    queue = custom.get_cluster_custom_object(*SCHEDULING, "queues", "default")
    assert queue["spec"]["weight"] == 1
    created = custom.create_namespaced_custom_object(
        *SCHEDULING, NS, "podgroups", _podgroup("defaults", 1, 8, networkTopology={})
    )
    assert created["spec"]["queue"] == "default"
    assert created["spec"]["networkTopology"]["mode"] == "hard"


@pytest.mark.parametrize(
    ("plural", "obj", "field", "message"),
    [
        (
            "podgroups",
            _podgroup("strict", 2, 16, networkTopology={"mode": "strict"}),
            "spec.networkTopology.mode",
            'Unsupported value: "strict"',
        ),
        ("podgroups", _podgroup("negative", -1, 8), "spec.minMember", "greater than or equal to 0"),
        (
            "queues",
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "Queue",
                "metadata": {"name": "weightless"},
                "spec": {"weight": 0},
            },
            "spec.weight",
            "greater than or equal to 1",
        ),
        (
            "hypernodes",
            {
                "apiVersion": "topology.volcano.sh/v1alpha1",
                "kind": "HyperNode",
                "metadata": {"name": "tierless"},
                "spec": {"members": [{"type": "Node", "selector": {"exactMatch": {"name": "x"}}}]},
            },
            "spec.tier",
            "Required value",
        ),
    ],
)
def test_the_volcano_crd_schemas_refuse_what_a_real_server_refuses(
    custom: client.CustomObjectsApi, plural: str, obj: Obj, field: str, message: str
) -> None:
    group, version = obj["apiVersion"].split("/")
    with pytest.raises(ApiException) as invalid:
        if plural == "podgroups":
            custom.create_namespaced_custom_object(group, version, NS, plural, obj)
        else:
            custom.create_cluster_custom_object(group, version, plural, obj)
    body = status_body(invalid.value)
    assert (invalid.value.status, body["reason"]) == (422, "Invalid")
    causes = {cause["field"]: cause["message"] for cause in body["details"]["causes"]}
    assert message in causes[field], causes


def test_volcanos_job_webhook_refuses_a_gang_larger_than_its_tasks(
    custom: client.CustomObjectsApi,
) -> None:
    job = yaml.safe_load(EXAMPLE_JOB)
    job["spec"]["minAvailable"] = 7
    with pytest.raises(ApiException) as denied:
        custom.create_namespaced_custom_object(*BATCH, NS, "jobs", job)
    assert denied.value.status == 400
    assert "should not be greater than total replicas" in status_body(denied.value)["message"]
    job["spec"]["queue"] = "nowhere"
    job["spec"]["minAvailable"] = 3
    with pytest.raises(ApiException) as unknown:
        custom.create_namespaced_custom_object(*BATCH, NS, "jobs", job)
    assert "unable to find job queue" in status_body(unknown.value)["message"]


# -- the scheduler -------------------------------------------------------------------------


def test_a_gang_of_four_is_bound_whole_or_not_at_all(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    blockers = _block(core, _node(1, 1))  # three nodes free: three of the four pods would fit
    pods = _create_group(core, custom, _podgroup("gang", 4, 32), 4)

    unschedulable = wait_for(
        lambda: _condition(custom, "gang", "Unschedulable"), what="gang found unschedulable"
    )
    assert unschedulable["reason"] == "NotEnoughResources"
    assert "4/4 tasks in gang unschedulable" in unschedulable["message"]
    assert "Insufficient nvidia.com/gpu" in unschedulable["message"]
    assert _phase(custom, "gang") == "Inqueue"
    assert [_node_of(core, pod) for pod in pods] == [None] * 4
    assert "Unschedulable" in _event_reasons(core, "gang")

    core.delete_namespaced_pod(blockers[0], NS)
    wait_for(lambda: _phase(custom, "gang") == "Running", what="gang running")
    nodes = [_node_of(core, pod) for pod in pods]
    assert sorted(n for n in nodes if n) == sorted(_node(i, k) for i in (0, 1) for k in (0, 1))
    assert _condition(custom, "gang", "Scheduled") is not None
    assert _condition(custom, "gang", "Unschedulable") is None
    assert {"Unschedulable", "Scheduled"} <= _event_reasons(core, "gang")
    wait_for(
        lambda: all(core.read_namespaced_pod(p, NS).status.phase == "Running" for p in pods),
        what="the kubelet runs the gang",
    )
    assert wait_for(lambda: _group(custom, "gang")["status"].get("running") == 4)


def test_a_hard_topology_gang_waits_for_one_island_though_the_cluster_has_room(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    blockers = _block(core, _node(0, 0), _node(1, 0))  # one free node in each island
    topology = {"mode": "hard", "highestTierAllowed": 1}
    pods = _create_group(core, custom, _podgroup("ring", 2, 16, networkTopology=topology), 2)

    waiting = wait_for(
        lambda: _condition(custom, "ring", "Unschedulable"), what="ring found unschedulable"
    )
    assert "tier-1" in waiting["message"]
    assert [_node_of(core, pod) for pod in pods] == [None, None]

    # The same gang without the topology fits the cluster as it is: the wait was the island's.
    loose = _create_group(core, custom, _podgroup("loose", 2, 16), 2)
    wait_for(lambda: _phase(custom, "loose") == "Running", what="loose gang running")
    islands = {_labels(core, str(_node_of(core, pod)))[ISLAND] for pod in loose}
    assert len(islands) == 2
    assert [_node_of(core, pod) for pod in pods] == [None, None]

    for pod in [*loose, blockers[1]]:
        core.delete_namespaced_pod(pod, NS)
    wait_for(lambda: _phase(custom, "ring") == "Running", what="ring running")
    nodes = [str(_node_of(core, pod)) for pod in pods]
    assert sorted(nodes) == [_node(1, 0), _node(1, 1)]
    assert {_labels(core, node)[ISLAND] for node in nodes} == {"vc-1-h100-i1"}


def test_tier_one_hypernodes_decide_the_domain_where_a_member_has_them(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    """HyperNodes that cut across the island labels: the gang follows the HyperNodes."""
    for index in (0, 1):
        members = [
            {"type": "Node", "selector": {"exactMatch": {"name": _node(island, index)}}}
            for island in (0, 1)
        ]
        hypernode = {
            "apiVersion": "topology.volcano.sh/v1alpha1",
            "kind": "HyperNode",
            "metadata": {"name": f"leaf-{index}"},
            "spec": {"tier": 1, "members": members},
        }
        custom.create_cluster_custom_object(*TOPOLOGY, "hypernodes", hypernode)
    _block(core, _node(0, 0))
    topology = {"mode": "hard", "highestTierAllowed": 1}
    pods = _create_group(core, custom, _podgroup("cross", 2, 16, networkTopology=topology), 2)
    wait_for(lambda: _phase(custom, "cross") == "Running", what="cross gang running")
    assert sorted(str(_node_of(core, pod)) for pod in pods) == [_node(0, 1), _node(1, 1)]


def test_a_gang_part_of_which_runs_while_the_rest_cannot_be_placed_is_unknown(
    members: list[RunningCluster], core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    pods = _create_group(core, custom, _podgroup("pair", 2, 16), 2)
    wait_for(
        lambda: all(core.read_namespaced_pod(p, NS).status.phase == "Running" for p in pods),
        what="the pair runs",
    )
    members[0].fail_pod(NS, pods[0])  # restartPolicy Never: the pod stays Failed
    wait_for(lambda: _group(custom, "pair")["status"].get("failed") == 1, what="one failed")
    assert _phase(custom, "pair") == "Running"  # a failed pod still counts as allocated

    # Its replacement asks for more than any node has: the gang is short and part of it runs.
    core.create_namespaced_pod(NS, _pod("pair-2", "pair", gpus=16))
    wait_for(lambda: _phase(custom, "pair") == "Unknown", what="the pair unknown")
    status = _group(custom, "pair")["status"]
    assert (status["running"], status["failed"]) == (1, 1)
    assert _node_of(core, "pair-2") is None
    queue = custom.get_cluster_custom_object(*SCHEDULING, "queues", "default")["status"]
    assert queue["allocated"]["nvidia.com/gpu"] == "16"


def test_a_queues_capability_holds_a_rival_group_pending(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "team-a"},
        "spec": {"weight": 1, "capability": {"nvidia.com/gpu": "16"}},
    }
    custom.create_cluster_custom_object(*SCHEDULING, "queues", queue)
    first = _create_group(core, custom, _podgroup("first", 2, 16, queue="team-a"), 2)
    wait_for(lambda: _phase(custom, "first") == "Running", what="first group running")

    rival = _create_group(core, custom, _podgroup("rival", 1, 8, queue="team-a"), 1)
    denied = wait_for(
        lambda: _condition(custom, "rival", "Unschedulable"), what="rival refused by its queue"
    )
    assert denied["reason"] == "NotInqueueable"
    assert "capability" in denied["message"]
    assert _phase(custom, "rival") == "Pending"
    assert _node_of(core, rival[0]) is None  # though two nodes stand empty
    assert "Uninqueueable" in _event_reasons(core, "rival")
    status = custom.get_cluster_custom_object(*SCHEDULING, "queues", "team-a")["status"]
    assert (status["state"], status["running"], status["pending"]) == ("Open", 1, 1)
    assert status["allocated"]["nvidia.com/gpu"] == "16"

    # The centre preempts a gang as a whole: its PodGroup goes with its pods.
    custom.delete_namespaced_custom_object(*SCHEDULING, NS, "podgroups", "first")
    for pod in first:
        core.delete_namespaced_pod(pod, NS)
    wait_for(lambda: _phase(custom, "rival") == "Running", what="rival running once room")
    assert _node_of(core, rival[0]) is not None


def _close_command(queue: Obj, name: str, action: str = "CloseQueue") -> Obj:
    """A Command as ``vcctl queue operate --action close`` makes one."""
    meta = queue["metadata"]
    target = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    return {
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {"name": name, "ownerReferences": [target]},
        "target": target,
        "action": action,
    }


def _queue_state(custom: client.CustomObjectsApi, name: str) -> str:
    queue = custom.get_cluster_custom_object(*SCHEDULING, "queues", name)
    return str((queue.get("status") or {}).get("state", ""))


def test_a_queue_is_deleted_only_once_closed_and_closes_when_its_groups_are_gone(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    queue = custom.create_cluster_custom_object(
        *SCHEDULING,
        "queues",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": "team-b"},
            "spec": {"weight": 1},
        },
    )
    pods = _create_group(core, custom, _podgroup("held", 1, 8, queue="team-b"), 1)
    wait_for(lambda: _phase(custom, "held") == "Running", what="the group running")
    with pytest.raises(ApiException) as refused:
        custom.delete_cluster_custom_object(*SCHEDULING, "queues", "team-b")
    assert refused.value.status == 400
    assert "only queue with state `Closed` can be deleted" in str(refused.value.body)
    assert "validatequeue.volcano.sh" in str(refused.value.body)

    custom.create_namespaced_custom_object(
        "bus.volcano.sh", "v1alpha1", NS, "commands", _close_command(queue, "close-b")
    )
    wait_for(lambda: _queue_state(custom, "team-b") == "Closing", what="Closing while it holds")
    wait_for(
        lambda: (
            not custom.list_namespaced_custom_object("bus.volcano.sh", "v1alpha1", NS, "commands")[
                "items"
            ]
        ),
        what="the command taken",
    )
    late = _create_group(core, custom, _podgroup("late", 1, 8, queue="team-b"), 1)
    denied = wait_for(
        lambda: _condition(custom, "late", "Unschedulable"), what="a closing queue takes none"
    )
    assert denied["reason"] == "NotInqueueable"
    for name, members in (("held", pods), ("late", late)):
        custom.delete_namespaced_custom_object(*SCHEDULING, NS, "podgroups", name)
        for pod in members:
            core.delete_namespaced_pod(pod, NS)
    wait_for(lambda: _queue_state(custom, "team-b") == "Closed", what="Closed once empty")
    custom.delete_cluster_custom_object(*SCHEDULING, "queues", "team-b")
    with pytest.raises(ApiException) as gone:
        custom.get_cluster_custom_object(*SCHEDULING, "queues", "team-b")
    assert gone.value.status == 404

    with pytest.raises(ApiException) as kept:
        custom.delete_cluster_custom_object(*SCHEDULING, "queues", "default")
    assert kept.value.status == 400
    assert "`default` queue can not be deleted" in str(kept.value.body)


def test_volcanos_example_job_runs_to_completed(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    created = custom.create_namespaced_custom_object(
        *BATCH, NS, "jobs", yaml.safe_load(EXAMPLE_JOB)
    )
    group = f"test-job-{created['metadata']['uid']}"

    def job_phase() -> str:
        job = custom.get_namespaced_custom_object(*BATCH, NS, "jobs", "test-job")
        return str(((job.get("status") or {}).get("state") or {}).get("phase", ""))

    assert wait_for(lambda: job_phase() in ("Running", "Completed"), what="job running")
    podgroup = _group(custom, group)
    assert podgroup["spec"]["minMember"] == 3
    assert podgroup["spec"]["minResources"]["cpu"] == "3"
    assert podgroup["metadata"]["ownerReferences"][0]["name"] == "test-job"
    pods = core.list_namespaced_pod(NS, label_selector="volcano.sh/job-name=test-job").items
    assert sorted(p.metadata.name for p in pods) == [
        f"test-job-default-nginx-{i}" for i in range(6)
    ]
    assert {p.metadata.annotations["scheduling.k8s.io/group-name"] for p in pods} == {group}
    assert {p.spec.scheduler_name for p in pods} == {"volcano"}

    wait_for(lambda: job_phase() == "Completed", what="job completed")
    job = custom.get_namespaced_custom_object(*BATCH, NS, "jobs", "test-job")
    assert (job["status"]["succeeded"], job["status"]["minAvailable"]) == (6, 3)
    assert [c["status"] for c in job["status"]["conditions"]][-1] == "Completed"
    wait_for(lambda: _phase(custom, group) == "Completed", what="its PodGroup completed")


def test_a_volcano_job_whose_pods_fail_ends_failed(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    job = yaml.safe_load(EXAMPLE_JOB)
    job["metadata"]["name"] = "doomed"
    task = job["spec"]["tasks"][0]
    task["replicas"] = 3
    task["template"]["metadata"]["annotations"]["quartermaster.dev/sim-exit"] = "1"
    task["template"]["spec"]["restartPolicy"] = "Never"
    created = custom.create_namespaced_custom_object(*BATCH, NS, "jobs", job)

    def state() -> Obj:
        found = custom.get_namespaced_custom_object(*BATCH, NS, "jobs", "doomed")
        return dict(found.get("status") or {})

    wait_for(lambda: state().get("state", {}).get("phase") == "Failed", what="job failed")
    assert (state()["failed"], state()["succeeded"]) == (3, 0)
    group = f"doomed-{created['metadata']['uid']}"
    wait_for(lambda: _phase(custom, group) == "Completed", what="its PodGroup released")
    assert _group(custom, group)["status"]["failed"] == 3
