"""A submission whose COMMIT was in flight when its connection died (issue
18, finding 6): it is never answered "nothing was changed" if it committed,
and its retry with the same Idempotency-Key gets the original 201.

Real Postgres, of our own (``pg_ctl``): the test makes COMMIT wait at a
known point with synchronous replication to a standby that does not exist
(the transaction is then committed locally, not yet acknowledged), and
kills that backend, or cuts the API's connections through a TCP proxy,
while it waits. No patching: the API, its pool and the server are real.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from service.app.migrate import upgrade
from tests.api.conftest import ADMIN_TOKEN, serve, setup_quota, workload
from tests.api.tcp_proxy import TcpProxy, tcp_proxy
from tests.waiting import wait_for as wait_until
from tests.workers.stack import PrivatePostgres, private_postgres

PATH = "/v1/namespaces/team-a/workloads"


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    with private_postgres() as pg:
        admin = sa.create_engine(pg.server_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql("CREATE DATABASE qm")
            # The private server runs with synchronous_commit off; here
            # commits are to wait for the (missing) standby when told to.
            conn.exec_driver_sql("ALTER DATABASE qm SET synchronous_commit = on")
        admin.dispose()
        upgrade(pg.url("qm"))
        yield pg


@pytest.fixture
def direct(server: PrivatePostgres) -> Iterator[sa.Engine]:
    """Statements straight to the server (not through the proxy)."""
    engine = sa.create_engine(server.url("qm"), isolation_level="AUTOCOMMIT")
    yield engine
    with engine.connect() as conn:
        conn.exec_driver_sql("ALTER SYSTEM RESET synchronous_standby_names")
        conn.exec_driver_sql("SELECT pg_reload_conf()")
        conn.exec_driver_sql("TRUNCATE idempotency_keys")
    engine.dispose()


@pytest.fixture
def proxied(server: PrivatePostgres) -> Iterator[tuple[TcpProxy, str]]:
    url = server.url("qm")
    with tcp_proxy(url) as proxy, serve(proxy.url(url)) as (base_url, _):
        yield proxy, base_url


def _sync_rep(direct: sa.Engine, on: bool) -> None:
    with direct.connect() as conn:
        if on:
            conn.exec_driver_sql("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        else:
            conn.exec_driver_sql("ALTER SYSTEM RESET synchronous_standby_names")
        conn.exec_driver_sql("SELECT pg_reload_conf()")
    if on:
        # The server takes the setting up a moment later: on once a probe's
        # COMMIT waits for the standby.
        wait_until(lambda: _probe_waits(direct), 60, "commits wait for a standby")


def _probe_waits(direct: sa.Engine) -> bool:
    probe = direct.connect()
    pid = probe.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

    def commit() -> None:
        with contextlib.suppress(sa.exc.DBAPIError):
            probe.exec_driver_sql("BEGIN")
            probe.exec_driver_sql("SELECT pg_logical_emit_message(true, 'probe', '')")
            probe.exec_driver_sql("COMMIT")

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    with direct.connect() as conn:
        for _ in range(20):
            waiting = conn.exec_driver_sql(
                f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event = 'SyncRep'"
            ).scalar()
            if waiting or not thread.is_alive():
                break
            thread.join(0.05)
    if waiting:
        _terminate(direct, pid)
    thread.join(10)
    probe.invalidate()
    return bool(waiting)


def _commit_waits(direct: sa.Engine, submit: Any) -> int:
    """Start ``submit``; hold it at the ledger's tip lock (its key claimed,
    its COMMIT not sent), make commits wait for a standby, let it go on:
    the pid of its backend, waiting in COMMIT."""
    with direct.connect() as holder:
        holder.exec_driver_sql("BEGIN")
        holder.exec_driver_sql("SELECT * FROM ledger_head FOR UPDATE")
        thread = threading.Thread(target=submit, daemon=True)
        thread.start()
        with direct.connect() as conn:
            wait_until(
                lambda: conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted"
                ).scalar_one(),
                60,
                "the submission waits for the ledger's tip",
            )
        _sync_rep(direct, on=True)
        holder.exec_driver_sql("ROLLBACK")
    with direct.connect() as conn:
        pid: int = wait_until(
            lambda: conn.exec_driver_sql(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).scalar(),
            60,
            "the submission's COMMIT waits for the standby",
        )
    return pid


def _terminate(direct: sa.Engine, pid: int) -> None:
    with direct.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")


def _stored(direct: sa.Engine, name: str) -> list[str]:
    with direct.connect() as conn:
        return [
            str(uid)
            for (uid,) in conn.execute(
                sa.text("SELECT uid FROM resources WHERE kind = 'Workload' AND name = :n"),
                {"n": name},
            )
        ]


def test_a_commit_cut_short_that_committed_answers_201_and_so_does_its_retry(
    direct: sa.Engine, proxied: tuple[TcpProxy, str]
) -> None:
    """The backend is killed in COMMIT with the server up: Postgres can say
    at once that the transaction committed, so the answer is the 201."""
    _, base_url = proxied
    client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    setup_quota(client)
    key = {"Idempotency-Key": "cut-in-commit"}
    answers: list[httpx.Response] = []
    pid = _commit_waits(
        direct, lambda: answers.append(client.post(PATH, json=workload("w1"), headers=key))
    )
    _terminate(direct, pid)
    _sync_rep(direct, on=False)
    wait_until(lambda: answers, 60, "the submission is answered")
    first = answers[0]
    assert _stored(direct, "w1") != []  # it committed: never "nothing was changed"
    assert first.status_code == 201, first.text
    assert first.json()["metadata"]["uid"] == _stored(direct, "w1")[0]
    assert first.json() == client.get(f"{PATH}/w1").json()
    again = client.post(PATH, json=workload("w1"), headers=key)
    assert (again.status_code, again.json()) == (201, first.json())
    assert again.headers["idempotent-replayed"] == "true"
    assert client.post(PATH, json=workload("w1")).status_code == 409  # no key: taken
    client.close()


def test_an_unknown_outcome_is_said_and_the_retry_with_its_key_gets_the_original_201(
    direct: sa.Engine, proxied: tuple[TcpProxy, str]
) -> None:
    """The API loses Postgres while its COMMIT waits (the proxy cut): it
    cannot know the outcome, says so, and learns it once Postgres is back."""
    proxy, base_url = proxied
    client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    setup_quota(client)
    key = {"Idempotency-Key": "unknown-outcome"}
    answers: list[httpx.Response] = []
    pid = _commit_waits(
        direct, lambda: answers.append(client.post(PATH, json=workload("w2"), headers=key))
    )
    proxy.cut()
    wait_until(lambda: answers, 60, "the submission is answered")
    first = answers[0]
    assert first.status_code == 503, first.text
    assert first.headers["content-type"] == "application/problem+json"
    assert first.json()["type"].endswith("/outcome-unknown")
    assert "Idempotency-Key" in first.json()["detail"] and "Retry-After" in first.headers
    # The transaction had committed locally; it completes when its wait ends.
    _terminate(direct, pid)
    _sync_rep(direct, on=False)
    assert len(_stored(direct, "w2")) == 1
    proxy.restore()

    def retried() -> httpx.Response | None:
        response = client.post(PATH, json=workload("w2"), headers=key)
        return response if response.status_code not in (409, 503) or _final(response) else None

    again = wait_until(retried, 60, "the retry gets an answer, not 'retry later'", interval=0.2)
    assert again.status_code == 201, again.text
    assert again.json()["metadata"]["uid"] == _stored(direct, "w2")[0]
    assert again.json() == client.get(f"{PATH}/w2").json()
    assert again.headers["idempotent-replayed"] == "true"
    assert client.post(PATH, json=workload("w2")).status_code == 409  # no key: taken
    client.close()


def _final(response: httpx.Response) -> bool:
    """A 409 or 503 that is an answer, not "in flight" or "unavailable"."""
    kind = str(response.json().get("type", ""))
    return not kind.endswith(("/idempotency-key-in-flight", "/database-unavailable"))
