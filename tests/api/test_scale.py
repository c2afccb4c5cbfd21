"""Scaling a serving workload through its scale subresource, over real
Postgres (issue 22): ``PATCH /v1/namespaces/{ns}/workloads/{name}/scale``
sets ``spec.replicas`` (and its job's) with a ``WorkloadScaled`` event; a
workload that is not served replica by replica, or a count out of range,
is refused as problem+json naming ``spec.replicas``."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import Api, setup_quota
from tests.api.test_resources import _fields, _problem
from tests.floor import test_workload_kinds as kinds

PATCH = {"Content-Type": "application/json"}


def _submit(api: Api, manifest: dict[str, Any]) -> str:
    setup_quota(api.admin)
    setup_quota(api.admin, "serve", "cq-serve", workloadClass="inference")
    manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "train"
    created = api.admin.post("/v1/namespaces/serve/workloads", json=manifest)
    assert created.status_code == 201, created.text
    return str(manifest["metadata"]["name"])


def _scale(api: Api, name: str, body: Any) -> Any:
    return api.admin.patch(f"/v1/namespaces/serve/workloads/{name}/scale", json=body, headers=PATCH)


def test_scaling_a_deployment_up_and_down_sets_its_replicas(api: Api) -> None:
    name = _submit(api, kinds.deployment())
    scale = api.admin.get(f"/v1/namespaces/serve/workloads/{name}/scale").json()
    # No admission cycle has run: nothing admitted yet.
    assert (scale["kind"], scale["spec"], scale["status"]) == (
        "Scale",
        {"replicas": 3},
        {"replicas": 0},
    )
    up = _scale(api, name, {"spec": {"replicas": 5}})
    assert up.status_code == 200, up.text
    assert up.json()["spec"] == {"replicas": 5}
    workload = api.admin.get(f"/v1/namespaces/serve/workloads/{name}").json()
    assert workload["spec"]["replicas"] == 5
    assert workload["spec"]["job"]["spec"]["replicas"] == 5
    down = _scale(api, name, {"spec": {"replicas": 2}})
    assert down.status_code == 200, down.text
    events = api.admin.get("/v1/events", params={"limit": 1000}).json()["items"]
    scaled = [e for e in events if e["type"] == "WorkloadScaled"]
    assert [e["data"]["spec"]["replicas"] for e in scaled] == [5, 2]
    again = _scale(api, name, {"spec": {"replicas": 2}})
    assert again.status_code == 200, again.text
    events = api.admin.get("/v1/events", params={"limit": 1000}).json()["items"]
    assert len([e for e in events if e["type"] == "WorkloadScaled"]) == 2, "no-op wrote an event"


def test_a_scale_out_of_range_is_refused_naming_the_field(api: Api) -> None:
    name = _submit(api, kinds.deployment())
    for body in ({"spec": {"replicas": 0}}, {"spec": {"replicas": "3"}}, {"spec": 3}, [1]):
        body_problem = _problem(_scale(api, name, body), 422, "invalid")
        assert _fields(body_problem) == ["spec.replicas"], (body, body_problem)


def test_a_gang_statefulset_does_not_scale(api: Api) -> None:
    name = _submit(api, kinds.gang_statefulset())
    problem = _problem(_scale(api, name, {"spec": {"replicas": 6}}), 422, "invalid")
    assert _fields(problem) == ["spec.replicas"]
    assert "serving workload" in str(problem)


def test_scaling_a_missing_workload_is_not_found(api: Api) -> None:
    setup_quota(api.admin)
    response = _scale(api, "nobody", {"spec": {"replicas": 2}})
    assert response.status_code == 404, response.text


def test_a_scale_below_min_replicas_is_refused(api: Api) -> None:
    web = kinds.deployment()
    web["metadata"]["annotations"]["quartermaster.dev/min-replicas"] = "2"
    name = _submit(api, web)
    problem = _problem(_scale(api, name, {"spec": {"replicas": 1}}), 422, "invalid")
    assert _fields(problem) == ["spec.replicas"]
    assert "minReplicas (2)" in str(problem)
    assert _scale(api, name, {"spec": {"replicas": 2}}).status_code == 200
