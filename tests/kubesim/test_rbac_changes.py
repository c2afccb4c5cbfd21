"""The stand-in's allow-list as the member-RBAC tests use it: an apply that
creates needs ``create`` (with the object's name) besides ``patch``, as on a
real API server; refusals are audited; a user's rules change at run time;
and the audit names the grants a role holds that nothing used."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.kubesim.auth import grants
from sim.kubesim.testing import RunningCluster

KUEUE = "kueue.x-k8s.io"
APPLY = "application/apply-patch+yaml"


def _flavor(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {"sku": name}},
    }


def _apply(api: client.ApiClient, name: str) -> int:
    answer: Any = client.CustomObjectsApi(api).patch_cluster_custom_object(
        KUEUE,
        "v1beta2",
        "resourceflavors",
        name,
        _flavor(name),
        field_manager="test",
        force=True,
        _content_type=APPLY,
        _preload_content=False,
    )
    assert json.loads(answer.data)["metadata"]["name"] == name
    return int(answer.status)


def _refused(api: client.ApiClient, name: str) -> ApiException:
    with pytest.raises(ApiException) as refused:
        _apply(api, name)
    assert refused.value.status == 403
    return refused.value


PATCH_ONLY = [{"apiGroups": [KUEUE], "resources": ["resourceflavors"], "verbs": ["patch"]}]


def test_an_apply_that_creates_needs_create_and_one_that_updates_does_not(
    sim: RunningCluster,
) -> None:
    token = sim.add_user("applier", PATCH_ONLY)
    with sim.api_client(token) as api:
        refused = _refused(api, "rbac-new")
        assert (
            'cannot create resource "resourceflavors"' in json.loads(str(refused.body))["message"]
        )
        assert sim.get(f"{KUEUE}/v1beta2", "ResourceFlavor", "", "rbac-new") is None
        with sim.api_client() as admin:
            assert _apply(admin, "rbac-there") == 201
        assert _apply(api, "rbac-there") == 200  # an update: patch is enough
        # create narrowed to one name: the real server passes the name along.
        sim.set_rules(
            "applier",
            [*PATCH_ONLY, {**PATCH_ONLY[0], "verbs": ["create"], "resourceNames": ["rbac-new"]}],
        )
        assert _apply(api, "rbac-new") == 201
        _refused(api, "rbac-other")
    # Refused create, and so the patch's answer: 403 (the patch itself was allowed).
    decisions = [(r.verb, r.name, r.code, r.allowed) for r in sim.audit("applier")]
    assert decisions == [
        ("create", "rbac-new", 403, False),
        ("patch", "rbac-new", 403, True),
        ("patch", "rbac-there", 200, True),
        ("create", "rbac-new", 201, True),
        ("patch", "rbac-new", 201, True),
        ("create", "rbac-other", 403, False),
        ("patch", "rbac-other", 403, True),
    ]
    assert [(r.verb, r.name) for r in sim.audit("applier") if r.denied] == [
        ("create", "rbac-new"),
        ("create", "rbac-other"),
    ]


def test_rules_changed_at_run_time_apply_to_the_next_request_and_refusals_are_audited(
    sim: RunningCluster,
) -> None:
    rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]
    token = sim.add_user("lister", rules)
    with sim.api_client(token) as api:
        core = client.CoreV1Api(api)
        assert core.list_node().items
        sim.set_rules("lister", rules[1:])
        with pytest.raises(ApiException) as refused:
            core.list_node()
        assert refused.value.status == 403
        core.list_pod_for_all_namespaces()
        sim.set_rules("lister", rules)
        assert core.list_node().items
    audited = [(r.verb, r.resource, r.code) for r in sim.audit("lister")]
    assert audited == [
        ("list", "nodes", 200),
        ("list", "nodes", 403),
        ("list", "pods", 200),
        ("list", "nodes", 200),
    ]
    assert [(r.resource, r.verb) for r in sim.run(sim.cluster.auth.denied, "lister")] == [
        ("nodes", "list")
    ]
    # What the role holds and nothing used: watch on pods.
    unused = sim.run(sim.cluster.auth.unused_rules, "lister")
    assert unused == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["watch"]}]
    assert sim.used_rules("lister") == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]


def test_grants_split_rules_into_one_group_resource_and_verb_each() -> None:
    rule = {
        "apiGroups": ["a", "b"],
        "resources": ["x"],
        "verbs": ["get", "list"],
        "resourceNames": ["n"],
    }
    assert grants([rule]) == [
        {"apiGroups": [g], "resources": ["x"], "verbs": [v], "resourceNames": ["n"]}
        for g in ("a", "b")
        for v in ("get", "list")
    ]
