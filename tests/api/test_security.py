"""Who may do what; every route is authorized; idempotency keys; rate
limits; cluster credentials never come back."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute, iter_route_contexts

from service.api.deps import current_principal
from service.api.idempotent import IdempotencyMiddleware
from service.api.middleware import PUBLIC_PATHS
from service.app.idempotency import IdempotencyStore
from tests.api.conftest import ADMIN_TOKEN, Api, serve, setup_quota, workload
from tests.api.test_resources import _problem

FLAVOR = {"metadata": {"name": "h100"}, "spec": {}}


def _depends_on(dependant, target) -> bool:  # type: ignore[no-untyped-def]
    return any(d.call is target or _depends_on(d, target) for d in dependant.dependencies)


def test_every_route_has_an_authorization_dependency(api: Api) -> None:
    from service.api.app import create_app

    app = create_app(api.services)
    # Since FastAPI 0.16x, app.routes holds an included router as one entry:
    # walk into them (checking app.routes alone passed with every router route
    # unguarded).
    routes = [context.original_route for context in iter_route_contexts(app.routes)]
    assert sum(isinstance(route, APIRoute) for route in routes) > 50
    unguarded = [
        f"{sorted(route.methods or ())} {route.path}"
        for route in routes
        if isinstance(route, APIRoute)
        and route.path not in PUBLIC_PATHS
        and not _depends_on(route.dependant, current_principal)
    ]
    assert unguarded == []
    public = {r.path for r in routes if isinstance(r, APIRoute) and r.path in PUBLIC_PATHS}
    # The API docs are public on purpose, as /openapi.json is (served offline).
    assert public == {"/healthz", "/readyz", "/metrics", "/docs", "/redoc"}


def test_no_token_bad_token_and_revoked_token(api: Api) -> None:
    anonymous = api.client(None)
    body = _problem(anonymous.get("/v1/resourceflavors"), 401, "unauthorized")
    assert "bearer token" in body["detail"]
    _problem(api.client("qm_not-a-token").get("/v1/resourceflavors"), 401, "unauthorized")
    issued = api.admin.post("/v1/tokens", json={"name": "temp", "role": "auditor"}).json()
    auditor = api.client(issued["token"])
    assert auditor.get("/v1/resourceflavors").status_code == 200
    assert api.admin.delete(f"/v1/tokens/{issued['id']}").status_code == 204
    _problem(auditor.get("/v1/resourceflavors"), 401, "unauthorized")
    listed = api.admin.get("/v1/tokens").json()["items"]
    assert listed[0]["revoked"] is True
    assert "token" not in listed[0] and "token_hash" not in json.dumps(listed)


@pytest.mark.parametrize(
    ("role", "can_write_quota", "can_write_cluster", "can_submit_anywhere", "can_issue_tokens"),
    [
        ("queue-admin", True, False, False, False),
        ("cluster-admin", False, True, False, False),
        ("auditor", False, False, False, False),
        ("submitter", False, False, False, False),
        ("admin", True, True, True, True),
    ],
)
def test_roles_never_imply_one_another(
    api: Api,
    role: str,
    can_write_quota: bool,
    can_write_cluster: bool,
    can_submit_anywhere: bool,
    can_issue_tokens: bool,
) -> None:
    setup_quota(api.admin)
    client = api.as_role(role, ["team-z"] if role == "submitter" else [])
    quota = client.post("/v1/resourceflavors", json={"metadata": {"name": "a100"}, "spec": {}})
    assert (quota.status_code == 201) is can_write_quota, quota.text
    cluster = client.post(
        "/v1/clusters",
        json={
            "metadata": {"name": "c1"},
            "spec": {"server": "https://c1.example:6443", "credentials": {"token": "t"}},
        },
    )
    assert (cluster.status_code == 201) is can_write_cluster, cluster.text
    submitted = client.post("/v1/namespaces/team-a/workloads", json=workload("w"))
    assert (submitted.status_code == 201) is can_submit_anywhere, submitted.text
    token = client.post("/v1/tokens", json={"name": "x", "role": "admin"})
    assert (token.status_code == 201) is can_issue_tokens
    for response in (quota, cluster, submitted, token):
        assert response.status_code in (201, 403), response.text


def test_submitters_are_scoped_to_their_namespaces(api: Api) -> None:
    setup_quota(api.admin)
    setup_quota(api.admin, namespace="team-b")
    team_a = api.as_role("submitter", ["team-a"])
    assert team_a.post("/v1/namespaces/team-a/workloads", json=workload("mine")).status_code == 201
    assert (
        api.admin.post("/v1/namespaces/team-b/workloads", json=workload("theirs")).status_code
        == 201
    )
    _problem(team_a.post("/v1/namespaces/team-b/workloads", json=workload("x")), 403, "forbidden")
    _problem(team_a.get("/v1/namespaces/team-b/workloads/theirs"), 403, "forbidden")
    _problem(team_a.delete("/v1/namespaces/team-b/workloads/theirs"), 403, "forbidden")
    _problem(team_a.get("/v1/workloads"), 403, "forbidden")  # all namespaces
    _problem(team_a.get("/v1/clusters"), 403, "forbidden")
    events = team_a.get("/v1/events").json()["items"]
    assert events and {e["data"].get("namespace") for e in events} == {"team-a"}
    _problem(api.admin.post("/v1/tokens", json={"name": "s", "role": "submitter"}), 422, "invalid")


def test_auditor_reads_and_never_writes(api: Api) -> None:
    setup_quota(api.admin)
    api.admin.post("/v1/namespaces/team-a/workloads", json=workload("w"))
    auditor = api.as_role("auditor")
    assert auditor.get("/v1/workloads").status_code == 200
    assert auditor.get("/v1/clusterqueues/cq-a").status_code == 200
    _problem(auditor.delete("/v1/namespaces/team-a/workloads/w"), 403, "forbidden")
    _problem(
        auditor.patch("/v1/clusterqueues/cq-a", json={"spec": {"stopPolicy": "Hold"}}),
        403,
        "forbidden",
    )
    streams = {
        e["stream"] for e in auditor.get("/v1/events", params={"limit": 1000}).json()["items"]
    }
    assert not any(s.startswith("token-") for s in streams)


def test_cluster_credentials_are_encrypted_and_never_returned(api: Api) -> None:
    secret = "very-secret-bearer-token-123"
    created = api.admin.post(
        "/v1/clusters",
        json={
            "metadata": {"name": "east", "labels": {"region": "east"}},
            "spec": {"server": "https://east.example:6443", "credentials": {"token": secret}},
        },
    )
    assert created.status_code == 201, created.text
    assert secret not in created.text and "credentials" not in created.json()["spec"]
    for path in ("/v1/clusters", "/v1/clusters/east", "/v1/events?limit=1000"):
        assert secret not in api.admin.get(path).text
    with api.services.engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT data::text FROM events").scalars().all()
        rows = (
            conn.exec_driver_sql("SELECT secret FROM resources WHERE kind = 'Cluster'")
            .scalars()
            .all()
        )
    assert all(secret not in s for s in stored)
    assert rows[0] is not None and secret.encode() not in bytes(rows[0])
    assert api.services.resources.secret("clusters", "east") == {"token": secret}
    # Replacing without credentials keeps them; with new ones, replaces them.
    current = api.admin.get("/v1/clusters/east").json()
    current["spec"]["cordoned"] = True
    assert api.admin.put("/v1/clusters/east", json=current).status_code == 200
    assert api.services.resources.secret("clusters", "east") == {"token": secret}
    _problem(
        api.admin.post(
            "/v1/clusters", json={"metadata": {"name": "west"}, "spec": {"server": "https://w"}}
        ),
        422,
        "invalid",
    )
    _problem(
        api.admin.post(
            "/v1/clusters",
            json={
                "metadata": {"name": "west"},
                "spec": {"server": "https://w", "credentials": {"token": "a", "kubeconfig": "b"}},
            },
        ),
        422,
        "invalid",
    )


def test_idempotency_key_semantics(api: Api) -> None:
    setup_quota(api.admin)
    headers = {"Idempotency-Key": "submit-1"}
    body = json.dumps(workload("once")).encode()
    first = api.admin.post(
        "/v1/namespaces/team-a/workloads",
        content=body,
        headers={**headers, "Content-Type": "application/json"},
    )
    assert first.status_code == 201
    again = api.admin.post(
        "/v1/namespaces/team-a/workloads",
        content=body,
        headers={**headers, "Content-Type": "application/json"},
    )
    assert again.status_code == 201
    assert again.content == first.content  # byte for byte
    assert again.headers["idempotent-replayed"] == "true"
    other = api.admin.post(
        "/v1/namespaces/team-a/workloads", json=workload("other"), headers=headers
    )
    _problem(other, 422, "idempotency-key-reused")
    # Keys are scoped per principal: another token may reuse the string.
    submitter = api.as_role("submitter", ["team-a"])
    mine = submitter.post(
        "/v1/namespaces/team-a/workloads", json=workload("theirs"), headers=headers
    )
    assert mine.status_code == 201
    events = api.admin.get("/v1/events", params={"type": "WorkloadSubmitted"}).json()["items"]
    assert sorted(e["data"]["name"] for e in events) == ["once", "theirs"]
    # An error response is stored too (a 4xx is an answer), so the retry sees it.
    bad = api.admin.post(
        "/v1/namespaces/team-a/workloads",
        json=workload("x", queue="nope"),
        headers={"Idempotency-Key": "k2"},
    )
    assert bad.status_code == 422
    assert (
        api.admin.post(
            "/v1/namespaces/team-a/workloads",
            json=workload("x", queue="nope"),
            headers={"Idempotency-Key": "k2"},
        ).content
        == bad.content
    )


def test_idempotency_key_in_flight_is_409(api: Api) -> None:
    setup_quota(api.admin)
    store = api.services.idempotency
    from service.app.idempotency import request_hash

    body = json.dumps(workload("slow")).encode()
    admin = api.services.authenticator.cached(ADMIN_TOKEN)
    assert admin is not None
    fingerprint = request_hash("POST", "/v1/namespaces/team-a/workloads", "", body)
    store.claim(admin.key, "held", fingerprint)  # as if a first request were running
    response = api.admin.post(
        "/v1/namespaces/team-a/workloads",
        content=body,
        headers={"Idempotency-Key": "held", "Content-Type": "application/json"},
    )
    _problem(response, 409, "idempotency-key-in-flight")


def test_rate_limits_per_principal(database_url: str, api: Api) -> None:
    other = api.admin.post("/v1/tokens", json={"name": "calm", "role": "auditor"}).json()["token"]
    with (
        serve(database_url, rate_limit_per_second=1, rate_limit_burst=5) as (base_url, _),
        httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as noisy,
        httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {other}"}) as calm,
    ):
        statuses = [noisy.get("/v1/resourceflavors").status_code for _ in range(8)]
        assert statuses[:5] == [200] * 5 and 429 in statuses[5:]
        limited = noisy.get("/v1/resourceflavors")
        body = _problem(limited, 429, "rate-limited")
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.headers["ratelimit-remaining"] == "0"
        assert "burst 5" in body["detail"]
        # One tenant's burst does not starve the others.
        assert calm.get("/v1/resourceflavors").status_code == 200
        assert noisy.get("/healthz").status_code == 200


def test_concurrent_creates_of_one_name_exactly_one_wins(api: Api) -> None:
    results: list[int] = []

    def create() -> None:
        with api.client(ADMIN_TOKEN) as client:
            results.append(client.post("/v1/resourceflavors", json=FLAVOR).status_code)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [201] + [409] * 7


class _DownThenBack(IdempotencyStore):
    """The real store, on a database that refuses the first releases (as
    Postgres does while it restarts)."""

    def __init__(self, engine: sa.Engine, failures: int) -> None:
        super().__init__(engine, ttl_seconds=3600)
        self.failures = failures

    def release(self, principal: str, key: str) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise sa.exc.OperationalError("DELETE", {}, ConnectionError("database restarting"))
        super().release(principal, key)


def test_a_claim_whose_request_failed_while_the_database_was_down_is_released_when_it_returns(
    engine: sa.Engine,
) -> None:
    """A 5xx keeps no response and releases its key; when the release itself
    fails, it is retried in the background, so the client's retry runs again
    instead of meeting 409 "in flight" until the lease ends."""
    store = _DownThenBack(engine, failures=2)

    async def unavailable(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass  # read to its end, as a route reads its body: the key is claimed
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"database unavailable"})

    app = IdempotencyMiddleware(unavailable, store)
    app.RELEASE_RETRY_SECONDS = 0.05

    def claims() -> int:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM idempotency_keys").scalar_one())

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://qm") as client:
            first = await client.post("/v1/x", content=b"{}", headers={"Idempotency-Key": "k"})
            assert (first.status_code, first.content) == (503, b"database unavailable")
            assert claims() == 1  # the release failed: the claim is still there
            for _ in range(100):
                if claims() == 0:
                    break
                await asyncio.sleep(0.02)
            assert claims() == 0 and store.failures == 0
            again = await client.post("/v1/x", content=b"{}", headers={"Idempotency-Key": "k"})
            assert again.status_code == 503  # ran again: not 409 "in flight"

    asyncio.run(scenario())


def test_claims_made_together_answer_as_if_made_one_by_one(engine: sa.Engine) -> None:
    from service.app.idempotency import Claimed, InFlight, Mismatch, Replay, Response

    store = IdempotencyStore(engine, ttl_seconds=3600)
    first = store.claim_many(
        [("p", "a", b"1"), ("p", "a", b"1"), ("p", "b", b"1"), ("p", "b", b"2"), ("q", "a", b"1")]
    )
    # The first request with a key claims it; a second in the same batch meets it.
    assert first == [Claimed(), InFlight(), Claimed(), Mismatch(), Claimed()]
    store.finish_many(
        [
            Response("p", "a", 201, [("content-type", "application/json")], b"{}"),
            Response("p", "b", 503, [], b""),  # not kept: its retry runs again
        ]
    )
    assert store.claim_many([("p", "a", b"1"), ("p", "a", b"2"), ("p", "b", b"9")]) == [
        Replay(201, [("content-type", "application/json")], b"{}"),
        Mismatch(),
        Claimed(),
    ]
    assert store.claim("q", "a", b"1") == InFlight()
