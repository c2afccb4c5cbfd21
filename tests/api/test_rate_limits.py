"""Rate limits keyed on who asks and shared by every API process, and load
shed before work (issue 18, finding 9). Real Postgres and Redis."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa

from service.runtime.embedded import free_port
from tests.api.conftest import ADMIN_TOKEN, serve, setup_quota, workload
from tests.console.http import Browser
from tests.waiting import wait_for

FLAVORS = "/v1/resourceflavors"


def _statuses(base_url: str, headers: list[dict[str, str]]) -> list[int]:
    with httpx.Client(base_url=base_url) as client:
        return [client.get(FLAVORS, headers=h).status_code for h in headers]


def test_spellings_of_the_scheme_share_their_principals_bucket(database_url: str) -> None:
    spellings = ["Bearer {}", "bearer {}", "BEARER {}", "Bearer   {}", "bEaReR {}"]
    with serve(database_url, rate_limit_per_second=0.01, rate_limit_burst=3) as (url, _):
        headers = [{"Authorization": s.format(ADMIN_TOKEN)} for s in spellings]
        assert _statuses(url, headers) == [200, 200, 200, 429, 429]


def test_made_up_tokens_are_limited_by_client_address(database_url: str) -> None:
    with serve(
        database_url, rate_limit_anonymous_per_second=0.01, rate_limit_anonymous_burst=4
    ) as (url, _):
        made_up = [{"Authorization": f"Bearer made-up-{i}"} for i in range(6)]
        assert _statuses(url, made_up) == [401] * 4 + [429] * 2
        # A known principal has its own bucket, not the address's.
        assert _statuses(url, [{"Authorization": f"Bearer {ADMIN_TOKEN}"}]) == [200]


def test_two_api_processes_share_one_limit_through_redis(database_url: str, redis_url: str) -> None:
    limits: dict[str, Any] = {
        "rate_limit_per_second": 0.01,
        "rate_limit_burst": 6,
        "rate_limit_redis_url": redis_url,
    }
    redis.Redis.from_url(redis_url).flushdb()
    with serve(database_url, **limits) as (first, _), serve(database_url, **limits) as (second, _):
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        statuses = [
            status
            for _ in range(5)
            for status in (_statuses(first, [auth])[0], _statuses(second, [auth])[0])
        ]
    assert statuses.count(200) == 6 and statuses.count(429) == 4


def test_without_redis_each_process_limits_alone_and_says_so_once(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    limits: dict[str, Any] = {
        "rate_limit_per_second": 0.01,
        "rate_limit_burst": 3,
        "rate_limit_redis_url": nowhere,
    }
    with (
        caplog.at_level(logging.WARNING, "service.api.ratelimit"),
        serve(database_url, **limits) as (
            url,
            _,
        ),
    ):
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert _statuses(url, [auth] * 5) == [200, 200, 200, 429, 429]
    said = [r.getMessage() for r in caplog.records if r.name == "service.api.ratelimit"]
    assert len(said) == 1 and "Redis unreachable" in said[0]


@pytest.fixture
def one_in_flight(database_url: str, engine: sa.Engine) -> Iterator[str]:
    with serve(database_url, max_in_flight=1) as (url, _):
        yield url


def test_open_event_streams_are_not_requests_in_flight(one_in_flight: str) -> None:
    """The API's stream and the console's stay open for as long as their
    clients watch: with one request allowed in flight, both open, a request
    beside them is still served."""
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    console = Browser(one_in_flight)
    assert console.sign_in(ADMIN_TOKEN).status_code in (200, 303)
    timeout = httpx.Timeout(60)
    with (
        httpx.Client(base_url=one_in_flight, headers=auth, timeout=timeout) as client,
        client.stream("GET", "/v1/events?watch=true") as api_stream,
        console.http.stream("GET", "/ui/events", headers=console.cookie_header()) as ui_stream,
    ):
        assert (api_stream.status_code, ui_stream.status_code) == (200, 200)
        assert client.get(FLAVORS).status_code == 200
    console.http.close()


def test_a_process_with_its_requests_all_in_flight_sheds_the_next_at_once(
    one_in_flight: str, engine: sa.Engine
) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=one_in_flight, headers=auth, timeout=60) as client:
        setup_quota(client)
        answers: list[int] = []
        with engine.connect() as holder:
            # The ledger's tip held: a submission stays in flight.
            holder.exec_driver_sql("BEGIN")
            holder.exec_driver_sql("SELECT * FROM ledger_head FOR UPDATE")
            path = "/v1/namespaces/team-a/workloads"
            thread = threading.Thread(
                target=lambda: answers.append(client.post(path, json=workload("held")).status_code)
            )
            thread.start()
            with engine.connect() as conn:
                wait_for(
                    lambda: conn.exec_driver_sql(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted"
                    ).scalar_one(),
                    what="the submission waits for the ledger's tip",
                )
            shed = client.get(FLAVORS)
            holder.exec_driver_sql("ROLLBACK")
        thread.join(60)
    assert shed.status_code == 503, shed.text
    assert shed.headers["content-type"] == "application/problem+json"
    assert shed.json()["type"].endswith("/overloaded") and shed.headers["retry-after"] == "1"
    assert answers == [201]
