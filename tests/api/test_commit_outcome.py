"""A submission whose COMMIT was in flight when its connection died (issue
18, finding 6): it is never answered "nothing was changed" if it committed,
and its retry with the same Idempotency-Key gets the original 201.

Real Postgres, of our own, with COMMIT held and cut as tests/api/
commit_faults.py does; every other write is tested so in
test_indoubt_writes.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from tests.api.commit_faults import (
    commit_waits,
    direct,
    final,
    server,
    sync_rep,
    terminate,
)
from tests.api.conftest import ADMIN_TOKEN, serve, setup_quota, workload
from tests.api.tcp_proxy import TcpProxy, tcp_proxy
from tests.waiting import wait_for as wait_until
from tests.workers.stack import PrivatePostgres

__all__ = ["direct", "server"]  # fixtures, used by name

PATH = "/v1/namespaces/team-a/workloads"


@pytest.fixture
def proxied(server: PrivatePostgres) -> Iterator[tuple[TcpProxy, str]]:
    url = server.url("qm")
    with tcp_proxy(url) as proxy, serve(proxy.url(url)) as (base_url, _):
        yield proxy, base_url


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
    pid = commit_waits(
        direct, lambda: answers.append(client.post(PATH, json=workload("w1"), headers=key))
    )
    terminate(direct, pid)
    sync_rep(direct, on=False)
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
    pid = commit_waits(
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
    terminate(direct, pid)
    sync_rep(direct, on=False)
    assert len(_stored(direct, "w2")) == 1
    proxy.restore()

    def retried() -> httpx.Response | None:
        response = client.post(PATH, json=workload("w2"), headers=key)
        return response if final(response) else None

    again = wait_until(retried, 60, "the retry gets an answer, not 'retry later'", interval=0.2)
    assert again.status_code == 201, again.text
    assert again.json()["metadata"]["uid"] == _stored(direct, "w2")[0]
    assert again.json() == client.get(f"{PATH}/w2").json()
    assert again.headers["idempotent-replayed"] == "true"
    assert client.post(PATH, json=workload("w2")).status_code == 409  # no key: taken
    client.close()
