"""The stand-in's ValidatingAdmissionPolicy through the official client: a
bound policy refuses a write with the API server's wording, reason and code;
it sees the user, the old object on update and delete, the namespace's
labels and its params; ``matchConditions``, selectors and subresources
narrow it; ``Warn`` warns, ``failurePolicy: Ignore`` lets an erring
expression pass; a policy that does not compile is refused naming its field;
the typed models read both kinds back with the server's defaults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.kubesim.testing import RunningCluster, running_cluster

SA = "system:serviceaccount:ops:lease-writer"


@pytest.fixture(scope="module")
def member() -> Iterator[RunningCluster]:
    with running_cluster(controllers=False) as cluster:
        with cluster.api_client() as api:
            core = client.CoreV1Api(api)
            for name, labels in (("plain", {}), ("guarded", {"guard": "on"})):
                core.create_namespace({"metadata": {"name": name, "labels": labels}})
        yield cluster


@pytest.fixture
def admin(member: RunningCluster) -> Iterator[client.ApiClient]:
    """The admin's client; every policy and binding made is removed after the test."""
    with member.api_client() as api:
        yield api
        registry = client.AdmissionregistrationV1Api(api)
        for binding in registry.list_validating_admission_policy_binding().items:
            registry.delete_validating_admission_policy_binding(binding.metadata.name)
        for policy in registry.list_validating_admission_policy().items:
            registry.delete_validating_admission_policy(policy.metadata.name)
        leases = client.CoordinationV1Api(api)
        for lease in leases.list_lease_for_all_namespaces().items:
            leases.delete_namespaced_lease(lease.metadata.name, lease.metadata.namespace)


def _policy(
    name: str,
    validations: list[dict[str, Any]],
    *,
    resources: tuple[str, ...] = ("leases",),
    operations: tuple[str, ...] = ("CREATE", "UPDATE"),
    **spec: Any,
) -> dict[str, Any]:
    group = "batch" if resources[0].startswith("jobs") else "coordination.k8s.io"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [group],
                        "apiVersions": ["v1"],
                        "operations": list(operations),
                        "resources": list(resources),
                    }
                ]
            },
            "validations": validations,
            **spec,
        },
    }


def _bind(api: client.ApiClient, policy: dict[str, Any], *actions: str, **spec: Any) -> None:
    registry = client.AdmissionregistrationV1Api(api)
    registry.create_validating_admission_policy(policy)
    name = policy["metadata"]["name"]
    registry.create_validating_admission_policy_binding(
        {
            "metadata": {"name": f"{name}-binding"},
            "spec": {"policyName": name, "validationActions": list(actions or ("Deny",)), **spec},
        }
    )


def _lease(name: str, holder: str = "ok-a", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"holderIdentity": holder},
    }


def _create(api: client.ApiClient, lease: dict[str, Any], namespace: str = "plain") -> Any:
    return client.CoordinationV1Api(api).create_namespaced_lease(namespace, lease)


def _refusal(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as refused:
        call()
    return refused.value.status, json.loads(str(refused.value.body))


HOLDER_OK = {"expression": "object.spec.holderIdentity.startsWith('ok-')"}


def test_a_denied_write_has_the_api_servers_wording_reason_and_code(
    admin: client.ApiClient,
) -> None:
    _bind(admin, _policy("holders", [HOLDER_OK]))
    code, body = _refusal(lambda: _create(admin, _lease("bad", "rogue")))
    said = (
        "ValidatingAdmissionPolicy 'holders' with binding 'holders-binding' denied request: "
        "failed expression: object.spec.holderIdentity.startsWith('ok-')"
    )
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["message"] == f'leases.coordination.k8s.io "bad" is forbidden: {said}'
    assert body["details"]["causes"] == [{"message": said}]
    assert _create(admin, _lease("good")).metadata.name == "good"


def test_the_reason_message_and_message_expression_are_the_policys(
    admin: client.ApiClient,
) -> None:
    _bind(
        admin,
        _policy(
            "worded",
            [
                {**HOLDER_OK, "message": "holders start with ok-", "reason": "Forbidden"},
                {
                    "expression": "object.spec.holderIdentity.size() < 8",
                    "messageExpression": "'holder ' + object.spec.holderIdentity + ' too long'",
                },
            ],
        ),
    )
    code, body = _refusal(lambda: _create(admin, _lease("bad", "rogue")))
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"].endswith("denied request: holders start with ok-")
    code, body = _refusal(lambda: _create(admin, _lease("long", "ok-longer-name")))
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["message"].endswith("denied request: holder ok-longer-name too long")


def test_the_request_names_the_user_and_a_service_accounts_groups(
    member: RunningCluster, admin: client.ApiClient
) -> None:
    only_sa = {
        "expression": f"request.userInfo.username == '{SA}' "
        "&& 'system:serviceaccounts:ops' in request.userInfo.groups "
        "&& request.operation == 'CREATE' && request.namespace == 'plain'",
        "reason": "Forbidden",
    }
    _bind(admin, _policy("writer", [only_sa], operations=("CREATE",)))
    with member.api_client(member.add_user(SA)) as sa:
        assert _create(sa, _lease("by-sa")).metadata.name == "by-sa"
    with member.api_client(member.add_user("someone")) as other:
        code, _ = _refusal(lambda: _create(other, _lease("by-other")))
    assert code == 403
    code, _ = _refusal(lambda: _create(admin, _lease("by-admin")))
    assert code == 403, "a policy binds cluster-admin too"


def test_an_update_sees_the_old_object_and_a_delete_sees_only_it(
    admin: client.ApiClient,
) -> None:
    kept = {
        "expression": "oldObject == null"
        " || object.spec.holderIdentity == oldObject.spec.holderIdentity"
    }
    _bind(admin, _policy("kept", [kept]))
    _bind(
        admin,
        _policy(
            "undeletable",
            [{"expression": "object == null && !('keep' in oldObject.metadata.labels)"}],
            operations=("DELETE",),
        ),
    )
    leases = client.CoordinationV1Api(admin)
    _create(admin, _lease("held", keep="yes"))
    _create(admin, _lease("loose", other="x"))
    code, _ = _refusal(
        lambda: leases.patch_namespaced_lease("held", "plain", {"spec": {"holderIdentity": "ok-b"}})
    )
    assert code == 422
    leases.patch_namespaced_lease("held", "plain", {"spec": {"leaseDurationSeconds": 5}})
    code, body = _refusal(lambda: leases.delete_namespaced_lease("held", "plain"))
    assert code == 422 and "'undeletable'" in body["message"]
    leases.delete_namespaced_lease("loose", "plain")
    assert [x.metadata.name for x in leases.list_namespaced_lease("plain").items] == ["held"]


def test_conditions_and_selectors_narrow_what_a_policy_checks(
    admin: client.ApiClient,
) -> None:
    never = {"expression": "false", "message": "refused"}
    _bind(
        admin,
        _policy(
            "narrow",
            [never],
            matchConditions=[
                {"name": "rogue", "expression": "object.spec.holderIdentity == 'rogue'"}
            ],
        ),
        matchResources={"namespaceSelector": {"matchLabels": {"guard": "on"}}},
    )
    _bind(
        admin,
        _policy("labelled", [never]),
        matchResources={"objectSelector": {"matchLabels": {"tier": "locked"}}},
    )
    assert _create(admin, _lease("a", "rogue")).metadata.name == "a"  # namespace not guarded
    assert _create(admin, _lease("b", "ok-b"), "guarded").metadata.name == "b"  # condition false
    code, body = _refusal(lambda: _create(admin, _lease("c", "rogue"), "guarded"))
    assert code == 422 and "'narrow'" in body["message"]
    code, body = _refusal(lambda: _create(admin, _lease("d", tier="locked")))
    assert code == 422 and "'labelled'" in body["message"]


def test_warn_warns_and_an_erring_expression_follows_the_failure_policy(
    member: RunningCluster, admin: client.ApiClient
) -> None:
    _bind(admin, _policy("warned", [HOLDER_OK]), "Warn", "Audit")
    answer = client.CoordinationV1Api(admin).create_namespaced_lease(
        "plain", _lease("w", "rogue"), _preload_content=False
    )
    assert answer.status == 201
    assert "ValidatingAdmissionPolicy 'warned' with binding 'warned-binding'" in (
        answer.headers.get("Warning") or ""
    )
    erring = {"expression": "object.spec.nothingHere == 'x'"}
    _bind(admin, _policy("lenient", [erring], failurePolicy="Ignore"))
    assert _create(admin, _lease("ignored")).metadata.name == "ignored"
    _bind(admin, _policy("strict", [erring]))
    code, body = _refusal(lambda: _create(admin, _lease("failed")))
    assert code == 422 and "resulted in error" in body["message"]


def test_a_rule_names_a_subresource_or_the_resource_alone(admin: client.ApiClient) -> None:
    never = {"expression": "false"}
    _bind(admin, _policy("jobs-only", [never], resources=("jobs",), operations=("UPDATE",)))
    batch = client.BatchV1Api(admin)
    job = {
        "metadata": {"name": "j"},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            },
        },
    }
    batch.create_namespaced_job("plain", job)
    try:
        batch.patch_namespaced_job_status("j", "plain", {"status": {"active": 0}})
        code, _ = _refusal(
            lambda: batch.patch_namespaced_job("j", "plain", {"metadata": {"labels": {"a": "b"}}})
        )
        assert code == 422
        _bind(
            admin,
            _policy("status-too", [never], resources=("jobs/status",), operations=("UPDATE",)),
        )
        code, body = _refusal(
            lambda: batch.patch_namespaced_job_status("j", "plain", {"status": {"active": 0}})
        )
        assert code == 422 and "'status-too'" in body["message"]
    finally:
        registry = client.AdmissionregistrationV1Api(admin)
        for name in ("jobs-only", "status-too"):
            registry.delete_validating_admission_policy_binding(f"{name}-binding")
        batch.delete_namespaced_job("j", "plain", propagation_policy="Background")


def test_params_come_from_the_binding_and_a_missing_one_follows_its_action(
    admin: client.ApiClient,
) -> None:
    _create(admin, _lease("limits", "ok-"), "guarded")
    by_param = {"expression": "object.spec.holderIdentity.startsWith(params.spec.holderIdentity)"}
    kind = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
    _bind(
        admin,
        _policy("param", [by_param], paramKind=kind),
        paramRef={"name": "limits", "namespace": "guarded", "parameterNotFoundAction": "Deny"},
        matchResources={
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "plain"}}
        },
    )
    assert _create(admin, _lease("fine", "ok-z")).metadata.name == "fine"
    code, _ = _refusal(lambda: _create(admin, _lease("off", "rogue")))
    assert code == 422
    client.CoordinationV1Api(admin).delete_namespaced_lease("limits", "guarded")
    code, body = _refusal(lambda: _create(admin, _lease("orphan", "ok-z")))
    assert code == 422 and "no params found" in body["message"]


def test_a_broken_policy_or_binding_is_refused_naming_the_field(
    admin: client.ApiClient,
) -> None:
    registry = client.AdmissionregistrationV1Api(admin)
    code, body = _refusal(
        lambda: registry.create_validating_admission_policy(
            _policy("broken", [{"expression": "object.spec +"}])
        )
    )
    assert code == 422
    assert [c["field"] for c in body["details"]["causes"]] == ["spec.validations[0].expression"]
    code, body = _refusal(
        lambda: registry.create_validating_admission_policy_binding(
            {
                "metadata": {"name": "b"},
                "spec": {"policyName": "x", "validationActions": ["Deny", "Warn"]},
            }
        )
    )
    assert code == 422
    assert [c["field"] for c in body["details"]["causes"]] == ["spec.validationActions"]


def test_the_typed_models_read_both_kinds_with_the_servers_defaults(
    admin: client.ApiClient,
) -> None:
    _bind(admin, _policy("read", [HOLDER_OK]), "Deny")
    registry = client.AdmissionregistrationV1Api(admin)
    policy = registry.read_validating_admission_policy("read")
    assert isinstance(policy, client.V1ValidatingAdmissionPolicy)
    assert policy.spec.failure_policy == "Fail"
    assert policy.spec.match_constraints.match_policy == "Equivalent"
    assert policy.spec.match_constraints.resource_rules[0].scope == "*"
    binding = registry.read_validating_admission_policy_binding("read-binding")
    assert binding.spec.policy_name == "read" and binding.spec.validation_actions == ["Deny"]
    # A policy never guards the admission configuration itself.
    every = _policy("everything", [{"expression": "false"}])
    every["spec"]["matchConstraints"]["resourceRules"][0].update(
        apiGroups=["*"], apiVersions=["*"], resources=["*"], operations=["*"]
    )
    _bind(admin, every)
    registry.delete_validating_admission_policy_binding("read-binding")
    code, _ = _refusal(lambda: _create(admin, _lease("blocked")))
    assert code == 422
