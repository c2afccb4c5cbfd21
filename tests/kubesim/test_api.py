"""Object semantics through the official client's typed APIs: what a real API server does."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.kubesim.testing import running_cluster
from tests.kubesim.conftest import dynamic_client, status_body
from tests.waiting import wait_for

#: A Job that the built-in Job controller leaves alone (``spec.managedBy``), so that no
#: controller write races the test's own writes.
ELSEWHERE = "example.com/elsewhere"


def _job(
    name: str = "",
    generate: str = "",
    labels: dict[str, str] | None = None,
    managed_by: str | None = None,
) -> client.V1Job:
    container = client.V1Container(name="c", image="busybox:1", command=["true"])
    return client.V1Job(
        metadata=client.V1ObjectMeta(
            name=name or None, generate_name=generate or None, labels=labels
        ),
        spec=client.V1JobSpec(
            managed_by=managed_by,
            suspend=True,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(restart_policy="Never", containers=[container])
            ),
        ),
    )


def test_discovery_lists_core_batch_job_crds_and_every_kueue_kind(api: client.ApiClient) -> None:
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert {"batch", "kueue.x-k8s.io", "jobset.x-k8s.io", "kubeflow.org"} <= groups.keys()
    kueue = groups["kueue.x-k8s.io"]
    assert kueue.preferred_version.version == "v1beta2"
    assert {v.version for v in kueue.versions} == {"v1beta1", "v1beta2"}
    kinds = {
        r.kind
        for r in client.CustomObjectsApi(api)
        .get_api_resources("kueue.x-k8s.io", "v1beta2")
        .resources
    }
    assert {
        "ResourceFlavor",
        "Topology",
        "Cohort",
        "ClusterQueue",
        "LocalQueue",
        "Workload",
        "WorkloadPriorityClass",
    } <= kinds
    assert client.VersionApi(api).get_code().major == "1"


def test_create_with_generate_name_sets_server_fields(batch: client.BatchV1Api) -> None:
    job = batch.create_namespaced_job("default", _job(generate="gen-"))
    assert job.metadata.name.startswith("gen-") and len(job.metadata.name) == len("gen-") + 5
    assert job.metadata.uid and job.metadata.creation_timestamp
    assert job.metadata.generation == 1
    assert int(job.metadata.resource_version) > 0
    assert job.metadata.managed_fields[0].manager == "OpenAPI-Generator"
    assert job.metadata.managed_fields[0].operation == "Update"
    assert job.spec.backoff_limit == 6 and job.spec.completions == 1
    assert job.spec.selector.match_labels == {
        "batch.kubernetes.io/controller-uid": job.metadata.uid
    }


def test_errors_are_status_objects_with_kubernetes_codes(
    batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    with pytest.raises(ApiException) as missing:
        batch.read_namespaced_job("nope", "default")
    body = status_body(missing.value)
    assert (missing.value.status, body["kind"], body["reason"]) == (404, "Status", "NotFound")
    assert body["message"] == 'jobs.batch "nope" not found'
    assert body["details"] == {"name": "nope", "group": "batch", "kind": "jobs"}

    batch.create_namespaced_job("default", _job("twice"))
    with pytest.raises(ApiException) as duplicate:
        batch.create_namespaced_job("default", _job("twice"))
    assert (duplicate.value.status, status_body(duplicate.value)["reason"]) == (
        409,
        "AlreadyExists",
    )

    with pytest.raises(ApiException) as no_namespace:
        batch.create_namespaced_job("no-such-namespace", _job("x"))
    assert status_body(no_namespace.value)["message"] == 'namespaces "no-such-namespace" not found'

    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="bad"), spec=client.V1PodSpec(containers=[])
    )
    with pytest.raises(ApiException) as invalid:
        core.create_namespaced_pod("default", pod)
    body = status_body(invalid.value)
    assert (invalid.value.status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "spec.containers"


def test_stale_update_conflicts_and_generation_tracks_spec(batch: client.BatchV1Api) -> None:
    job = batch.create_namespaced_job("default", _job("versions", managed_by=ELSEWHERE))
    job.metadata.labels = {"team": "a"}
    updated = batch.replace_namespaced_job("versions", "default", job)
    assert updated.metadata.generation == 1  # metadata-only change
    assert int(updated.metadata.resource_version) > int(job.metadata.resource_version)
    with pytest.raises(ApiException) as stale:
        batch.replace_namespaced_job("versions", "default", job)  # still the old resourceVersion
    assert stale.value.status == 409
    assert "the object has been modified" in status_body(stale.value)["message"]
    patched = batch.patch_namespaced_job(
        "versions", "default", {"spec": {"activeDeadlineSeconds": 60}}
    )
    assert patched.metadata.generation == 2
    same = batch.patch_namespaced_job(
        "versions", "default", {"spec": {"activeDeadlineSeconds": 60}}
    )
    assert same.metadata.resource_version == patched.metadata.resource_version  # no-op write


def test_status_subresource_separates_spec_and_status(batch: client.BatchV1Api) -> None:
    batch.create_namespaced_job("default", _job("status-split", managed_by=ELSEWHERE))
    batch.patch_namespaced_job_status(
        "status-split", "default", {"status": {"active": 3}, "spec": {"parallelism": 9}}
    )
    job = batch.read_namespaced_job("status-split", "default")
    assert job.status.active == 3 and job.spec.parallelism == 1
    batch.patch_namespaced_job("status-split", "default", {"status": {"active": 7}})
    assert batch.read_namespaced_job_status("status-split", "default").status.active == 3


def test_patch_types(batch: client.BatchV1Api, core: client.CoreV1Api) -> None:
    batch.create_namespaced_job(
        "default", _job("patches", labels={"a": "1", "b": "2"}, managed_by=ELSEWHERE)
    )
    merged = batch.patch_namespaced_job(
        "patches",
        "default",
        {"metadata": {"labels": {"a": None, "c": "3"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.labels == {"b": "2", "c": "3"}  # null removes a key
    json_patched = batch.patch_namespaced_job(
        "patches",
        "default",
        [
            {"op": "test", "path": "/metadata/labels/b", "value": "2"},
            {"op": "replace", "path": "/spec/parallelism", "value": 2},
        ],
        _content_type="application/json-patch+json",
    )
    assert json_patched.spec.parallelism == 2
    with pytest.raises(ApiException) as failed:
        batch.patch_namespaced_job(
            "patches",
            "default",
            [{"op": "test", "path": "/metadata/labels/b", "value": "x"}],
            _content_type="application/json-patch+json",
        )
    assert failed.value.status == 422
    # A Job's pod template is immutable outside the scheduling directives, as on a real server.
    env = [{"name": "c", "env": [{"name": "X", "value": "1"}]}]
    with pytest.raises(ApiException) as immutable:
        batch.patch_namespaced_job(
            "patches",
            "default",
            {"spec": {"template": {"spec": {"containers": env}}}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert status_body(immutable.value)["details"]["causes"][0]["field"] == "spec.template"

    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="smp-pod"),
        spec=client.V1PodSpec(
            node_name="no-such-node",
            containers=[
                client.V1Container(name="a", image="busybox:1", command=["sleep"]),
                client.V1Container(name="b", image="busybox:1"),
            ],
        ),
    )
    core.create_namespaced_pod("default", pod)
    strategic = core.patch_namespaced_pod(
        "smp-pod",
        "default",
        {"spec": {"containers": [{"name": "b", "image": "busybox:2"}]}},
        _content_type="application/strategic-merge-patch+json",
    )
    containers = {c.name: c for c in strategic.spec.containers}
    # merged by name: the other container and the untouched fields stay
    assert containers["b"].image == "busybox:2" and containers["a"].command == ["sleep"]
    core.delete_namespaced_pod("smp-pod", "default", grace_period_seconds=0)


def test_strategic_merge_is_refused_for_custom_resources(custom: client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(
        "kueue.x-k8s.io",
        "v1beta2",
        "resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "smp"},
        },
    )
    with pytest.raises(ApiException) as refused:
        custom.patch_cluster_custom_object(
            "kueue.x-k8s.io",
            "v1beta2",
            "resourceflavors",
            "smp",
            {"spec": {"nodeLabels": {"a": "b"}}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert refused.value.status == 415
    message = status_body(refused.value)["message"]
    assert "accepted media types include" in message and "strategic" not in message


def test_label_and_field_selectors(core: client.CoreV1Api, batch: client.BatchV1Api) -> None:
    for index, team in enumerate(["red", "red", "blue"]):
        batch.create_namespaced_job(
            "default", _job(f"sel-{index}", labels={"team": team, "sel": "yes"})
        )
    names = lambda items: sorted(i.metadata.name for i in items)  # noqa: E731
    assert names(batch.list_namespaced_job("default", label_selector="sel=yes,team=red").items) == [
        "sel-0",
        "sel-1",
    ]
    assert names(
        batch.list_namespaced_job("default", label_selector="sel,team notin (red)").items
    ) == ["sel-2"]
    assert names(
        batch.list_namespaced_job("default", field_selector="metadata.name=sel-1").items
    ) == ["sel-1"]
    nodes = core.list_node(field_selector="metadata.name=east-1-h100-i0-n0").items
    assert names(nodes) == ["east-1-h100-i0-n0"]
    with pytest.raises(ApiException) as unsupported:
        batch.list_namespaced_job("default", field_selector="spec.parallelism=1")
    assert unsupported.value.status == 400


def test_limit_and_continue_page_a_consistent_snapshot(core: client.CoreV1Api) -> None:
    first = core.list_node(limit=5)
    assert len(first.items) == 5 and first.metadata._continue
    assert first.metadata.remaining_item_count == 7
    core.patch_node("east-1-h100-i1-n3", {"metadata": {"labels": {"touched": "yes"}}})
    rest = core.list_node(limit=100, _continue=first.metadata._continue)
    assert rest.metadata.resource_version == first.metadata.resource_version
    assert len(first.items) + len(rest.items) == 12
    touched = next(n for n in rest.items if n.metadata.name == "east-1-h100-i1-n3")
    assert "touched" not in (touched.metadata.labels or {})  # as of the first page's revision


def test_delete_with_finalizers_and_propagation(
    batch: client.BatchV1Api, core: client.CoreV1Api, sim
) -> None:
    job = _job("finalized")
    job.metadata.finalizers = ["example.com/hold"]
    batch.create_namespaced_job("default", job)
    batch.delete_namespaced_job("finalized", "default")
    held = batch.read_namespaced_job("finalized", "default")
    assert held.metadata.deletion_timestamp is not None
    batch.patch_namespaced_job("finalized", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException):
        batch.read_namespaced_job("finalized", "default")

    running = _job("owner")
    running.spec.suspend = False
    running.metadata.annotations = {"quartermaster.dev/sim-duration": "1h"}
    owner = batch.create_namespaced_job("default", running)
    pods = wait_for(
        lambda: (
            core.list_namespaced_pod(
                "default", label_selector=f"controller-uid={owner.metadata.uid}"
            ).items
        )
    )
    batch.delete_namespaced_job("owner", "default", propagation_policy="Background")
    wait_for(
        lambda: (
            not core.list_namespaced_pod(
                "default", label_selector=f"controller-uid={owner.metadata.uid}"
            ).items
        )
    )
    assert pods


def test_dry_run_stores_nothing(batch: client.BatchV1Api) -> None:
    batch.create_namespaced_job("default", _job("dry"), dry_run="All")
    with pytest.raises(ApiException) as missing:
        batch.read_namespaced_job("dry", "default")
    assert missing.value.status == 404


def test_dynamic_client_reads_and_writes_custom_resources(
    api: client.ApiClient, tmp_path: Path
) -> None:
    dyn = dynamic_client(api, tmp_path)
    flavors = dyn.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="ResourceFlavor")
    created = flavors.create(
        body={
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "dyn"},
            "spec": {"nodeLabels": {"pool": "x"}},
        }
    )
    assert created.metadata.name == "dyn"
    listed = flavors.get()
    assert "dyn" in [item.metadata.name for item in listed.items]
    workloads = dyn.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="Workload")
    assert workloads.namespaced is True
    old_api = dyn.resources.get(api_version="kueue.x-k8s.io/v1beta1", kind="ResourceFlavor")
    assert old_api.get(name="dyn").apiVersion == "kueue.x-k8s.io/v1beta1"


def test_garbage_collector_keeps_a_live_owners_other_dependents(batch: client.BatchV1Api) -> None:
    owner = batch.create_namespaced_job("default", _job("gc-owner", managed_by=ELSEWHERE))
    reference = client.V1OwnerReference(
        api_version="batch/v1", kind="Job", name="gc-owner", uid=owner.metadata.uid
    )
    for name in ("gc-a", "gc-b"):
        dependent = _job(name, managed_by=ELSEWHERE)
        dependent.metadata.owner_references = [reference]
        batch.create_namespaced_job("default", dependent)
    batch.delete_namespaced_job("gc-a", "default")
    survivor = batch.read_namespaced_job("gc-b", "default")  # the owner lives: kept
    assert survivor.metadata.owner_references[0].uid == owner.metadata.uid
    wait_for(
        lambda: (
            batch.list_namespaced_job("default", field_selector="metadata.name=gc-a").items == []
        )
    )
    assert batch.read_namespaced_job("gc-b", "default").metadata.name == "gc-b"

    batch.delete_namespaced_job("gc-owner", "default", propagation_policy="Background")
    wait_for(
        lambda: (
            batch.list_namespaced_job("default", field_selector="metadata.name=gc-b").items == []
        )
    )


def test_events_expire_after_the_event_ttl() -> None:
    with (
        running_cluster(name="ttl", tls=False, event_ttl=1.0) as cluster,
        cluster.api_client() as api_client,
    ):
        batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
        job = _job("noisy")
        job.spec.suspend = False
        batch.create_namespaced_job("default", job)
        events = wait_for(lambda: core.list_namespaced_event("default").items)
        assert {e.reason for e in events} >= {"SuccessfulCreate"}
        # Timestamps have one-second resolution: gone within ttl + 2 s.
        wait_for(lambda: not core.list_namespaced_event("default").items)
        assert batch.read_namespaced_job("noisy", "default").metadata.name == "noisy"


def test_deleting_a_namespace_empties_it_then_removes_it(
    core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="short-lived")))
    batch.create_namespaced_job("short-lived", _job("inside", managed_by=ELSEWHERE))
    core.delete_namespace("short-lived")

    def gone() -> bool:
        try:
            core.read_namespace("short-lived")
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone)
    with pytest.raises(ApiException) as missing:
        batch.read_namespaced_job("inside", "short-lived")
    assert missing.value.status == 404
