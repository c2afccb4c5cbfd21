"""The submit fast path answers exactly as FastAPI's declared route does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from service.api import routes
from service.api.app import create_app
from service.api.fastpath import SubmitFastPath
from tests.api.conftest import ADMIN_TOKEN, Api, setup_quota, workload


def _without_fast_path(app: FastAPI) -> FastAPI:
    fast_path: Any = SubmitFastPath  # a middleware class, as Starlette keeps them
    app.user_middleware = [m for m in app.user_middleware if m.cls is not fast_path]
    return app


def _bad_image(name: str) -> dict[str, Any]:
    body = workload(name)
    body["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["image"] = "train:latest"
    return body


CASES: list[tuple[str, str, dict[str, str], bytes]] = [
    ("created", "team-a", {}, b""),
    ("taken", "team-a", {}, b""),
    ("malformed", "team-a", {}, b'{"kind": '),
    ("unknown field", "team-a", {}, json.dumps({**workload("x"), "extra": 1}).encode()),
    ("no token", "team-a", {"authorization": ""}, b""),
    ("bad token", "team-a", {"authorization": "Bearer nope"}, b""),
    ("yaml", "team-a", {"content-type": "application/yaml"}, b"kind: [\n"),
    ("other namespace in body", "team-b", {}, b""),
    ("unknown queue", "team-a", {}, json.dumps(workload("q", queue="missing")).encode()),
    ("security floor", "team-a", {}, json.dumps(_bad_image("floor")).encode()),
    ("namespace the route refuses", "Team_A", {}, b""),
    ("namespace too long", "a" * 64, {}, b""),
]


def _body(case: str, tag: str) -> bytes:
    if case == "created":
        return json.dumps(workload(f"w-{tag}")).encode()
    if case == "taken":
        return json.dumps(workload("taken")).encode()
    body = workload("o")
    if case == "other namespace in body":
        body["metadata"]["namespace"] = "team-a"
    return json.dumps(body).encode()


async def _answers(app: FastAPI, tag: str) -> list[tuple[int, dict[str, str], Any]]:
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}
    answers = []
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        for case, namespace, extra, given in CASES:
            raw = given or _body(case, tag)
            response = await client.post(
                f"/v1/namespaces/{namespace}/workloads",
                content=raw,
                headers={**headers, **extra},
            )
            kept = {
                k: v
                for k, v in response.headers.items()
                if k in ("content-type", "www-authenticate", "etag", "location")
            }
            body = response.json()
            if case == "created":  # its own name, uid and times
                body = sorted(body)
                kept.pop("etag")
            answers.append((response.status_code, kept, body))
    return answers


def test_the_fast_path_answers_as_the_declared_route(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_quota(api.admin)
    assert api.admin.post("/v1/namespaces/team-a/workloads", json=workload("taken")).is_success
    through_fastapi: list[str] = []
    handler = routes.submit_workload

    async def counted(request: Any, namespace: str, principal: Any) -> Any:
        through_fastapi.append(namespace)
        return await handler(request, namespace, principal)

    monkeypatch.setattr(routes, "submit_workload", counted)  # the declared route's, not ours
    fast = asyncio.run(_answers(create_app(api.services), "fast"))
    assert through_fastapi == []  # the two the route refuses never reach its handler
    declared = asyncio.run(_answers(_without_fast_path(create_app(api.services)), "declared"))
    assert len(through_fastapi) == 8  # all but the unauthenticated and the refused paths
    for (case, *_), one, other in zip(CASES, fast, declared, strict=True):
        assert one == other, case
    assert [status for status, _, _ in fast] == [
        201,
        409,
        400,
        422,
        401,
        401,
        400,
        422,
        422,
        422,
        422,
        422,
    ]


def test_submissions_are_counted_under_their_route(api: Api) -> None:
    setup_quota(api.admin)
    api.admin.post("/v1/namespaces/team-a/workloads", json=workload("counted"))
    text = api.admin.get("/metrics").text
    route = "/v1/namespaces/{namespace}/workloads"
    assert f'qm_http_requests_total{{method="POST",route="{route}",status="201"}}' in text
