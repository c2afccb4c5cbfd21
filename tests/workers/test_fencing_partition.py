"""Invariant 3 through a partition, with real processes: the API, Postgres,
Redis, a Celery worker, the scheduler's fleet loop and two stand-in members
over HTTPS, the centre reaching ``m1`` through a TCP relay that the test
cuts while ``m1``'s fence agent (``quartermaster fence-agent``, a process of
its own) still reaches it. The stand-ins' kubelets record every pod's
running intervals; no gang may have pods running in both members at any
instant, and every gang must run again on ``m2`` within the recovery time
of docs/fencing.md (waited for with a generous ceiling, never asserted).

Without the agent and the centre's wait (issue 18, finding 5) the gangs
started on ``m2`` while their pods ran on in ``m1``: this test failed so.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import sqlalchemy as sa

from service.runtime.demo import register_clusters
from tests.waiting import wait_for as wait_until
from tests.workers.stack import (
    FAST,
    Stack,
    base_manifests,
    gang,
    local_queue,
    team_queue,
    write_fleet,
)
from tests.workers.tcp_cut import tcp_cut

pytestmark = pytest.mark.timeout(300)

WORKLOAD_LABEL = "quartermaster.dev/workload"
#: Short, and consistent as workers/settings.py demands: the write window is
#: 2 x 1 s heartbeats + 1 s + 3 s timeouts = 6 s; the margin covers a 0.5 s
#: poll, 1.5 s to stop and 1 % drift of 4 s; lease >= 4 + 3 + 6.
FENCING = {
    **FAST,
    "QM_RESYNC_INTERVAL": "0.5",
    "QM_HEARTBEAT_INTERVAL": "1",
    "QM_MEMBER_CONNECT_TIMEOUT": "1",
    "QM_MEMBER_READ_TIMEOUT": "3",
    "QM_FENCE_TIME": "4",
    "QM_FENCE_POLL_INTERVAL": "0.5",
    "QM_FENCE_STOP_TIME": "1.5",
    "QM_FENCE_MARGIN": "3",
    "QM_CLUSTER_LEASE": "14",
}
#: lease + resync, then admission and dispatch (docs/fencing.md); the
#: ceiling we wait is several times that.
RECOVERY = 14 + 0.5
GANGS = {"g0": 8, "g1": 4, "g2": 4}


@pytest.fixture
def stack(engine: sa.Engine, database_url: str, broker: str, tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, database_url, broker, FENCING) as running:
        yield running


def _admin_endpoints(stack: Stack) -> dict[str, tuple[str, str]]:
    """Each stand-in's admin URL and token, as ``sim cluster`` printed them."""
    clusters = next(c for c in stack.supervisor.children if c.name == "clusters")
    out = {}
    for line in clusters.output().splitlines():
        if line.startswith("{") and '"adminToken"' in line:
            entry = json.loads(line)
            out[entry["cluster"]] = (entry["admin"], entry["adminToken"])
    return out


def _intervals(endpoint: tuple[str, str]) -> list[dict[str, Any]]:
    url, token = endpoint
    answer = httpx.get(
        f"{url}/_admin/intervals", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    answer.raise_for_status()
    records: list[dict[str, Any]] = answer.json()
    return records


def _by_gang(records: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        gang = (r.get("labels") or {}).get(WORKLOAD_LABEL)
        if gang:
            out.setdefault(gang, []).append((r["start"], r["end"] or float("inf")))
    return out


def _overlaps(intervals: dict[str, dict[str, list[tuple[float, float]]]]) -> list[str]:
    """Gangs with a pod running in one member while one ran in another."""
    found = []
    members = sorted(intervals)
    for i, a in enumerate(members):
        for b in members[i + 1 :]:
            for name, spans in intervals[a].items():
                for s1, e1 in spans:
                    for s2, e2 in intervals[b].get(name, ()):
                        if max(s1, s2) < min(e1, e2):
                            found.append(f"{name}: {a} [{s1}, {e1}) and {b} [{s2}, {e2})")
    return found


def _cluster(stack: Stack, name: str) -> dict[str, Any]:
    with stack.client() as api:
        body: dict[str, Any] = api.get(f"/v1/clusters/{name}").json()
    return body


def _states(stack: Stack) -> dict[str, tuple[str, str]]:
    with stack.client() as api:
        items = api.get("/v1/namespaces/team-a/workloads").json()["items"]
    return {
        w["metadata"]["name"]: (
            w["status"].get("state", ""),
            (w["status"].get("admission") or {}).get("cluster", ""),
        )
        for w in items
    }


def test_a_partitioned_member_fences_its_gangs_before_they_run_elsewhere(
    stack: Stack, tmp_path: Path
) -> None:
    fleet = write_fleet(tmp_path / "fleet.yaml", {"m1": (1, 2), "m2": (1, 2)})
    stack.start_clusters(fleet, 2, time_scale=0.01)
    admin = _admin_endpoints(stack)
    m1, m2 = stack.members
    upstream = urlsplit(m1.server)
    with tcp_cut((str(upstream.hostname), int(upstream.port or 443))) as relay:
        relayed = dataclasses.replace(m1, server=f"https://{relay.address}")
        stack.start_services()
        agent = stack.supervisor.start(
            "fence-m1",
            [
                *(sys.executable, "-m", "workers.cli", "fence-agent"),
                *("--kubeconfig", str(stack.kubeconfig), "--context", "m1"),
                *("--poll-interval", FENCING["QM_FENCE_POLL_INTERVAL"]),
            ],
        )
        with stack.client() as api:
            for obj in [
                *base_manifests(),
                team_queue("team-a", 16),
                local_queue("team-a", "team-a"),
            ]:
                stack.create(api, obj)
            # m1 alone first, so that every gang starts there.
            assert not register_clusters(api, [relayed]).failed
            wait_until(lambda: _cluster(stack, "m1")["status"].get("state") == "Ready", 30, "m1")
            for name, gpus in GANGS.items():
                response = api.post(
                    "/v1/namespaces/team-a/workloads", json=gang(name, gpus, 100_000)
                )
                assert response.status_code == 201, response.text
            wait_until(
                lambda: _states(stack) == {n: ("Running", "m1") for n in GANGS},
                60,
                "every gang running on m1",
            )
            assert not register_clusters(api, [m2]).failed
        wait_until(stack.clusters_ready, 30, "m2 Ready")
        # What an operator sees: m1 guarded by a reporting agent, m2 not.
        wait_until(
            lambda: _cluster(stack, "m1")["status"].get("fence", {}).get("guaranteed"),
            30,
            f"m1's fence agent reporting\n{agent.tail(20)}",
        )
        assert _cluster(stack, "m2")["status"]["fence"]["reason"] == "NoFenceAgent"

        relay.cut()
        wait_until(
            lambda: _states(stack) == {n: ("Running", "m2") for n in GANGS},
            RECOVERY * 6,
            f"every gang running again, on m2\n{stack.logs(15)}",
        )
        intervals = {name: _by_gang(_intervals(admin[name])) for name in ("m1", "m2")}
        assert set(intervals["m1"]) == set(intervals["m2"]) == {f"team-a.{n}" for n in GANGS}
        assert not _overlaps(intervals), _overlaps(intervals)
        # The agent ended them, while m1 was still cut off from the centre.
        assert all(end < float("inf") for spans in intervals["m1"].values() for _, end in spans)
        assert agent.alive, agent.tail(20)

        relay.listen()  # healed: m1 returns, and nothing of the old runs there again
        wait_until(lambda: _cluster(stack, "m1")["status"].get("state") == "Ready", 60, "m1")
        wait_until(
            lambda: (
                _cluster(stack, "m1")["status"]["fence"].get("agent", {}).get("fenced") is False
            ),
            30,
            "m1's agent no longer fencing",
        )
        assert _states(stack) == {n: ("Running", "m2") for n in GANGS}
        intervals = {name: _by_gang(_intervals(admin[name])) for name in ("m1", "m2")}
        assert not _overlaps(intervals), _overlaps(intervals)
