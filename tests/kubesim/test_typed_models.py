"""The stand-in answers as a real API server does, read through the official client's typed
models (``V1Job``, ``V1Node`` …), which refuse a value of the wrong type.

Objects are written as raw JSON where a client may send what the typed models would refuse
(integer quantities): a real server accepts them and answers canonical strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.kubesim.testing import RunningCluster, running_cluster
from tests.kubesim.conftest import DEMO, status_body
from tests.waiting import wait_for

KUEUE = ("kueue.x-k8s.io", "v1beta2")


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningCluster]:
    """A cluster of this module's own: its objects must not disturb other modules' counts."""
    with running_cluster(DEMO, name="east-1", seed_kueue=True, time_scale=0.01) as cluster:
        yield cluster


def raw(api: client.ApiClient, method: str, path: str, body: Any, **headers: str) -> Any:
    """A request with a JSON body as given (the typed models would refuse integer quantities)."""
    params = api.param_serialize(
        method=method,
        resource_path=path,
        header_params={"Content-Type": "application/json", "Accept": "application/json", **headers},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*params)
    response.read()
    return response.status, json.loads(response.data)


def container(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "image": "registry.example/train:1", "resources": resources}


def assert_server_metadata(metadata: client.V1ObjectMeta, *, generation: int | None) -> None:
    assert metadata.uid
    assert metadata.creation_timestamp.utcoffset() == timedelta(0)
    assert metadata.generation == generation
    for entry in metadata.managed_fields:
        assert entry.time.utcoffset() == timedelta(0)
        assert entry.operation in ("Update", "Apply")


# What apimachinery's Quantity serializes for what a client sent (the input's format kept).
CANONICAL = {
    "example.com/int": (8, "8"),
    "example.com/half": (0.5, "500m"),
    "example.com/one-and-a-half": ("1.5", "1500m"),
    "example.com/thousand": (1000, "1k"),
    "example.com/thousand-text": ("1000", "1k"),
    "example.com/milli": ("1000m", "1"),
    "example.com/gi": ("1Gi", "1Gi"),
    "example.com/mi": ("1024Mi", "1Gi"),
    "example.com/binary-fraction": ("1.5Gi", "1536Mi"),
    "example.com/small-binary": ("0.5Ki", "512"),
    "example.com/exponent": ("1e3", "1e3"),
    "example.com/mega": ("100M", "100M"),
    "example.com/zero": (0, "0"),
}


def test_pod_quantities_are_served_in_canonical_form_and_limits_become_requests(
    sim: RunningCluster,
) -> None:
    limits = {name: sent for name, (sent, _) in CANONICAL.items()}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "quantities"},
        "spec": {"restartPolicy": "Never", "containers": [container("main", {"limits": limits})]},
    }
    with sim.api_client() as api:
        code, _ = raw(api, "POST", "/api/v1/namespaces/default/pods", pod)
        assert code == 201
        read = client.CoreV1Api(api).read_namespaced_pod("quantities", "default")
    expected = {name: served for name, (_, served) in CANONICAL.items()}
    resources = read.spec.containers[0].resources
    assert resources.limits == expected
    assert resources.requests == expected, "SetDefaults_Pod requests what is limited"
    assert_server_metadata(read.metadata, generation=None)  # a v1.32 Pod has no generation


def test_a_job_with_integer_quantities_reads_as_a_typed_job(sim: RunningCluster) -> None:
    """The official client's own failure (issue 17): ``limits.nvidia.com/gpu`` must be a string."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "integers"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        container("train", {"limits": {"nvidia.com/gpu": 8, "cpu": 0.5}})
                    ],
                }
            }
        },
    }
    with sim.api_client() as api:
        code, _ = raw(api, "POST", "/apis/batch/v1/namespaces/default/jobs", job)
        assert code == 201
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        read = batch.read_namespaced_job("integers", "default")
        assert [j.metadata.name for j in batch.list_namespaced_job("default").items] == ["integers"]
        pods = wait_for(
            lambda: core.list_namespaced_pod("default", label_selector="job-name=integers").items
        )
    spec = read.spec
    resources = spec.template.spec.containers[0].resources
    assert resources.limits == {"nvidia.com/gpu": "8", "cpu": "500m"}
    assert resources.requests is None, "a pod template's requests are not defaulted"
    assert pods[0].spec.containers[0].resources.requests == resources.limits, "its pods' are"
    assert (spec.completions, spec.parallelism, spec.backoff_limit) == (1, 1, 6)
    assert (spec.completion_mode, spec.suspend, spec.pod_replacement_policy) == (
        "NonIndexed",
        False,
        "TerminatingOrFailed",
    )
    template = spec.template.spec
    assert (template.dns_policy, template.termination_grace_period_seconds) == ("ClusterFirst", 30)
    assert template.scheduler_name == "default-scheduler"
    assert template.service_account_name is None, "set on Pods by admission, not on templates"
    assert_server_metadata(read.metadata, generation=1)


def test_job_defaults_follow_its_backoff_and_failure_policies(batch: client.BatchV1Api) -> None:
    """``SetDefaults_Job``: a per-index backoff limit lifts the global one to MaxInt32, and a
    pod failure policy replaces pods only once they failed."""
    template = client.V1PodTemplateSpec(
        spec=client.V1PodSpec(
            restart_policy="Never",
            containers=[client.V1Container(name="main", image="busybox:1")],
        )
    )
    per_index = client.V1JobSpec(
        completion_mode="Indexed",
        completions=2,
        parallelism=2,
        backoff_limit_per_index=1,
        template=template,
        suspend=True,
    )
    policy = client.V1JobSpec(
        pod_failure_policy=client.V1PodFailurePolicy(
            rules=[
                client.V1PodFailurePolicyRule(
                    action="FailJob",
                    on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                        operator="In", values=[42]
                    ),
                )
            ]
        ),
        template=template,
        suspend=True,
    )
    created = {
        name: batch.create_namespaced_job(
            "default", client.V1Job(metadata=client.V1ObjectMeta(name=name), spec=spec)
        ).spec
        for name, spec in (("per-index", per_index), ("failure-policy", policy))
    }
    assert created["per-index"].backoff_limit == 2**31 - 1
    assert created["per-index"].pod_replacement_policy == "TerminatingOrFailed"
    assert created["failure-policy"].backoff_limit == 6
    assert created["failure-policy"].pod_replacement_policy == "Failed"


def test_a_node_registered_with_integer_capacity_reads_as_a_typed_node(
    sim: RunningCluster,
) -> None:
    """A kubelet registers its Node with a status, which the server keeps (canonical)."""
    capacity = {"cpu": 64, "memory": "512Gi", "nvidia.com/gpu": 8, "pods": 110}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "registered"},
        "spec": {"unschedulable": True},
        "status": {"capacity": capacity, "allocatable": {**capacity, "cpu": 63.5}},
    }
    with sim.api_client() as api:
        code, _ = raw(api, "POST", "/api/v1/nodes", node)
        assert code == 201
        core = client.CoreV1Api(api)
        nodes = {n.metadata.name: n for n in core.list_node().items}
    status = nodes["registered"].status
    assert status.capacity == {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
    assert status.allocatable["cpu"] == "63500m"
    for read in nodes.values():
        assert all(isinstance(v, str) for v in read.status.allocatable.values())
        assert_server_metadata(read.metadata, generation=None)


def test_namespaces_and_events_carry_no_generation(core: client.CoreV1Api) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="typed")))
    namespace = core.read_namespace("typed")
    assert namespace.metadata.labels == {"kubernetes.io/metadata.name": "typed"}
    assert (namespace.spec.finalizers, namespace.status.phase) == (["kubernetes"], "Active")
    assert_server_metadata(namespace.metadata, generation=None)
    core.create_namespaced_event(
        "typed",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="typed.1"),
            involved_object=client.V1ObjectReference(kind="Namespace", name="typed"),
            reason="Created",
            message="made by the test",
        ),
    )
    for event in core.list_namespaced_event("typed").items:
        assert_server_metadata(event.metadata, generation=None)


def test_a_value_that_is_no_quantity_fails_decoding_with_400(api: client.ApiClient) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-a-quantity"},
        "spec": {"containers": [container("main", {"requests": {"cpu": "lots"}})]},
    }
    code, body = raw(api, "POST", "/api/v1/namespaces/default/pods", pod)
    assert (code, body["reason"]) == (400, "BadRequest")
    assert body["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular '
        "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )


def test_kueue_writes_its_quantities_as_canonical_strings(
    sim: RunningCluster, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    """Workload pod sets, admissions and queue usage as Kueue's Go types serialize them."""
    widget = "example.com/widget"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="widgets")))
    custom.create_cluster_custom_object(
        *KUEUE,
        "resourceflavors",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "ResourceFlavor",
            "metadata": {"name": "widget"},
            "spec": {},
        },
    )
    quota = {"name": widget, "nominalQuota": "2k"}
    cq_spec = {
        "namespaceSelector": {},
        "resourceGroups": [
            {"coveredResources": [widget], "flavors": [{"name": "widget", "resources": [quota]}]}
        ],
    }
    custom.create_cluster_custom_object(
        *KUEUE,
        "clusterqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "ClusterQueue",
            "metadata": {"name": "widgets"},
            "spec": cq_spec,
        },
    )
    custom.create_namespaced_custom_object(
        *KUEUE,
        "widgets",
        "localqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "LocalQueue",
            "metadata": {"name": "widgets", "namespace": "widgets"},
            "spec": {"clusterQueue": "widgets"},
        },
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "widgets", "labels": {"kueue.x-k8s.io/queue-name": "widgets"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container("main", {"limits": {widget: 1000}})],
                }
            }
        },
    }
    with sim.api_client() as api:
        code, _ = raw(api, "POST", "/apis/batch/v1/namespaces/widgets/jobs", job)
    assert code == 201

    def admitted() -> Any:
        items = custom.list_namespaced_custom_object(*KUEUE, "widgets", "workloads")["items"]
        return items and (items[0].get("status") or {}).get("admission") and items[0]

    workload = wait_for(admitted)
    resources = workload["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {widget: "1k"}, "requests": {widget: "1k"}}
    assert workload["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {
        widget: "1k"
    }

    def reserved(plural: str, *scope: str) -> Any:
        read = (
            custom.get_namespaced_custom_object(*KUEUE, *scope, plural, "widgets")
            if scope
            else custom.get_cluster_custom_object(*KUEUE, plural, "widgets")
        )
        flavors = (read.get("status") or {}).get("flavorsReservation") or []
        return flavors and flavors[0]["resources"][0].get("total") != "0" and flavors[0]

    cq = wait_for(lambda: reserved("clusterqueues"))
    assert cq["resources"] == [{"name": widget, "total": "1k", "borrowed": "0"}]
    lq = wait_for(lambda: reserved("localqueues", "widgets"))
    assert lq["resources"] == [{"name": widget, "total": "1k"}]


def test_error_status_details_are_shaped_as_the_real_servers(
    sim: RunningCluster, api: client.ApiClient
) -> None:
    code, body = raw(api, "GET", "/api/v1/nonesuch", None)
    assert (code, body["reason"], body["details"]) == (404, "NotFound", {})
    token = sim.add_user(
        "pod-reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    )
    with sim.api_client(token) as limited, pytest.raises(ApiException) as refused:
        client.BatchV1Api(limited).list_namespaced_job("default")
    body = status_body(refused.value)
    status = client.V1Status.from_dict(body)
    assert (status.code, status.reason, status.details.kind) == (403, "Forbidden", "jobs")
    assert body["details"] == {"group": "batch", "kind": "jobs"}, "no empty name"
