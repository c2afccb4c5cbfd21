"""The database away under load (issue 18, finding 7): every request gets
an answer, 503 problem+json with Retry-After, and the outage is logged
twice, when it starts and when it ends: not a traceback per request.

The API reaches the real Postgres through a TCP proxy the test cuts (every
connection closed, new ones refused) and restores.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.api.conftest import ADMIN_TOKEN, serve, setup_quota, workload
from tests.api.tcp_proxy import TcpProxy, tcp_proxy
from tests.waiting import wait_for as wait_until

PATH = "/v1/namespaces/team-a/workloads"


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.records.append(record)


@pytest.fixture
def records() -> Iterator[Records]:
    """Every record of every logger, uvicorn's too (it does not propagate)."""
    handler = Records()
    loggers = [
        logging.getLogger(),
        logging.getLogger("uvicorn"),
        logging.getLogger("uvicorn.error"),
    ]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.fixture
def proxied(database_url: str, engine: object) -> Iterator[tuple[TcpProxy, str]]:
    with tcp_proxy(database_url) as proxy, serve(proxy.url(database_url)) as (base_url, _):
        yield proxy, base_url


def _request(client: httpx.Client, index: int) -> httpx.Response | Exception:
    """One of the requests clients make, in turn: submissions with and
    without a key, a list, an admin write, a write with a token the API has
    not seen (authenticated from the database before any route runs)."""
    try:
        kind = index % 5
        if kind == 4:
            return client.post(PATH, json=workload("x"), headers={"Authorization": "Bearer unseen"})
        if kind == 0:
            headers = {"Idempotency-Key": f"outage-{index}"}
            return client.post(PATH, json=workload(f"o-{index}"), headers=headers)
        if kind == 1:
            return client.post(PATH, json=workload(f"o-{index}"))
        if kind == 2:
            return client.get(PATH)
        flavor = {"metadata": {"name": f"f-{index}"}, "spec": {"nodeLabels": {"sku": "x"}}}
        return client.post("/v1/resourceflavors", json=flavor)
    except httpx.HTTPError as error:  # no answer: the connection dropped
        return error


def test_requests_while_the_database_is_down_get_503s_and_the_outage_is_logged_twice(
    proxied: tuple[TcpProxy, str], records: Records
) -> None:
    proxy, base_url = proxied
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        setup_quota(client)
        assert client.post(PATH, json=workload("before")).status_code == 201
        proxy.cut()
        wait_until(
            lambda: client.get(PATH).status_code == 503, 60, "the API sees the database gone"
        )
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: _request(client, i), range(240)))
        proxy.restore()
        wait_until(lambda: client.get(PATH).status_code == 200, 60, "the database is back")
        assert client.post(PATH, json=workload("after")).status_code == 201

    dropped = [a for a in answers if isinstance(a, Exception)]
    assert dropped == []
    responses = [a for a in answers if isinstance(a, httpx.Response)]
    assert {r.status_code for r in responses} == {503}
    assert {r.headers["content-type"] for r in responses} == {"application/problem+json"}
    assert all(int(r.headers["retry-after"]) >= 1 for r in responses)
    tracebacks = [r for r in records.records if r.exc_info]
    assert tracebacks == []
    logged = [
        f"{r.name}: {r.getMessage()}" for r in records.records if r.levelno >= logging.WARNING
    ]
    outage = [r.getMessage() for r in records.records if r.name == "service.api.outage"]
    assert len(outage) == 2 and len(logged) == 2, logged
    assert outage[0].startswith("database unavailable since")
    assert outage[1].startswith("database back after")
