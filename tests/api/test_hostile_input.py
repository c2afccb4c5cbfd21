"""A hostile tenant's bodies fail only its own requests, are refused with
problem+json naming the field, and cost the API no work (or memory) before
their sender is authorised (issue 18, findings 3 and 4)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil
import sqlalchemy as sa

from service.api.group_commit import DATABASE_DOWN, GroupCommit
from service.app.auth import Principal, Role
from service.app.resources import Actor
from service.app.submissions import Outcome, Submission
from service.app.workloads import parse_submission
from tests.api.conftest import Api, serve, setup_quota, workload

PROBLEM = "application/problem+json"


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"n": value}
    return value


def _deep(name: str) -> dict[str, Any]:
    body = workload(name)
    body["spec"]["podSets"][0]["template"]["metadata"] = {"annotations": {}}
    body["spec"]["podSets"][0]["template"]["spec"]["affinity"] = _nested(300)
    return body


def _huge(name: str, memory: Any = "1e30") -> dict[str, Any]:
    body = workload(name)
    requests = body["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]
    requests["requests"]["memory"] = memory
    return body


def _hostile(index: int) -> dict[str, Any]:
    return [_deep, _huge, lambda n: _huge(n, 10**30)][index % 3](f"evil-{index}")


def _refused(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    return body


def test_a_hostile_tenant_fails_only_its_own_submissions(api: Api) -> None:
    """Depth, quantities and integers are checked before submissions are
    batched: every good one of another namespace is created while another
    tenant posts bodies that used to fail the whole batch with 500."""
    setup_quota(api.admin, namespace="good")
    setup_quota(api.admin, namespace="evil", cq="cq-evil")
    good = api.as_role("submitter", ["good"])
    evil = api.as_role("submitter", ["evil"])

    def attack(index: int) -> int:
        body = json.dumps(_hostile(index))
        headers = {"content-type": "application/json"}
        return evil.post("/v1/namespaces/evil/workloads", content=body, headers=headers).status_code

    def submit(index: int) -> int:
        return good.post("/v1/namespaces/good/workloads", json=workload(f"g{index}")).status_code

    with ThreadPoolExecutor(16) as pool:
        attacks = [pool.submit(attack, i) for i in range(120)]
        goods = [pool.submit(submit, i) for i in range(120)]
        assert Counter(f.result() for f in goods) == {201: 120}
        assert Counter(f.result() for f in attacks) == {422: 120}


def test_each_hostile_value_is_a_4xx_naming_its_field(api: Api) -> None:
    setup_quota(api.admin)
    post = api.admin.post
    deep = _refused(post("/v1/namespaces/team-a/workloads", json=_deep("deep")), 422)
    assert deep["errors"][0]["field"].startswith("spec.podSets[0].template.spec.affinity.n.n")
    huge = _refused(post("/v1/namespaces/team-a/workloads", json=_huge("huge")), 422)
    assert "memory" in huge["errors"][0]["field"]
    assert "9223372036854775807" in huge["errors"][0]["message"]
    # An integer beyond 2^53 anywhere, such as a cohort's weight.
    weight = {"metadata": {"name": "c"}, "spec": {"fairSharing": {"weight": 2**70}}}
    body = _refused(post("/v1/cohorts", json=weight), 422)
    assert body["errors"][0]["field"] == "spec.fairSharing.weight"
    # A gang whose total no ledger entry holds exactly (each pod within int64).
    gang = _huge("gang", "4Ei")
    gang["spec"]["podSets"][0]["count"] = 4
    body = _refused(post("/v1/namespaces/team-a/workloads", json=gang), 422)
    assert body["errors"][0]["field"] == "spec.podSets"
    # Nesting past what any JSON parser recurses through.
    bomb = b"[" * 100_000 + b"]" * 100_000
    headers = {"content-type": "application/json"}
    _refused(post("/v1/namespaces/team-a/workloads", content=bomb, headers=headers), 400)


class _Poisoned:
    """A submission that passed validation yet cannot be committed: its
    spec nests deeper than the serialiser goes (as before depth was checked)."""

    @staticmethod
    def make(actor: Actor) -> Submission:
        parsed = parse_submission(workload("poisoned"))
        parsed.spec.podSets[0].template["spec"]["affinity"] = _nested(300)
        return Submission(actor, "team-a", parsed)


def test_a_bare_number_body_is_refused_not_an_error(api: Api) -> None:
    """A body of one long number (schemathesis found it) takes the walk for
    long numbers, which expected an object or an array: a 500."""
    for body in (b"-1.7976931348623157e+308", b"12345678901234567890"):
        response = api.admin.patch(
            "/v1/resourceflavors/h100",
            content=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert 400 <= response.status_code < 500, response.text


def test_a_batch_that_fails_for_one_item_commits_the_others(api: Api, engine: sa.Engine) -> None:
    """The group commit retries a failed batch in halves: the other
    submissions of the batch are created and only the poisoned one fails."""
    setup_quota(api.admin)
    actor = Actor(Principal("bootstrap", frozenset({Role.ADMIN}), frozenset({"*"})))
    committer: GroupCommit[Submission, Outcome] = GroupCommit(
        api.services.submissions.submit_parsed, shared=DATABASE_DOWN
    )
    goods = [Submission(actor, "team-a", parse_submission(workload(f"w{i}"))) for i in range(9)]

    async def together() -> list[Any]:
        items = [*goods[:4], _Poisoned.make(actor), *goods[4:]]
        return await asyncio.gather(*(committer.submit(s) for s in items), return_exceptions=True)

    outcomes = asyncio.run(together())
    assert [isinstance(o, Exception) for o in outcomes] == [False] * 4 + [True] + [False] * 5
    created = [o["metadata"]["name"] for o in outcomes[:4] + outcomes[5:]]
    assert created == [f"w{i}" for i in range(9)]


BOMB = b"""a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""


def _peak_growth(action: Any) -> tuple[Any, int]:
    """``action()``'s result and how far this process's RSS rose meanwhile
    (the server runs in this process), sampled every few milliseconds."""
    process = psutil.Process(os.getpid())
    before = process.memory_info().rss
    peak, done = before, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.002):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = action()
    finally:
        done.set()
        sampler.join()
    return result, max(peak, process.memory_info().rss) - before


def test_a_yaml_alias_bomb_is_refused_with_bounded_memory(api: Api) -> None:
    """Two levels short of the 599-byte bomb that took a process from 159 MB
    to 2.2 GB (9^7 strings once expanded): refused by a loader that bounds
    aliases, and for an auditor before its body is read."""
    setup_quota(api.admin)
    headers = {"content-type": "application/yaml"}
    for client in (api.admin, api.as_role("auditor")):
        response, growth = _peak_growth(
            lambda c=client: c.post(
                "/v1/namespaces/team-a/workloads", content=BOMB, headers=headers
            )
        )
        assert response.status_code in (400, 403), response.text
        assert response.headers["content-type"] == PROBLEM
        assert growth < 100 << 20, f"RSS grew {growth >> 20} MiB"
    recursive = b"a: &a [*a]\n"
    _refused(
        api.admin.post("/v1/namespaces/team-a/workloads", content=recursive, headers=headers), 400
    )


def _post_headers_only(base_url: str, path: str, headers: dict[str, str]) -> bytes:
    """Send a request's headers announcing a 100 MB body, none of the body,
    and read the answer: an API that waits for the body never answers."""
    host, port = base_url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Length: 104857600"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_no_body_is_read_before_the_caller_is_authorised(api: Api) -> None:
    """A made-up token (with an Idempotency-Key, whose middleware used to
    buffer 64 MiB first) is answered 401 from the headers alone; a real token
    without the right role is answered 403 the same way; so is a bulk."""
    setup_quota(api.admin)
    auditor = api.as_role("auditor")
    token = auditor.headers["authorization"]
    for path, auth, status in [
        ("/v1/namespaces/team-a/workloads", "Bearer made-up", b"401"),
        ("/v1/namespaces/team-a/workloads", token, b"403"),
        ("/v1/namespaces/team-a/bulk/workloads", token, b"403"),
        ("/v1/clusterqueues", token, b"403"),
    ]:
        headers = {
            "Authorization": auth,
            "Idempotency-Key": "k",
            "Content-Type": "application/json",
        }
        answer = _post_headers_only(api.base_url, path, headers)
        assert answer.split(b" ")[1] == status, (path, answer)
        assert b"application/problem+json" in answer


def _bulk(count: int, pad: int = 0) -> bytes:
    item = workload("NAME")
    item["metadata"]["annotations"] = {"pad": "x" * pad}
    template = json.dumps(item)
    items = ",".join(template.replace("NAME", f"b{index}") for index in range(count))
    return ('{"items": [' + items + "]}").encode()


def test_a_large_bulk_body_with_too_many_items_is_refused_before_it_is_parsed(
    database_url: str, engine: sa.Engine
) -> None:
    """A 60 MB body took 410 MB to parse before the count was
    checked: counted from the bytes, it is refused with a bounded peak."""
    body = _bulk(80_000)
    assert len(body) > 50 << 20
    with serve(database_url) as (base_url, services):
        api = Api(base_url, services)
        setup_quota(api.admin)
        headers = {"content-type": "application/json"}
        response, growth = _peak_growth(
            lambda: api.admin.post(
                "/v1/namespaces/team-a/bulk/workloads", content=body, headers=headers
            )
        )
        api.close()
    problem = _refused(response, 422)
    assert problem["errors"][0]["field"] == "items"
    # The body itself is copied a few times; its document would be ~7 times it.
    assert growth < 4 * len(body), f"RSS grew {growth >> 20} MiB for {len(body) >> 20} MiB"


def test_a_bulk_within_the_count_still_commits(api: Api) -> None:
    setup_quota(api.admin)
    headers = {"content-type": "application/json"}
    response = api.admin.post(
        "/v1/namespaces/team-a/bulk/workloads", content=_bulk(20), headers=headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["created"] == 20


def _raw_get(base_url: str, target: bytes) -> bytes:
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: qm\r\n\r\n")
        answer = b""
        # Until the answer is whole: the server then resets the connection,
        # with most of the request still unread.
        while not _complete(answer) and (chunk := conn.recv(65536)):
            answer += chunk
        return answer


def _complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        None,
    )
    return bool(found) and length is not None and len(body) >= length


def test_a_url_too_long_to_parse_is_answered_with_problem_json(database_url: str) -> None:
    """httptools and h11 refuse it themselves, before the app runs: with our
    protocols (those ``quartermaster api`` serves with), in problem+json."""
    from service.api.server import ProblemH11Protocol, ProblemHttpToolsProtocol

    target = b"/v1/resourceflavors?x=" + b"a" * 200_000
    for protocol in (ProblemHttpToolsProtocol, ProblemH11Protocol):
        with serve(database_url, server_options={"http": protocol}) as (base_url, _):
            answer = _raw_get(base_url, target)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b"content-type: application/problem+json" in head
        assert json.loads(body)["type"].endswith("/malformed-request")
