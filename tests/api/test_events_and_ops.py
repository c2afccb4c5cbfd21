"""Events (list and resumable server-sent events), metrics, readiness,
OpenAPI, and the read models rebuilt from the log."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import sqlalchemy as sa

from service.projections import ProjectionRunner, Resources
from tests.api.conftest import ADMIN_TOKEN, Api, setup_quota, workload


def _read_sse(
    client: httpx.Client, params: dict[str, Any], headers: dict[str, str], want: int
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with client.stream(
        "GET", "/v1/events", params={"watch": "true", **params}, headers=headers
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        current: dict[str, Any] = {}
        for line in response.iter_lines():
            if line.startswith("id: "):
                current["id"] = int(line[4:])
            elif line.startswith("event: "):
                current["event"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
            elif line == "" and "data" in current:
                events.append(current)
                current = {}
                if len(events) >= want:
                    break
    return events


def test_events_list_after_a_position_and_filters(api: Api) -> None:
    setup_quota(api.admin)
    setup_quota(api.admin, namespace="team-b")
    for name in ("a", "b"):
        api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name))
    api.admin.post("/v1/namespaces/team-b/workloads", json=workload("c"))
    everything = api.admin.get("/v1/events", params={"limit": 1000}).json()
    positions = [e["position"] for e in everything["items"]]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert everything["items"][0]["metadata"]["actor"] == "bootstrap"
    after = api.admin.get("/v1/events", params={"after": positions[2]}).json()["items"]
    assert [e["position"] for e in after] == positions[3:]
    team_a = api.admin.get("/v1/events", params={"namespace": "team-a", "kind": "Workload"}).json()[
        "items"
    ]
    assert [e["data"]["name"] for e in team_a] == ["a", "b"]
    one = api.admin.get("/v1/events", params={"workload": "c"}).json()["items"]
    assert [e["type"] for e in one] == ["WorkloadSubmitted"]
    page = api.admin.get("/v1/events", params={"limit": 2}).json()
    assert len(page["items"]) == 2 and page["next"] == page["items"][-1]["position"]


def test_sse_watch_streams_new_events_and_resumes_from_last_event_id(api: Api) -> None:
    setup_quota(api.admin)
    start = api.admin.get("/v1/events", params={"limit": 1000}).json()["next"]
    received: list[dict[str, Any]] = []

    def watch() -> None:
        with httpx.Client(
            base_url=api.base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30
        ) as client:
            received.extend(
                _read_sse(
                    client, {"after": start, "namespace": "team-a", "timeoutSeconds": 20}, {}, 3
                )
            )

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.3)
    for name in ("w1", "w2", "w3"):
        assert (
            api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name)).status_code
            == 201
        )
    watcher.join(20)
    assert [e["data"]["data"]["name"] for e in received] == ["w1", "w2", "w3"]
    assert all(e["event"] == "WorkloadSubmitted" for e in received)
    # A client that saw only the first event resumes with Last-Event-ID and misses nothing.
    resumed = _read_sse(
        api.admin,
        {"namespace": "team-a", "timeoutSeconds": 5},
        {"Last-Event-ID": str(received[0]["id"])},
        2,
    )
    assert [e["id"] for e in resumed] == [e["id"] for e in received[1:]]


def test_metrics_count_requests_and_queue_depths(api: Api) -> None:
    setup_quota(api.admin)
    for name in ("a", "b", "c"):
        api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name))
    api.admin.get("/v1/resourceflavors/missing")
    text = api.admin.get("/metrics").text
    assert 'qm_clusterqueue_workloads{cluster_queue="cq-a",state="Pending"} 3.0' in text
    assert (
        'qm_http_requests_total{method="GET",route="/v1/resourceflavors/{name}",status="404"}'
        in text
    )
    assert "qm_http_request_duration_seconds_bucket" in text


def test_readiness_and_openapi(api: Api) -> None:
    assert api.admin.get("/healthz").json() == {"status": "ok"}
    ready = api.admin.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    document = api.admin.get("/openapi.json").json()
    assert "/v1/namespaces/{namespace}/workloads/{name}/explain" in document["paths"]
    assert "ClusterQueue" in document["components"]["schemas"]
    create = document["paths"]["/v1/clusterqueues"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ClusterQueue"
    )
    params = {p["name"] for p in document["paths"]["/v1/clusterqueues"]["get"]["parameters"]}
    assert "namespace" not in params and {"limit", "continue", "labelSelector"} <= params


def test_read_models_rebuilt_from_the_log_equal_the_live_ones(api: Api, engine: sa.Engine) -> None:
    setup_quota(api.admin)
    api.admin.post(
        "/v1/clusters",
        json={
            "metadata": {"name": "c1"},
            "spec": {"server": "https://c1:6443", "credentials": {"token": "t"}},
        },
    )
    for name in ("a", "b"):
        api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name))
    api.admin.delete("/v1/namespaces/team-a/workloads/a")
    api.admin.patch("/v1/clusterqueues/cq-a", json={"spec": {"stopPolicy": "Hold"}})
    api.admin.delete("/v1/namespaces/team-a/localqueues/train")
    api.as_role("auditor")
    query = "SELECT * FROM resources ORDER BY kind, namespace, name"
    tokens = "SELECT * FROM api_tokens ORDER BY id"
    with engine.connect() as conn:
        live = (
            [tuple(r) for r in conn.exec_driver_sql(query)],
            [tuple(r) for r in conn.exec_driver_sql(tokens)],
        )
    ProjectionRunner(engine, [Resources()]).rebuild("resources")
    with engine.connect() as conn:
        rebuilt = (
            [tuple(r) for r in conn.exec_driver_sql(query)],
            [tuple(r) for r in conn.exec_driver_sql(tokens)],
        )
    assert rebuilt == live
    assert len(live[0]) == 6  # flavor, cq, lq (tombstone), cluster, two workloads


def test_a_database_that_cannot_be_reached_is_503_never_500() -> None:
    from service.runtime.embedded import free_port
    from tests.api.conftest import serve

    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none?connect_timeout=2"
    with serve(nowhere) as (base_url, _):
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for method, path in (("GET", "/v1/resourceflavors"), ("POST", "/v1/resourceflavors")):
            response = httpx.request(
                method,
                base_url + path,
                headers=headers,
                json={"metadata": {"name": "x"}, "spec": {}},
            )
            assert response.status_code == 503, response.text
            assert response.headers["content-type"].startswith("application/problem+json")
            assert response.headers["retry-after"] == "2"
        assert httpx.get(base_url + "/readyz").status_code == 503


def test_query_text_the_database_cannot_hold_is_refused_by_name(api: Api) -> None:
    for query in ("namespace=a%00b", "kind=%ED%A6%96", "labelSelector=%FF"):
        response = api.admin.get(f"/v1/events?{query}")
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith(repr(query.split("=")[0]))
    auditor = api.as_role("auditor")
    assert auditor.get("/v1/ledger/entries?kind=a%00").status_code == 422


def test_events_head_is_the_newest_position(api: Api) -> None:
    setup_quota(api.admin)
    newest = api.admin.get("/v1/events", params={"limit": 1000}).json()["items"][-1]["position"]
    assert api.admin.get("/v1/events/head").json() == {"position": newest}
    assert api.client(None).get("/v1/events/head").status_code == 401
