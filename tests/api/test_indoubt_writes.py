"""Every acknowledged write whose COMMIT was cut short (issue 18, finding 6,
beyond submissions): admin creates, replaces, patches and deletes, cancel, scale,
tokens issued and revoked, bulk submissions and checkpoints signed on
demand. Never "nothing was changed" when it may have been: what committed
is answered as such, an unknown outcome is said (503 ``outcome-unknown``),
and the retry with the same Idempotency-Key gets the original answer.

Real Postgres of our own, COMMIT held and cut as tests/api/commit_faults.py
does: its backend killed (the server up), or the API's connections cut
through a TCP proxy (the API cannot know until Postgres is back).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import sqlalchemy as sa

from service.app.submissions import BULK_CHUNK
from service.ledger.checkpoint import DEFAULT_ORIGIN, NoteSigner
from tests.api.commit_faults import (
    EVENT_HEAD,
    commit_waits,
    direct,
    final,
    held_at,
    server,
    sync_rep,
    terminate,
    waiting_pid,
)
from tests.api.conftest import ADMIN_TOKEN, serve, setup_quota, workload
from tests.api.tcp_proxy import TcpProxy, tcp_proxy
from tests.floor import test_workload_kinds as kinds
from tests.waiting import wait_for
from tests.workers.stack import PrivatePostgres

__all__ = ["direct", "server"]  # fixtures, used by name

_tags = itertools.count()


@dataclass
class Write:
    """One write: what it needs first, how it is sent (with the headers
    given), its answer's status, and a check that the answer is the
    write's and the write took effect."""

    send: Callable[[httpx.Client, dict[str, str]], httpx.Response]
    status: int
    check: Callable[[httpx.Client, httpx.Response], None]
    lock: str = EVENT_HEAD
    statuses: tuple[int, ...] = ()
    """The answers it may get, when more than ``status``."""

    def answered(self, response: httpx.Response) -> bool:
        return response.status_code in (self.statuses or (self.status,))


def _same_as_read(path: str) -> Callable[[httpx.Client, httpx.Response], None]:
    def check(client: httpx.Client, answer: httpx.Response) -> None:
        assert answer.json() == client.get(path).json()

    return check


def create_flavor(client: httpx.Client, tag: str) -> Write:
    body = {"metadata": {"name": f"f-{tag}"}, "spec": {"nodeLabels": {"sku": tag}}}
    return Write(
        lambda c, h: c.post("/v1/resourceflavors", json=body, headers=h),
        201,
        _same_as_read(f"/v1/resourceflavors/f-{tag}"),
    )


def create_cluster(client: httpx.Client, tag: str) -> Write:
    body = {
        "metadata": {"name": f"c-{tag}"},
        "spec": {"server": "https://member.example:6443", "credentials": {"token": "t"}},
    }
    return Write(
        lambda c, h: c.post("/v1/clusters", json=body, headers=h),
        201,
        _same_as_read(f"/v1/clusters/c-{tag}"),
    )


def replace_cluster_queue(client: httpx.Client, tag: str) -> Write:
    """A PUT with If-Match, relaxing the queue's security floor too: run
    again, it would meet 409 (the version moved on)."""
    setup_quota(client, namespace=f"ns-{tag}", cq=f"cq-{tag}")
    path = f"/v1/clusterqueues/cq-{tag}"
    current = client.get(path)
    body = current.json()
    body.pop("status", None)
    body["spec"]["securityPolicy"] = {"requireImageDigest": False}
    headers = {"If-Match": current.headers["etag"]}
    return Write(
        lambda c, h: c.put(path, json=body, headers={**headers, **h}),
        200,
        _same_as_read(path),
    )


def patch_local_queue(client: httpx.Client, tag: str) -> Write:
    setup_quota(client, namespace=f"ns-{tag}", cq=f"cq-{tag}")
    path = f"/v1/namespaces/ns-{tag}/localqueues/train"
    patch = {"metadata": {"labels": {"patched": tag}}}
    merge = {"Content-Type": "application/merge-patch+json"}
    return Write(
        lambda c, h: c.patch(path, json=patch, headers={**merge, **h}),
        200,
        _same_as_read(path),
    )


def delete_cohort(client: httpx.Client, tag: str) -> Write:
    """A DELETE with If-Match: run again, it would meet 404."""
    created = client.post("/v1/cohorts", json={"metadata": {"name": f"co-{tag}"}, "spec": {}})
    assert created.status_code == 201, created.text
    path = f"/v1/cohorts/co-{tag}"
    headers = {"If-Match": created.headers["etag"]}

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        assert answer.json()["metadata"]["uid"] == created.json()["metadata"]["uid"]
        assert c.get(path).status_code == 404

    return Write(lambda c, h: c.delete(path, headers={**headers, **h}), 200, check)


def cancel_workload(client: httpx.Client, tag: str) -> Write:
    setup_quota(client, namespace=f"ns-{tag}", cq=f"cq-{tag}")
    base = f"/v1/namespaces/ns-{tag}/workloads"
    assert client.post(base, json=workload("w")).status_code == 201

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        assert answer.json()["status"]["state"] in ("Cancelled", "Cancelling")
        assert answer.json() == c.get(f"{base}/w").json()

    return Write(lambda c, h: c.post(f"{base}/w/cancel", headers=h), 200, check)


def scale_workload(client: httpx.Client, tag: str) -> Write:
    """A serving workload's scale subresource: the answer is its Scale."""
    setup_quota(client, namespace=f"ns-{tag}", cq=f"cq-{tag}", workloadClass="inference")
    base = f"/v1/namespaces/ns-{tag}/workloads"
    manifest = kinds.deployment()
    manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "train"
    assert client.post(base, json=manifest).status_code == 201
    path = f"{base}/{manifest['metadata']['name']}/scale"
    patch = {"Content-Type": "application/json"}

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        assert (answer.json()["kind"], answer.json()["spec"]) == ("Scale", {"replicas": 5})
        assert answer.json() == c.get(path).json()

    def send(c: httpx.Client, h: dict[str, str]) -> httpx.Response:
        return c.patch(path, json={"spec": {"replicas": 5}}, headers={**patch, **h})

    return Write(send, 200, check)


def issue_token(client: httpx.Client, tag: str) -> Write:
    """Only the secret's hash is stored: the original answer, secret and
    all, must still be given."""
    body = {"name": f"t-{tag}", "role": "auditor"}

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        secret = answer.json()["token"]
        whoami = c.get("/v1/whoami", headers={"Authorization": f"Bearer {secret}"})
        assert whoami.json()["name"] == f"token:t-{tag}"

    return Write(lambda c, h: c.post("/v1/tokens", json=body, headers=h), 201, check)


def revoke_token(client: httpx.Client, tag: str) -> Write:
    issued = client.post("/v1/tokens", json={"name": f"r-{tag}", "role": "auditor"}).json()
    as_it = {"Authorization": f"Bearer {issued['token']}"}
    assert client.get("/v1/whoami", headers=as_it).status_code == 200

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        assert answer.content == b""
        wait_for(
            lambda: c.get("/v1/whoami", headers=as_it).status_code == 401,
            what="the revoked token is refused",
        )

    return Write(lambda c, h: c.delete(f"/v1/tokens/{issued['id']}", headers=h), 204, check)


def _listed(client: httpx.Client, path: str) -> dict[str, str]:
    """Name to uid of every Workload at ``path``, page by page."""
    found: dict[str, str] = {}
    params: dict[str, str] = {"limit": "1000"}
    while True:
        page = client.get(path, params=params).json()
        found |= {w["metadata"]["name"]: w["metadata"]["uid"] for w in page["items"]}
        if "continue" not in page["metadata"]:
            return found
        params["continue"] = page["metadata"]["continue"]


def bulk_submit(client: httpx.Client, tag: str) -> Write:
    setup_quota(client, namespace=f"ns-{tag}", cq=f"cq-{tag}")
    base = f"/v1/namespaces/ns-{tag}"
    items = {"items": [workload(f"b{i}") for i in range(3)]}

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        created = {r["name"]: r["uid"] for r in answer.json()["results"]}
        assert answer.json()["created"] == len(created) == 3
        assert _listed(c, f"{base}/workloads") == created

    return Write(lambda c, h: c.post(f"{base}/bulk/workloads", json=items, headers=h), 200, check)


def bulk_submit_in_chunks(client: httpx.Client, tag: str) -> Write:
    """Past BULK_CHUNK items, committed in chunks by two threads of its own:
    their transactions are the write's too. The chunk held in COMMIT
    committed; the other one may not have (its connection was cut before
    it sent its COMMIT): the answer says which items are stored, exactly."""
    setup_quota(client, namespace=f"ns-{tag}", cq=f"cq-{tag}")
    base = f"/v1/namespaces/ns-{tag}"
    count = BULK_CHUNK + 200
    items = {"items": [workload(f"b{i}") for i in range(count)]}

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        results = answer.json()["results"]
        created = {r["name"]: r["uid"] for r in results if r["status"] == 201}
        lost = [r for r in results if r["status"] != 201]
        assert len(results) == count and created, answer.text[:500]
        assert all(r["error"]["type"].endswith("/database-unavailable") for r in lost)
        assert answer.status_code == (200 if not lost else 207)
        assert _listed(c, f"{base}/workloads") == created

    def send(c: httpx.Client, h: dict[str, str]) -> httpx.Response:
        return c.post(f"{base}/bulk/workloads", json=items, headers=h)

    return Write(send, 200, check, statuses=(200, 207))


def sign_checkpoint(client: httpx.Client, tag: str) -> Write:
    create_flavor(client, tag).send(client, {})  # the ledger grows: a checkpoint to sign

    def check(c: httpx.Client, answer: httpx.Response) -> None:
        assert answer.text == c.get("/v1/ledger/checkpoints/latest").text

    return Write(
        lambda c, h: c.post("/v1/ledger/checkpoints", headers=h),
        201,
        check,
        lock="LOCK TABLE ledger_checkpoints IN SHARE ROW EXCLUSIVE MODE",
    )


WRITES = [
    create_flavor,
    create_cluster,
    replace_cluster_queue,
    patch_local_queue,
    delete_cohort,
    cancel_workload,
    scale_workload,
    issue_token,
    revoke_token,
    bulk_submit,
    bulk_submit_in_chunks,
    sign_checkpoint,
]
Make = Callable[[httpx.Client, str], Write]


@pytest.fixture(scope="module")
def proxied(server: PrivatePostgres) -> Iterator[tuple[TcpProxy, str]]:
    url = server.url("qm")
    _, seed = NoteSigner.generate(DEFAULT_ORIGIN)
    with tcp_proxy(url) as proxy, serve(proxy.url(url), ledger_signing_key=seed) as (base, _):
        yield proxy, base


@pytest.fixture
def client(proxied: tuple[TcpProxy, str], direct: sa.Engine) -> Iterator[httpx.Client]:
    """The admin, once the API reaches Postgres again (after a cut)."""
    proxy, base_url = proxied
    proxy.restore()
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=base_url, headers=auth, timeout=60) as admin:
        wait_for(
            lambda: admin.get("/v1/resourceflavors").status_code == 200,
            what="the API reaches Postgres",
        )
        yield admin
    proxy.restore()


def _prepared(make: Make, client: httpx.Client) -> tuple[Write, dict[str, str]]:
    tag = f"{make.__name__.replace('_', '-')}-{next(_tags)}"
    return make(client, tag), {"Idempotency-Key": f"key-{tag}"}


def _retried(write: Write, client: httpx.Client, key: dict[str, str]) -> httpx.Response:
    def answer() -> httpx.Response | None:
        response = write.send(client, key)
        return response if final(response) else None

    again: httpx.Response = wait_for(answer, what="the retry gets an answer", interval=0.2)
    return again


@pytest.mark.parametrize("make", WRITES, ids=lambda m: m.__name__)
def test_an_unknown_outcome_is_said_and_the_retry_with_its_key_gets_the_original_answer(
    make: Make, client: httpx.Client, proxied: tuple[TcpProxy, str], direct: sa.Engine
) -> None:
    proxy, _ = proxied
    write, key = _prepared(make, client)
    answers: list[httpx.Response] = []
    pid = commit_waits(direct, lambda: answers.append(write.send(client, key)), write.lock)
    proxy.cut()
    wait_for(lambda: answers, what="the write is answered")
    first = answers[0]
    assert first.status_code == 503, first.text
    assert first.headers["content-type"] == "application/problem+json"
    assert first.json()["type"].endswith("/outcome-unknown"), first.text
    assert "Idempotency-Key" in first.json()["detail"] and "Retry-After" in first.headers
    # It had committed locally; it completes when its wait ends.
    terminate(direct, pid)
    sync_rep(direct, on=False)
    proxy.restore()
    again = _retried(write, client, key)
    assert write.answered(again), again.text[:500]
    assert again.headers["idempotent-replayed"] == "true"
    write.check(client, again)


@pytest.mark.parametrize(
    "make", [create_flavor, delete_cohort, issue_token], ids=lambda m: m.__name__
)
def test_a_commit_cut_short_that_committed_answers_as_committed_and_so_does_its_retry(
    make: Make, client: httpx.Client, direct: sa.Engine
) -> None:
    """The backend killed in COMMIT with the server up: Postgres says at
    once that it committed, and the answer is the write's own."""
    write, key = _prepared(make, client)
    answers: list[httpx.Response] = []
    pid = commit_waits(direct, lambda: answers.append(write.send(client, key)), write.lock)
    terminate(direct, pid)
    sync_rep(direct, on=False)
    wait_for(lambda: answers, what="the write is answered")
    first = answers[0]
    assert first.status_code == write.status, first.text
    write.check(client, first)
    again = write.send(client, key)
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again.headers["idempotent-replayed"] == "true"


def test_a_write_killed_before_its_commit_says_nothing_changed_and_its_retry_runs(
    client: httpx.Client, direct: sa.Engine
) -> None:
    """Its backend killed while it waits for a lock: Postgres says nothing
    committed, so "nothing was changed" is the truth, and the retry with
    its key runs it (the claim is not kept)."""
    write, key = _prepared(replace_cluster_queue, client)
    answers: list[httpx.Response] = []
    holder = held_at(direct, EVENT_HEAD, lambda: answers.append(write.send(client, key)))
    try:
        terminate(direct, waiting_pid(direct))
        wait_for(lambda: answers, what="the write is answered")
    finally:
        holder.exec_driver_sql("ROLLBACK")
        holder.close()
    first = answers[0]
    assert first.status_code == 503, first.text
    assert first.json()["type"].endswith("/database-unavailable"), first.text
    again = _retried(write, client, key)
    assert again.status_code == write.status, again.text
    assert "idempotent-replayed" not in again.headers
    write.check(client, again)
