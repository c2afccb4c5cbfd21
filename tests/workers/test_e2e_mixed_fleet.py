"""End to end through the real processes (tests/workers/stack): a fleet of two
Kueue members and one Volcano member under one cohort, the same invariants as
the Kueue-only fleet (tests/workers/test_e2e_fleet.py).

* Gangs of three teams that borrow from one another run on every member and
  finish; quotas, lending and node capacity hold across the three at every
  sample; no gang straddles an island, whatever its member's backend.
* A lender reclaims on the Volcano member: a borrower's whole gang (job and
  PodGroup) is removed there and the preemptor's pods are created only once
  the victim's are gone.
* A Volcano member that goes silent is lost; its gangs run elsewhere.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.waiting import CEILING, LONG_CEILING
from tests.waiting import wait_for as wait_until
from tests.workers.invariants import Queues, QuotaWatch, ledger_matches_events
from tests.workers.stack import (
    FAST,
    MemberWatch,
    Stack,
    base_manifests,
    gang,
    local_queue,
    team_queue,
    write_fleet,
)
from tests.workers.stack.fleets import BACKEND_LABEL
from tests.workers.test_e2e_fleet import _admissions, _ended_at, _ledger, _states, _status
from tests.workers.test_fencing_partition import FENCING, _admin_endpoints

RECLAIM = {"reclaimWithinCohort": "Any"}
MIXED = {"m1": "kueue", "m2": "kueue", "v1": "volcano"}


def _submit(api: httpx.Client, namespace: str, body: dict[str, Any]) -> None:
    response = api.post(f"/v1/namespaces/{namespace}/workloads", json=body)
    assert response.status_code == 201, response.text


def _on(body: dict[str, Any], backend: str) -> dict[str, Any]:
    """``body`` to run only on members of ``backend``."""
    body["spec"]["clusterSelector"] = {"matchLabels": {BACKEND_LABEL: backend}}
    return body


def _backends(api: httpx.Client) -> dict[str, str]:
    items = api.get("/v1/clusters").json()["items"]
    return {c["metadata"]["name"]: (c.get("status") or {}).get("backend") for c in items}


def _clusters_of(engine: sa.Engine) -> dict[str, list[str]]:
    """Each workload's clusters, admission after admission."""
    out: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for data in conn.exec_driver_sql(
            "SELECT data FROM events WHERE type = 'WorkloadAdmitted' ORDER BY position"
        ).scalars():
            key = f"{data['namespace']}/{data['name']}"
            out.setdefault(key, []).append(data["status"]["admission"]["cluster"])
    return out


@pytest.fixture
def stack(engine: sa.Engine, database_url: str, broker: str, tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, database_url, broker, FAST) as running:
        yield running


def test_a_mixed_fleet_keeps_one_global_quota_and_whole_gangs_on_every_backend(
    stack: Stack, engine: sa.Engine, tmp_path: Path
) -> None:
    # 3 clusters x 2 islands x 4 nodes x 8 GPUs: 192 GPUs in islands of 32.
    fleet = write_fleet(tmp_path / "fleet.yaml", {n: (2, 4) for n in MIXED}, MIXED)
    teams = {
        "team-a": team_queue("team-a", 64, borrowing_limit=32, lending_limit=32),
        "team-b": team_queue("team-b", 64, lending_limit=32),
        "team-c": team_queue("team-c", 32, borrowing_limit=64),
    }
    manifests = [*base_manifests(), *teams.values()]
    manifests += [local_queue(ns, ns) for ns in teams]
    stack.start(fleet, 3, manifests, time_scale=0.01)
    with stack.client() as api:
        assert _backends(api) == MIXED  # found by discovery: no registration names one

    rng = random.Random(23)
    count = 36
    gangs = [
        (
            f"team-{'abc'[i % 3]}",
            f"g{i:02d}",
            rng.choice((4, 8, 8, 16, 16, 32)),
            rng.uniform(40, 120),
        )
        for i in range(count)
    ]
    quota = QuotaWatch(engine, Queues.of(manifests))
    for ns, name, gpus, _ in gangs:
        if gpus > 8:
            quota.require_island(f"{ns}/{name}")
    with MemberWatch(stack.members, stack.kubeconfig) as members, quota:
        with stack.client() as api:
            for ns, name, gpus, seconds in gangs:
                _submit(api, ns, gang(name, gpus, seconds))
        try:
            wait_until(
                lambda: _states(engine)["Finished"] == count,
                LONG_CEILING,
                f"{count} gangs finished",
                seen=lambda: _states(engine),
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from None
        wait_until(lambda: not members.listed()["jobs"], CEILING, "jobs collected")

    assert quota.samples > 20, quota.samples
    assert quota.violations == [], quota.violations[:10]
    assert any(quota.peak.get(cq, 0) > nominal for cq, nominal in (("team-c", 32),)), quota.peak
    assert members.unseen() == []
    assert members.overcommits == []
    assert members.straddlers() == []
    finished = _ledger(engine, "workload.finished")
    ran_on = Counter(f["cluster"] for f in finished)
    assert set(ran_on) == set(MIXED), ran_on  # every backend ran gangs
    for ns, name, gpus, _ in gangs:
        status = _status(engine, ns, name)
        assert status["state"] == "Finished" and status["outcome"] == "succeeded", status
        last = _admissions(engine)[f"{ns}/{name}"][-1]
        pods = [p for p in members.pods_of(f"{ns}.{name}") if p.admission == last]
        assert len(pods) == max(1, gpus // 8), (name, pods)
        assert len({p.cluster for p in pods}) == 1
    created = Counter(job.admission for job in members.job_history)
    assert created and max(created.values()) == 1, created.most_common(3)
    problems, kinds = ledger_matches_events(engine)
    assert problems == [], problems[:10]
    assert kinds["workload.finished"] == count


def test_a_reclaim_on_the_volcano_member_removes_the_whole_gang_first(
    stack: Stack, engine: sa.Engine, tmp_path: Path
) -> None:
    """``borrower`` runs two 32-GPU gangs on ``v1``, 32 GPUs of them
    borrowed from ``lender``; the lender's 32-GPU gang for ``v1`` takes them
    back by preempting one whole borrower gang there."""
    fleet = write_fleet(tmp_path / "fleet.yaml", {n: (2, 4) for n in MIXED}, MIXED)
    manifests = [
        *base_manifests(),
        team_queue("lender", 32, preemption=RECLAIM),
        team_queue("borrower", 32),
        local_queue("lender", "lender"),
        local_queue("borrower", "borrower"),
    ]
    stack.start(fleet, 3, manifests, time_scale=0.01)
    quota = QuotaWatch(engine, Queues.of(manifests))
    borrowers = ["b0", "b1"]
    with MemberWatch(stack.members, stack.kubeconfig) as members, quota, stack.client() as api:
        for name in borrowers:
            quota.require_island(f"borrower/{name}")
            _submit(api, "borrower", _on(gang(name, 32, 600), "volcano"))
        wait_until(
            lambda: all(_status(engine, "borrower", b)["state"] == "Running" for b in borrowers),
            CEILING,
            "the borrower's gangs running",
        )
        quota.require_island("lender/l0")
        _submit(api, "lender", _on(gang("l0", 32, 200), "volcano"))
        wait_until(lambda: _ledger(engine, "workload.preempted"), CEILING, "a preemption")
        wait_until(
            lambda: all(
                _status(engine, ns, n)["state"] == "Finished"
                for ns, n in (("lender", "l0"), ("borrower", "b0"), ("borrower", "b1"))
            ),
            LONG_CEILING,
            "every gang finished, the victim too",
        )

    assert quota.violations == [], quota.violations[:10]
    assert members.overcommits == [] and members.straddlers() == []
    [preempted] = _ledger(engine, "workload.preempted")
    assert preempted["reason"] == "InCohortReclamation"
    assert preempted["preemptor"] == "lender/l0"
    admissions = _admissions(engine)
    victim = admissions[f"borrower/{preempted['workload']}"][0]
    pods = [p for p in members.pods.values() if p.admission == victim]
    assert len(pods) == 4 and all(p.cluster == "v1" and p.deleted is not None for p in pods)
    theirs = [p for p in members.pods.values() if p.admission == admissions["lender/l0"][0]]
    assert len(theirs) == 4 and {p.cluster for p in theirs} == {"v1"}
    # The preemptor's pods were created only once every victim pod had ended.
    assert min(p.created for p in theirs) >= max(_ended_at(p) for p in pods)
    assert {c[0] for c in _clusters_of(engine).values()} == {"v1"}
    problems, kinds = ledger_matches_events(engine)
    assert problems == []
    assert kinds["workload.finished"] == 3 and kinds["workload.admitted"] == 4


@pytest.fixture
def fencing_stack(
    engine: sa.Engine, database_url: str, broker: str, tmp_path: Path
) -> Iterator[Stack]:
    with Stack(tmp_path, database_url, broker, FENCING) as running:
        yield running


def _cordon(api: httpx.Client, name: str, cordoned: bool) -> None:
    response = api.patch(
        f"/v1/clusters/{name}",
        json={"spec": {"cordoned": cordoned}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text


def test_a_lost_volcano_members_gangs_run_elsewhere(
    fencing_stack: Stack, engine: sa.Engine, tmp_path: Path
) -> None:
    stack = fencing_stack
    fleet = write_fleet(tmp_path / "fleet.yaml", {n: (2, 4) for n in MIXED}, MIXED)
    manifests = [*base_manifests(), team_queue("team-a", 64), local_queue("team-a", "team-a")]
    stack.start(fleet, 3, manifests, time_scale=0.01)
    names = ["g0", "g1"]
    with stack.client() as api:
        for kueue in ("m1", "m2"):  # so that the gangs go to v1 first
            _cordon(api, kueue, True)
        # 10 s of run at the stack's time scale: they are still running on v1
        # when it is cut off (right after they are seen running), and their
        # second run, elsewhere, is what the test waits for.
        for name in names:
            _submit(api, "team-a", gang(name, 32, 1000))
        wait_until(
            lambda: all(_status(engine, "team-a", n)["state"] == "Running" for n in names),
            CEILING,
            "both gangs running on v1",
        )
        assert {_status(engine, "team-a", n)["admission"]["cluster"] for n in names} == {"v1"}
        for kueue in ("m1", "m2"):
            _cordon(api, kueue, False)
        url, token = _admin_endpoints(stack)["v1"]
        cut = httpx.post(
            f"{url}/_admin/partition",
            json={"mode": "refuse"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert cut.status_code == 200, cut.text
        wait_until(
            lambda: _ledger(engine, "cluster.lost"), LONG_CEILING, "v1 lost", seen=stack.logs
        )
        wait_until(
            lambda: all(_status(engine, "team-a", n)["state"] == "Finished" for n in names),
            LONG_CEILING,
            "both gangs finished elsewhere",
        )
    clusters = _clusters_of(engine)
    for name in names:
        assert clusters[f"team-a/{name}"][0] == "v1"
        assert clusters[f"team-a/{name}"][-1] in ("m1", "m2"), clusters
        assert _status(engine, "team-a", name)["outcome"] == "succeeded"
    [lost] = _ledger(engine, "cluster.lost")
    assert lost["cluster"] == "v1" and sorted(lost["requeued"]) == ["team-a/g0", "team-a/g1"]
