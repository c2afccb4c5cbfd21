"""End to end through the real processes: the API, Postgres, Redis, a Celery
worker, the scheduler and three stand-in member clusters (tests/workers/stack.py).

* Gangs of 1 to 64 GPUs from four teams whose ClusterQueues borrow from one
  another in a cohort (60 in the suite, 200 with ``-m slow``; either
  overfills the fleet at once): every one admitted, run and finished; quotas, the
  cohort's lending and the nodes' capacity never exceeded at any sample of
  the read models; no gang's pods straddle an island on the member where they
  ran; every admission, preemption and completion in the ledger.
* Reclaim: a lender's gangs take back the GPUs another team borrowed,
  preempting whole gangs only; the victims are requeued and finish later.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
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
    PodRecord,
    Stack,
    base_manifests,
    gang,
    local_queue,
    team_queue,
    write_fleet,
)

RECLAIM = {"reclaimWithinCohort": "Any"}


def _states(engine: sa.Engine) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT coalesce(status->>'state', 'Pending') FROM resources WHERE kind = 'Workload'"
        ).scalars()
        return Counter(rows)


def _status(engine: sa.Engine, namespace: str, name: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(
            conn.exec_driver_sql(
                "SELECT status FROM resources WHERE kind = 'Workload' "
                "AND namespace = %(ns)s AND name = %(name)s",
                {"ns": namespace, "name": name},
            ).scalar_one()
        )


def _ledger(engine: sa.Engine, kind: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(b)
            for b in conn.exec_driver_sql(
                "SELECT body FROM ledger_entries WHERE kind = %(kind)s ORDER BY seq",
                {"kind": kind},
            ).scalars()
        ]


def _left(members: MemberWatch) -> list[str]:
    """What is still on the members, by a fresh list."""
    listed = members.listed()
    return [f"{kind} {key}" for kind in ("jobs", "pods") for key in sorted(listed[kind])]


def _submit(api: httpx.Client, namespace: str, body: dict[str, Any]) -> None:
    response = api.post(f"/v1/namespaces/{namespace}/workloads", json=body)
    assert response.status_code == 201, response.text


@pytest.fixture
def stack(engine: sa.Engine, database_url: str, broker: str, tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, database_url, broker, FAST) as running:
        yield running


@pytest.mark.parametrize(
    "count", [pytest.param(60, id="60"), pytest.param(200, id="200", marks=pytest.mark.slow)]
)
def test_gangs_from_four_teams_all_run_and_finish_within_quota_and_islands(
    stack: Stack, engine: sa.Engine, tmp_path: Path, count: int
) -> None:
    # 3 clusters x 2 islands x 8 nodes x 8 GPUs: 384 GPUs in islands of 64.
    fleet = write_fleet(tmp_path / "fleet.yaml", {f"m{i}": (2, 8) for i in (1, 2, 3)})
    teams = {
        "team-a": team_queue(
            "team-a", 128, borrowing_limit=64, lending_limit=64, preemption=RECLAIM
        ),
        "team-b": team_queue("team-b", 128, preemption=RECLAIM),
        "team-c": team_queue("team-c", 64, borrowing_limit=128),
        "team-d": team_queue("team-d", 64, lending_limit=32),
    }
    manifests = [*base_manifests(), *teams.values()]
    manifests += [local_queue(ns, ns) for ns in teams]
    stack.start(fleet, 3, manifests, time_scale=0.01, concurrency=2)

    rng = random.Random(200)
    sizes = (1, 2, 4, 8, 8, 16, 16, 24, 32, 48, 64)
    gangs = [
        (f"team-{'abcd'[i % 4]}", f"g{i:03d}", rng.choice(sizes), rng.uniform(30, 120))
        for i in range(count)
    ]
    quota = QuotaWatch(engine, Queues.of(manifests))
    for ns, name, gpus, _ in gangs:
        if gpus > 8:
            quota.require_island(f"{ns}/{name}")
    began = time.monotonic()
    with MemberWatch(stack.members, stack.kubeconfig) as members, quota:
        with stack.client() as api, ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda g: _submit(api, g[0], gang(g[1], g[2], g[3])),
                    gangs,
                )
            )
        try:
            wait_until(
                lambda: _states(engine)["Finished"] == count,
                LONG_CEILING * count / 60,
                f"{count} gangs finished",
                seen=lambda: _states(engine),
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from None
        took = time.monotonic() - began
        try:  # finished jobs removed from the members, and their pods
            wait_until(lambda: not _left(members), CEILING, "collected")
        except AssertionError:
            raise AssertionError(
                f"{_left(members)[:5]}\nunseen: {members.unseen()[:10]}\n{stack.logs()}"
            ) from None

    assert quota.samples > 50, quota.samples
    assert quota.violations == [], quota.violations[:10]
    # Borrowing happened: some team used more than its nominal quota.
    assert any(quota.peak.get(cq, 0) > nominal for cq, nominal in (("team-c", 96), ("team-d", 96)))
    assert members.unseen() == []  # the watches saw every change: what follows is whole
    assert members.overcommits == []
    assert members.straddlers() == []
    admissions = _admissions(engine)
    for ns, name, gpus, _ in gangs:
        # The last admission's pods ran to completion (an earlier one was
        # preempted; its pods may have finished as the preemption came).
        last = admissions[f"{ns}/{name}"][-1]
        pods = [p for p in members.pods_of(f"{ns}.{name}") if p.admission == last]
        said = f"{name}: " + "; ".join(f"{p.cluster}/{p.name} {p.history}" for p in pods)
        assert len(pods) == max(1, gpus // 8), said
        assert all(p.node and "Succeeded" in p.phases for p in pods), said
        status = _status(engine, ns, name)
        assert status["state"] == "Finished" and status["outcome"] == "succeeded", status

    # Each admission created its job once, on one member.
    created = Counter(job.admission for job in members.job_history)
    assert created and max(created.values()) == 1, created.most_common(3)

    problems, kinds = ledger_matches_events(engine)
    assert problems == [], problems[:10]
    assert kinds["workload.finished"] == count
    assert kinds["workload.admitted"] == count + kinds["workload.preempted"]
    finished = _ledger(engine, "workload.finished")
    assert sorted(f["workload"] for f in finished) == sorted(g[1] for g in gangs)
    gpus_of = {name: gpus for _, name, gpus, _ in gangs}
    for f in finished:  # GPU-seconds as measured by the member
        seconds = datetime.fromisoformat(f["finished_at"]) - datetime.fromisoformat(f["started_at"])
        assert f["gpu_seconds"] == gpus_of[f["workload"]] * seconds.total_seconds(), f
    print(f"{count} gangs in {took:.1f} s, {quota.samples} samples, peaks {quota.peak}, {kinds}")


def test_a_lender_reclaims_borrowed_gpus_by_preempting_whole_gangs(
    stack: Stack, engine: sa.Engine, tmp_path: Path
) -> None:
    """``borrower`` fills the fleet, 128 of its 192 GPUs borrowed from
    ``lender``; the lender's two 32-GPU gangs take back an island each."""
    # 3 clusters x 2 islands x 4 nodes x 8 GPUs: 192 GPUs in islands of 32.
    fleet = write_fleet(tmp_path / "fleet.yaml", {f"m{i}": (2, 4) for i in (1, 2, 3)})
    manifests = [
        *base_manifests(),
        team_queue("lender", 128, preemption=RECLAIM),
        team_queue("borrower", 64),
        local_queue("lender", "lender"),
        local_queue("borrower", "borrower"),
    ]
    stack.start(fleet, 3, manifests, time_scale=0.01)
    quota = QuotaWatch(engine, Queues.of(manifests))
    borrowers = [f"b{i}" for i in range(6)]
    with MemberWatch(stack.members, stack.kubeconfig) as members, quota, stack.client() as api:
        for name in borrowers:
            quota.require_island(f"borrower/{name}")
            _submit(api, "borrower", gang(name, 32, 800))
        wait_until(
            lambda: all(_status(engine, "borrower", b)["state"] == "Running" for b in borrowers),
            CEILING,
            "the borrower's gangs running",
        )
        for name in ("l0", "l1"):
            quota.require_island(f"lender/{name}")
            _submit(api, "lender", gang(name, 32, 200))
        wait_until(lambda: len(_ledger(engine, "workload.preempted")) >= 2, CEILING, "preemptions")
        wait_until(
            lambda: all(_status(engine, "lender", n)["state"] == "Finished" for n in ("l0", "l1")),
            CEILING,
            "the lender's gangs finished",
        )
        wait_until(
            lambda: all(_status(engine, "borrower", b)["state"] == "Finished" for b in borrowers),
            LONG_CEILING,
            "every borrower gang finished, the victims too",
        )

    assert quota.violations == [], quota.violations[:10]
    assert members.overcommits == [] and members.straddlers() == []
    preempted = _ledger(engine, "workload.preempted")
    assert len(preempted) == 2, preempted
    victims = {p["workload"] for p in preempted}
    for entry in preempted:
        assert entry["reason"] == "InCohortReclamation"
        assert entry["preemptor"] in ("lender/l0", "lender/l1")
        assert entry["preemptor_cluster_queue"] == "lender"
        assert entry["released"]["h100"]["nvidia.com/gpu"] == 32
    # Whole gangs: every pod of a victim's first admission was removed, and
    # its preemptor's pods were created only after the last of them was gone.
    admissions = _admissions(engine)
    for entry in preempted:
        first = admissions[f"borrower/{entry['workload']}"][0]
        pods = [p for p in members.pods.values() if p.admission == first]
        assert len(pods) == 4 and all(p.deleted is not None for p in pods), pods
        # None succeeded; Failed only once it was being deleted (the kubelet
        # ends a deleted pod Failed, and our finalizer keeps it readable).
        assert "Succeeded" not in set().union(*(p.phases for p in pods)), pods
        assert all(
            terminating
            for p in pods
            for *_, phase, _, _, terminating in p.history
            if phase == "Failed"
        ), [p.history for p in pods]
        preemptor = admissions[entry["preemptor"]][0]
        theirs = [p for p in members.pods.values() if p.admission == preemptor]
        assert len(theirs) == 4
        same_place = {(p.cluster, p.node) for p in theirs} & {(p.cluster, p.node) for p in pods}
        if same_place:  # theirs began only once every victim pod had ended
            assert min(p.created for p in theirs) >= max(_ended_at(p) for p in pods)
    # The victims ran again, whole, and finished; the others once.
    for name in borrowers:
        runs = admissions[f"borrower/{name}"]
        assert len(runs) == (2 if name in victims else 1), (name, runs)
        assert len([p for p in members.pods.values() if p.admission == runs[-1]]) == 4
    problems, kinds = ledger_matches_events(engine)
    assert problems == []
    assert kinds["workload.finished"] == 8 and kinds["workload.admitted"] == 10


def _admissions(engine: sa.Engine) -> dict[str, list[str]]:
    """Each workload's admission ids, in order (the label its member job
    and pods carry: workers/plan.py's admission_id)."""
    from workers.plan import WorkloadView, admission_id

    out: dict[str, list[str]] = {}
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT data FROM events WHERE type = 'WorkloadAdmitted' ORDER BY position"
        ).scalars()
        for data in rows:
            view = WorkloadView(
                data["namespace"], data["name"], data["uid"], data["spec"], data["status"]
            )
            out.setdefault(view.key, []).append(admission_id(view))
    return out


def _ended_at(pod: PodRecord) -> float:
    """When a pod stopped running: the first event that saw it in a terminal
    phase (a deleted pod of ours ends Failed, and stays until its run is
    read), else its deletion."""
    ended = [at for at, _, phase, *_ in pod.history if phase in ("Failed", "Succeeded")]
    return min(ended) if ended else float(pod.deleted or 0)
