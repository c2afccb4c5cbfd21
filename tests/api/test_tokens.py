"""Bearer tokens: they expire, their names are never reused (the audit trail
names a holder by it), and a revocation ends open event streams and holds on
every API process within seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx

from tests.api.conftest import Api, serve
from tests.api.test_resources import _fields, _problem


def _until(what: str, condition: Callable[[], bool], ceiling: float = 60.0) -> None:
    deadline = time.monotonic() + ceiling
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what} after {ceiling} s"
        time.sleep(0.2)


def _issue(api: Api, name: str, **extra: object) -> httpx.Response:
    body = {"name": name, "role": "auditor", **extra}
    return api.admin.post("/v1/tokens", json=body)


def test_tokens_expire(api: Api) -> None:
    lasting = _issue(api, "lasting").json()
    expires = datetime.fromisoformat(lasting["expiresAt"])
    assert timedelta(days=89) < expires - datetime.now(UTC) <= timedelta(days=90)
    brief = _issue(api, "brief", expiresInSeconds=2)
    assert brief.status_code == 201, brief.text
    client = api.client(brief.json()["token"])
    assert client.get("/v1/whoami").status_code == 200
    _until("the token to expire", lambda: client.get("/v1/whoami").status_code == 401)
    assert "expired" in client.get("/v1/whoami").json()["detail"]
    listed = {t["name"]: t for t in api.admin.get("/v1/tokens").json()["items"]}
    assert listed["brief"]["expiresAt"] == brief.json()["expiresAt"]
    too_long = _issue(api, "forever", expiresInSeconds=10 * 365 * 86400)
    assert _fields(_problem(too_long, 422, "invalid")) == ["expiresInSeconds"]


def test_a_token_name_is_never_reused(api: Api) -> None:
    first = _issue(api, "ci-bot")
    assert first.status_code == 201
    body = _problem(_issue(api, "ci-bot"), 409, "already-exists")
    assert _fields(body) == ["name"]
    assert api.admin.delete(f"/v1/tokens/{first.json()['id']}").status_code == 204
    _problem(_issue(api, "ci-bot"), 409, "already-exists")  # not after revocation either
    names = [t["name"] for t in api.admin.get("/v1/tokens").json()["items"]]
    assert names.count("ci-bot") == 1


def test_revocation_ends_open_streams_and_holds_on_every_process(
    api: Api, database_url: str
) -> None:
    issued = _issue(api, "watcher").json()
    token = issued["token"]
    lines: list[str] = []
    ended = threading.Event()

    def watch() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(base_url=api.base_url, headers=headers, timeout=120) as client,
            client.stream(
                "GET", "/v1/events", params={"watch": "true", "timeoutSeconds": 300}
            ) as response,
        ):
            for line in response.iter_lines():
                lines.append(line)
        ended.set()

    with serve(database_url) as (other_url, _):
        other = httpx.Client(
            base_url=other_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert other.get("/v1/whoami").status_code == 200
        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        _until("the stream to open", lambda: any(line.startswith("retry") for line in lines))
        assert api.admin.delete(f"/v1/tokens/{issued['id']}").status_code == 204
        _until("the stream to end", ended.is_set)
        assert "event: error" in lines
        _until("the other process to refuse it", lambda: other.get("/v1/whoami").status_code == 401)
        other.close()
    thread.join(10)
