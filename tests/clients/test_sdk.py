"""The SDK against the live API: CRUD per kind, paging, problem+json
exceptions, idempotent retries, resumable watch, the async client."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from quartermaster_client import (
    AlreadyExists,
    AsyncClient,
    BeingDeleted,
    Client,
    ClusterQueue,
    Forbidden,
    Invalid,
    NotFound,
    ObjectMeta,
    PolicyRefused,
    ResourceFlavor,
    ServiceUnavailable,
    StaleVersion,
    Unauthorized,
    WatchTimeout,
    Workload,
)
from quartermaster_client.config import ConfigFile
from quartermaster_client.models import (
    ClusterQueueSpec,
    FlavorQuotas,
    ResourceFlavorSpec,
    ResourceGroup,
    ResourceQuota,
)

from tests.api.conftest import ADMIN_TOKEN, serve
from tests.clients.conftest import FAST_RETRIES, job, setup_quota, workload
from tests.clients.proxy import Fault, Proxy, flaky_proxy


def test_crud_per_kind_with_typed_models(qm: Client) -> None:
    flavor = qm.resourceflavors.create(
        ResourceFlavor(
            metadata=ObjectMeta(name="h100"), spec=ResourceFlavorSpec(node_labels={"sku": "h100"})
        )
    )
    assert isinstance(flavor, ResourceFlavor)
    assert flavor.spec.node_labels == {"sku": "h100"}
    assert flavor.metadata.uid and flavor.resource_version
    cq = ClusterQueue(
        metadata=ObjectMeta(name="cq-a", labels={"team": "a"}),
        spec=ClusterQueueSpec(
            resource_groups=[
                ResourceGroup(
                    covered_resources=["nvidia.com/gpu"],
                    flavors=[
                        FlavorQuotas(
                            name="h100",
                            resources=[ResourceQuota(name="nvidia.com/gpu", nominal_quota=64)],
                        )
                    ],
                )
            ]
        ),
    )
    created = qm.clusterqueues.create(cq)
    assert created.spec.nominal() == {"h100": 64}
    assert created.spec.queueing_strategy == "BestEffortFIFO"  # the server's default
    lq = qm.localqueues.create(
        {"metadata": {"name": "train"}, "spec": {"clusterQueue": "cq-a"}}, namespace="team-a"
    )
    assert lq.spec.cluster_queue == "cq-a" and lq.namespace == "team-a"
    wpc = qm.workloadpriorityclasses.create({"metadata": {"name": "urgent"}, "value": 100})
    assert wpc.value == 100

    patched = qm.clusterqueues.patch(
        "cq-a", {"spec": {"stopPolicy": "Hold"}}, if_match=created.resource_version
    )
    assert patched.spec.stop_policy == "Hold"
    assert int(patched.resource_version or 0) > int(created.resource_version or 0)
    with pytest.raises(StaleVersion) as stale:
        qm.clusterqueues.replace(created, if_match=created.resource_version)
    assert stale.value.status == 409
    assert stale.value.problem_type == "stale-version"
    assert [e.field for e in stale.value.errors] == ["metadata.resourceVersion"]

    # apply: unchanged when nothing differs, configured when something does.
    same = qm.clusterqueues.apply(patched)
    assert same.action == "unchanged"
    changed = qm.clusterqueues.apply(
        {"metadata": {"name": "cq-a"}, "spec": {**patched.spec.to_dict(), "stopPolicy": "None"}}
    )
    assert changed.action == "configured"
    assert qm.clusterqueues.get("cq-a").spec.stop_policy == "None"

    assert [c.name for c in qm.clusterqueues.list()] == ["cq-a"]
    assert [q.name for q in qm.localqueues.list(all_namespaces=True)] == ["train"]
    qm.localqueues.delete("train", namespace="team-a")
    qm.clusterqueues.delete("cq-a")
    qm.workloadpriorityclasses.delete("urgent")
    qm.resourceflavors.delete("h100", if_match=flavor.resource_version)
    with pytest.raises(NotFound):
        qm.resourceflavors.get("h100")
    assert list(qm.clusterqueues.list()) == []


def test_list_iterates_over_every_page(qm: Client) -> None:
    setup_quota(qm)
    result = qm.bulk_submit([workload(f"w{i:02d}") for i in range(7)], namespace="team-a")
    assert (result.created, result.failed) == (7, 0)
    first = qm.list_page("workloads", "team-a", limit=3)
    assert len(first.items) == 3 and first.continue_token
    assert int(first.resource_version) > 0
    names = [w.name for w in qm.workloads.list(namespace="team-a", page_size=3)]
    assert names == [f"w{i:02d}" for i in range(7)]
    everywhere = list(qm.workloads.list(all_namespaces=True, page_size=2))
    assert len(everywhere) == 7 and all(isinstance(w, Workload) for w in everywhere)
    assert everywhere[0].status.state == "Pending"
    assert everywhere[0].status.cluster_queue == "cq-a"
    assert everywhere[0].requests() == 16
    pending = qm.workloads.list(
        namespace="team-a", field_selector="status.state=Pending", page_size=4
    )
    assert len(list(pending)) == 7


def test_errors_carry_the_problem_fields(qm: Client, api_url: str) -> None:
    setup_quota(qm)
    bad = workload("bad")
    bad["spec"]["podSets"][0]["count"] = 0
    with pytest.raises(Invalid) as invalid:
        qm.submit(bad, namespace="team-a")
    error = invalid.value
    assert error.status == 422 and error.type.startswith("https://quartermaster.dev/problems/")
    assert error.title and error.detail
    assert [e.field for e in error.errors] == ["spec.podSets[0].count"]
    assert "spec.podSets[0].count" in str(error)

    unsafe = workload("unsafe")
    unsafe["spec"]["podSets"][0]["template"]["spec"]["hostNetwork"] = True
    with pytest.raises(PolicyRefused) as refused:
        qm.submit(unsafe, namespace="team-a")
    assert refused.value.problem_type == "policy-refused"

    qm.submit(workload("w1"), namespace="team-a")
    with pytest.raises(AlreadyExists):
        qm.submit(workload("w1"), namespace="team-a")
    with pytest.raises(NotFound) as missing:
        qm.explain("nope", namespace="team-a")
    assert missing.value.status == 404 and missing.value.problem_type == "not-found"

    # A deleted Cluster's name stays taken until the fleet loop (not running
    # here) has removed what it wrote on the member.
    east = {
        "metadata": {"name": "east"},
        "spec": {"server": "https://east.example:6443", "credentials": {"token": "t"}},
    }
    qm.clusters.create(east)
    qm.clusters.delete("east")
    with pytest.raises(BeingDeleted) as deleting:
        qm.clusters.create(east)
    assert deleting.value.status == 409 and deleting.value.problem_type == "being-deleted"
    assert [e.field for e in deleting.value.errors] == ["metadata.name"]
    assert "not yet attempted" in str(deleting.value)

    with (
        Client(api_url, "wrong-token", retry=FAST_RETRIES) as stranger,
        pytest.raises(Unauthorized),
    ):
        stranger.whoami()
    issued = qm.issue_token("team-b-dev", "submitter", ["team-b"])
    with Client(api_url, issued.token, retry=FAST_RETRIES) as team_b:
        assert team_b.whoami().namespaces == ["team-b"]
        with pytest.raises(Forbidden) as forbidden:
            team_b.submit(workload("w2"), namespace="team-a")
        assert forbidden.value.status == 403


def test_a_lost_answer_is_retried_with_the_same_key_and_submits_once(
    qm: Client, api_url: str
) -> None:
    setup_quota(qm)
    with flaky_proxy(api_url) as proxy:
        proxy.faults.append(Fault("POST", "drop"))
        with Client(proxy.url, ADMIN_TOKEN, retry=FAST_RETRIES) as client:
            created = client.submit(job("once"), namespace="team-a")
        posts = proxy.requests("POST")
    assert created.name == "once"
    assert len(posts) == 2
    keys = {p.headers["idempotency-key"] for p in posts}
    assert len(keys) == 1  # one key across the retries
    assert [p.status for p in posts] == [201, 201]
    assert [p.replayed for p in posts] == [False, True]
    assert [w.name for w in qm.workloads.list(namespace="team-a")] == ["once"]


def test_429_503_and_key_in_flight_are_retried_and_the_last_error_is_raised(
    qm: Client, api_url: str
) -> None:
    setup_quota(qm)
    with flaky_proxy(api_url) as proxy:
        proxy.faults += [Fault("POST", "503"), Fault("POST", "429"), Fault("POST", "409")]
        with Client(proxy.url, ADMIN_TOKEN, retry=FAST_RETRIES) as client:
            assert client.submit(workload("busy"), namespace="team-a").name == "busy"
            posts = proxy.requests("POST")
            assert [p.status for p in posts] == [503, 429, 409, 201]
            assert len({p.headers["idempotency-key"] for p in posts}) == 1
            proxy.faults += [Fault("GET", "503") for _ in range(FAST_RETRIES.attempts)]
            with pytest.raises(ServiceUnavailable) as unavailable:
                client.workloads.get("busy", namespace="team-a")
    assert unavailable.value.status == 503 and unavailable.value.detail == "proxy"
    assert len(list(qm.workloads.list(namespace="team-a"))) == 1


def test_the_same_key_twice_replays_the_first_answer(qm: Client) -> None:
    setup_quota(qm)
    headers = {"Idempotency-Key": "ci-run-42"}
    first = qm.request("POST", "/v1/namespaces/team-a/workloads", json=job("j"), headers=headers)
    second = qm.request("POST", "/v1/namespaces/team-a/workloads", json=job("j"), headers=headers)
    assert first.status_code == second.status_code == 201
    assert second.headers["idempotent-replayed"] == "true"
    assert first.json()["metadata"]["uid"] == second.json()["metadata"]["uid"]
    assert len(list(qm.workloads.list(namespace="team-a"))) == 1


def _submit_as_streams_open(client: Client, names: list[str], proxy: Proxy) -> threading.Thread:
    """Submit ``names`` two at a time, each pair once the watcher has opened
    one stream more: three streams at least, however slow the machine."""

    def streams() -> int:
        return len(proxy.requests("GET", "/v1/events"))

    def run() -> None:
        for i in range(0, len(names), 2):
            deadline = time.monotonic() + 60
            while streams() < i // 2 + 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            for name in names[i : i + 2]:
                client.submit(workload(name), namespace="team-a")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_watch_resumes_when_the_server_ends_the_stream(qm: Client, api_url: str) -> None:
    setup_quota(qm)
    start = qm.head()
    names = [f"w{i}" for i in range(6)]
    with flaky_proxy(api_url) as proxy, Client(proxy.url, ADMIN_TOKEN) as watcher:
        writer = _submit_as_streams_open(qm, names, proxy)
        seen = []
        # The server ends each stream after 0.3 s; the client reconnects.
        for event in watcher.watch(start, namespace="team-a", server_timeout=0.3, timeout=20):
            seen.append(event)
            if len(seen) == len(names):
                break
        writer.join()
        streams = proxy.requests("GET", "/v1/events")
    assert [e.data["name"] for e in seen] == names
    logged = list(qm.events(start, namespace="team-a"))
    assert [e.position for e in seen] == [e.position for e in logged]
    assert len(streams) >= 3
    assert all(s.headers.get("last-event-id") for s in streams[1:])


def test_watch_resumes_after_a_dropped_connection(qm: Client, api_url: str) -> None:
    setup_quota(qm)
    start = qm.head()
    qm.bulk_submit([workload(f"w{i}") for i in range(5)], namespace="team-a")
    logged = list(qm.events(start, namespace="team-a"))
    assert len(logged) == 5
    with flaky_proxy(api_url) as proxy:
        proxy.faults.append(Fault("GET", "cut:2", "/v1/events"))
        with Client(proxy.url, ADMIN_TOKEN, retry=FAST_RETRIES) as watcher:
            seen = []
            # server_timeout: the stream the proxy relays after we stop
            # reading ends on its own soon after the test.
            for event in watcher.watch(start, namespace="team-a", server_timeout=2, timeout=20):
                seen.append(event)
                if len(seen) == 5:
                    break
        streams = proxy.requests("GET", "/v1/events")
    assert [e.position for e in seen] == [e.position for e in logged]  # none missed or repeated
    assert len(streams) == 2
    assert streams[1].headers["last-event-id"] == str(logged[1].position)


def test_async_client_crud_paging_and_watch(qm: Client, api_url: str) -> None:
    setup_quota(qm)

    async def scenario() -> tuple[list[str], list[str], str, int]:
        async with AsyncClient(api_url, ADMIN_TOKEN, namespace="team-a") as aqm:
            start = await aqm.head()
            for i in range(5):
                await aqm.submit(workload(f"a{i}"))
            names = [w.name async for w in aqm.workloads.list(page_size=2)]
            watched = []
            async for event in aqm.watch(start, server_timeout=0.3, timeout=60):
                watched.append(event.data["name"])
                if len(watched) == 5:
                    break
            explained = await aqm.explain("a4")
            await aqm.cancel("a0")
            ended = await aqm.wait("a0", timeout=60)
            return names, watched, ended.status.state, explained.position_in_queue or 0

    names, watched, state, position = asyncio.run(scenario())
    assert names == [f"a{i}" for i in range(5)]
    assert watched == names
    assert state == "Cancelled"
    assert position == 5


def test_explain_wait_and_cancel(qm: Client) -> None:
    setup_quota(qm)
    qm.submit(workload("first"), namespace="team-a")
    qm.submit(job("second", parallelism=4), namespace="team-a")
    explained = qm.explain("second", namespace="team-a")
    assert (explained.position_in_queue, explained.pending_in_cluster_queue) == (2, 2)
    assert explained.requests["nvidia.com/gpu"] == 8
    with pytest.raises(WatchTimeout):
        qm.wait("second", namespace="team-a", timeout=0.5, poll=0.2)
    cancelled = qm.cancel("second", namespace="team-a")
    assert cancelled.status.state == "Cancelled"
    assert cancelled.status.condition("Cancelled") is not None
    done = qm.wait("second", namespace="team-a", timeout=60)
    assert done.status.state == "Cancelled"


def test_client_from_a_context_file(tmp_path: Path, qm: Client, api_url: str) -> None:
    path = tmp_path / "config"
    config = ConfigFile.load(path)
    config.set_context("local", server=api_url, token=ADMIN_TOKEN, namespace="team-a")
    config.set_context("other", server="http://127.0.0.1:9", token="x")
    config.save()
    assert path.stat().st_mode & 0o777 == 0o600
    reloaded = ConfigFile.load(path)
    assert reloaded.current_context == "local"
    assert sorted(reloaded.contexts) == ["local", "other"]
    with Client.from_context(config_path=path) as client:
        assert client.namespace == "team-a"
        assert client.whoami().name == "bootstrap"


def test_a_conflict_is_final_and_not_retried(qm: Client, api_url: str) -> None:
    setup_quota(qm)
    qm.submit(workload("taken"), namespace="team-a")
    with flaky_proxy(api_url) as proxy, Client(proxy.url, ADMIN_TOKEN) as client:
        with pytest.raises(AlreadyExists) as exists:
            client.submit(workload("taken"), namespace="team-a")
        assert len(proxy.requests("POST")) == 1
    assert exists.value.status == 409 and exists.value.problem_type == "already-exists"


def test_the_servers_own_rate_limit_is_waited_out(database_url: str, engine: sa.Engine) -> None:
    with (
        serve(database_url, rate_limit_per_second=4, rate_limit_burst=2) as (url, _),
        flaky_proxy(url) as proxy,
        Client(proxy.url, ADMIN_TOKEN) as client,
    ):
        names = [client.whoami().name for _ in range(4)]
        statuses = [s.status for s in proxy.requests("GET", "/v1/whoami")]
    assert names == ["bootstrap"] * 4
    assert statuses.count(200) == 4 and 429 in statuses  # waited Retry-After, then went on
