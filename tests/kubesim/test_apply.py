"""Server-side apply and access control, through the official client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.kubesim.testing import RunningCluster
from tests.kubesim.conftest import dynamic_client, status_body

KUEUE = "kueue.x-k8s.io"
APPLY = "application/apply-patch+yaml"


def _apply(
    custom: client.CustomObjectsApi,
    name: str,
    node_labels: dict[str, str],
    manager: str,
    *,
    labels: dict[str, str] | None = None,
    force: bool | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    body = {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": metadata,
        "spec": {"nodeLabels": node_labels},
    }
    # Read raw: the generated client decodes a custom object's patch only
    # when it answers 200, and an apply that creates answers 201.
    answer = custom.patch_cluster_custom_object(
        KUEUE,
        "v1beta2",
        "resourceflavors",
        name,
        body,
        field_manager=manager,
        force=force,
        _content_type=APPLY,
        _preload_content=False,
    )
    result: dict[str, Any] = json.loads(answer.data)
    return result


def _owned(obj: dict[str, Any], manager: str) -> str:
    """The fieldsV1 of ``manager``'s entry, as text ("" when it owns nothing)."""
    for entry in obj["metadata"].get("managedFields") or ():
        if entry["manager"] == manager:
            assert entry["operation"] == "Apply"
            return str(entry["fieldsV1"])
    return ""


def test_two_appliers_conflict_on_a_field_and_force_takes_it_over(
    custom: client.CustomObjectsApi,
) -> None:
    # The CRD declares spec.nodeLabels ``x-kubernetes-map-type: atomic``: owned as a whole.
    created = _apply(custom, "shared", {"pool": "a"}, "quartermaster", labels={"owner": "qm"})
    assert created["metadata"]["generation"] == 1
    assert "'f:nodeLabels': {}" in _owned(created, "quartermaster")
    assert "f:owner" in _owned(created, "quartermaster")

    with pytest.raises(ApiException) as conflict:
        _apply(custom, "shared", {"pool": "b"}, "intruder")
    body = status_body(conflict.value)
    assert (conflict.value.status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Apply failed with 1 conflict: conflict with "quartermaster": .spec.nodeLabels'
    )
    assert body["details"]["causes"][0]["reason"] == "FieldManagerConflict"

    # Applying the same value is no conflict: both managers own it; labels merge per key.
    same = _apply(custom, "shared", {"pool": "a"}, "intruder", labels={"extra": "x"})
    assert "f:nodeLabels" in _owned(same, "intruder")
    assert "f:nodeLabels" in _owned(same, "quartermaster")
    assert same["metadata"]["labels"] == {"owner": "qm", "extra": "x"}

    forced = _apply(custom, "shared", {"pool": "b"}, "intruder", labels={"extra": "x"}, force=True)
    assert forced["spec"]["nodeLabels"] == {"pool": "b"}
    assert "f:nodeLabels" not in _owned(forced, "quartermaster")
    assert forced["metadata"]["generation"] == 2

    # A manager that stops applying a field it alone owns removes it; others' fields stay.
    trimmed = _apply(custom, "shared", {"pool": "b"}, "intruder")
    assert trimmed["metadata"]["labels"] == {"owner": "qm"}
    with pytest.raises(ApiException):
        _apply(custom, "shared", {"pool": "a"}, "quartermaster")  # lost it: conflicts now


def test_update_takes_ownership_without_conflict_and_apply_then_conflicts(
    batch: client.BatchV1Api,
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "owned", "labels": {"team": "a"}},
        "spec": {
            "managedBy": "example.com/elsewhere",
            "suspend": True,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x:1"}]}
            },
        },
    }
    applied = batch.patch_namespaced_job(
        "owned", "default", job, field_manager="reconciler", _content_type=APPLY
    )
    assert applied.metadata.labels == {"team": "a"}
    batch.patch_namespaced_job(
        "owned", "default", {"metadata": {"labels": {"team": "b"}}}, field_manager="kubectl-edit"
    )
    with pytest.raises(ApiException) as conflict:
        batch.patch_namespaced_job(
            "owned", "default", job, field_manager="reconciler", _content_type=APPLY
        )
    message = status_body(conflict.value)["message"]
    assert conflict.value.status == 409
    assert 'conflict with "kubectl-edit" using batch/v1' in message
    assert ".metadata.labels.team" in message


def test_apply_without_field_manager_is_rejected(custom: client.CustomObjectsApi) -> None:
    with pytest.raises(ApiException) as refused:
        custom.patch_cluster_custom_object(
            KUEUE,
            "v1beta2",
            "resourceflavors",
            "nameless",
            {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ResourceFlavor", "metadata": {}},
            _content_type=APPLY,
        )
    body = status_body(refused.value)
    assert (refused.value.status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "fieldManager"


# -- authentication and authorisation ----------------------------------------------------------


def test_requests_without_a_valid_token_are_401(sim: RunningCluster) -> None:
    with sim.api_client(token="not-a-token") as api_client, pytest.raises(ApiException) as denied:
        client.CoreV1Api(api_client).list_namespace()
    assert denied.value.status == 401
    assert status_body(denied.value)["reason"] == "Unauthorized"


def test_rbac_rules_limit_a_token_and_the_audit_records_what_it_used(
    sim: RunningCluster,
) -> None:
    rules = [
        {"apiGroups": [KUEUE], "resources": ["clusterqueues"], "verbs": ["get", "list"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list"]},
    ]
    token = sim.add_user("reader", rules)
    with sim.api_client(token=token) as api_client:
        custom = client.CustomObjectsApi(api_client)
        assert custom.list_cluster_custom_object(KUEUE, "v1beta2", "clusterqueues")["items"]
        client.BatchV1Api(api_client).list_namespaced_job("vision")
        with pytest.raises(ApiException) as forbidden:
            custom.create_cluster_custom_object(
                KUEUE,
                "v1beta2",
                "resourceflavors",
                {
                    "apiVersion": f"{KUEUE}/v1beta2",
                    "kind": "ResourceFlavor",
                    "metadata": {"name": "x"},
                },
            )
    body = status_body(forbidden.value)
    assert (forbidden.value.status, body["reason"]) == (403, "Forbidden")
    assert 'User "reader" cannot create resource "resourceflavors"' in body["message"]
    used = sim.used_rules("reader")
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in used} >= {
        (("clusterqueues",), ("list",)),
        (("jobs",), ("list",)),
    }


def test_dynamic_client_server_side_apply_and_watch(sim: RunningCluster, tmp_path: Path) -> None:
    """What the reconcilers do: apply Kueue objects by field manager, watch them back."""
    with sim.api_client() as api_client:
        dyn = dynamic_client(api_client, tmp_path)
        queues = dyn.resources.get(api_version=f"{KUEUE}/v1beta2", kind="LocalQueue")
        start = queues.get(namespace="vision").metadata.resourceVersion
        body = {
            "apiVersion": f"{KUEUE}/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "mirrored", "namespace": "vision", "labels": {"qm": "1"}},
            "spec": {"clusterQueue": "vision"},
        }
        applied = queues.server_side_apply(body=body, field_manager="quartermaster")
        assert applied.metadata.managedFields[0].manager == "quartermaster"
        body["metadata"]["labels"]["qm"] = "2"
        queues.server_side_apply(body=body, field_manager="quartermaster")
        body["metadata"]["labels"]["qm"] = "3"
        queues.patch(
            body={"metadata": {"labels": {"qm": "hand-edit"}}},
            name="mirrored",
            namespace="vision",
            content_type="application/merge-patch+json",
        )
        with pytest.raises(ApiException) as conflict:
            queues.server_side_apply(body=body, field_manager="quartermaster")
        assert conflict.value.status == 409
        forced = queues.server_side_apply(
            body=body, field_manager="quartermaster", force_conflicts=True
        )
        assert forced.metadata.labels["qm"] == "3"

        # The Kueue controller's status writes show too: keep the label changes.
        seen: list[tuple[str, str]] = []
        for event in queues.watch(
            namespace="vision",
            resource_version=start,
            field_selector="metadata.name=mirrored",
            timeout=5,
        ):
            label = event["object"].metadata.labels["qm"]
            if not seen or seen[-1][1] != label:
                seen.append((event["type"], label))
            if label == "3":
                break
        assert seen == [
            ("ADDED", "1"),
            ("MODIFIED", "2"),
            ("MODIFIED", "hand-edit"),
            ("MODIFIED", "3"),
        ]


def test_an_apply_that_creates_answers_201_and_one_that_updates_200(
    custom: client.CustomObjectsApi,
) -> None:
    """As the real server's patch handler: Created when the apply made the object."""

    def status(labels: dict[str, str]) -> int:
        body = {
            "apiVersion": f"{KUEUE}/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "answered", "labels": labels},
            "spec": {"nodeLabels": {"pool": "a"}},
        }
        _, code, _ = custom.patch_cluster_custom_object_with_http_info(
            KUEUE,
            "v1beta2",
            "resourceflavors",
            "answered",
            body,
            field_manager="quartermaster",
            _content_type=APPLY,
        )
        return int(code)

    assert status({"round": "1"}) == 201
    assert status({"round": "2"}) == 200
    assert status({"round": "2"}) == 200  # changes nothing
