"""A bulk submission to a namespace its caller may not act in is one 403
(issue 18, finding 11), not a 207 with a 403 per item; nothing is created."""

from __future__ import annotations

from tests.api.conftest import Api, setup_quota, workload


def test_a_bulk_to_a_forbidden_namespace_is_403_and_creates_nothing(api: Api) -> None:
    setup_quota(api.admin, namespace="team-b", cq="cq-b")
    team_a = api.as_role("submitter", ["team-a"])
    items = {"items": [workload(f"w{i}") for i in range(3)]}
    response = team_a.post("/v1/namespaces/team-b/bulk/workloads", json=items)
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("/forbidden") and "team-b" in problem["detail"]
    assert api.admin.get("/v1/namespaces/team-b/workloads").json()["items"] == []
