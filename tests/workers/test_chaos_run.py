"""The repeatable fault run (tests/workers/chaos/; bench/chaos.py and the
slow tests here, ``-m slow``): the whole stack under load through a worker,
the admission leader and an API process SIGKILLed, Redis and Postgres
restarted, a member killed and one partitioned with its fence agent
running — checked from the ledger and from the running intervals the members' kubelets recorded; the
load also cancels gangs and, with high priorities and teams borrowing from
each other, makes the scheduler preempt and reclaim.

The checks are first shown to fail, each on evidence that holds what it is
for (a gang acknowledged and never finished, one nobody submitted, one
admitted twice, one running in two clusters at once); the runs then show
that the real sequence gives none of it. Every process the run started is
gone when it ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from service.ledger.accounting import Holding
from service.ledger.chain import LedgerEntry
from tests.workers.chaos import (
    Evidence,
    PodRun,
    Runner,
    Size,
    check_admitted_twice,
    check_lost,
    check_members_match,
    check_two_places,
    check_unexpected,
    table,
)
from tests.workers.stack import GPU

# --- the checks fail on what they are for ------------------------------------------------


def _entries(*items: tuple[str, str, dict[str, Any]]) -> list[LedgerEntry]:
    """Ledger entries ``(kind, namespace/name, extra body)``, in order."""
    out = []
    for seq, (kind, key, extra) in enumerate(items, start=1):
        namespace, name = key.split("/")
        body = {"namespace": namespace, "workload": name, **extra}
        out.append(LedgerEntry(seq, uuid4(), kind, datetime.now(UTC), body, b"", b""))
    return out


def _evidence(
    entries: list[LedgerEntry],
    *,
    acknowledged: Iterable[str] = (),
    attempted: set[str] | None = None,
    runs: list[PodRun] | None = None,
    running: dict[str, Holding] | None = None,
) -> Evidence:
    attempted = set(acknowledged) if attempted is None else attempted
    states: dict[str, tuple[str, str | None]] = {k: ("Finished", None) for k in attempted}
    return Evidence(set(acknowledged), attempted, entries, states, runs or [], running or {}, [])


ADMIT = {
    "cluster": "m1",
    "reserved": {"h100": {GPU: 8}},
    "local_queue": "train",
    "cluster_queue": "team-a",
}
GONE = {"cluster": "m1", "released": {}}


def _run(gang: str, cluster: str, admission: str, start: float, end: float) -> PodRun:
    return PodRun(cluster, gang, admission, uuid4().hex, start, end)


def test_lost_catches_an_acknowledged_gang_missing_from_the_ledger_or_never_ended() -> None:
    entries = _entries(
        ("workload.submitted", "team-a/done", {}),
        ("workload.admitted", "team-a/done", ADMIT),
        ("workload.finished", "team-a/done", GONE),
        ("workload.submitted", "team-a/stuck", {}),
        ("workload.submitted", "team-a/runs", {}),
        ("workload.admitted", "team-a/runs", ADMIT),
    )
    acked = {"team-a/done", "team-a/stuck", "team-a/runs", "team-a/vanished"}
    result = check_lost(
        _evidence(entries, acknowledged=acked, running={"team-a/runs": Holding("m1", {GPU: 8})})
    )
    assert [p.split(":")[0] for p in result.problems] == ["team-a/vanished", "team-a/stuck"]
    assert result.counts == {
        "acknowledged": 4,
        "in_ledger": 3,
        "finished": 1,
        "cancelled": 0,
        "running": 1,
    }
    # Running elsewhere than the ledger says is not running.
    elsewhere = {"team-a/runs": Holding("m2", {GPU: 8})}
    assert len(check_lost(_evidence(entries, acknowledged=acked, running=elsewhere)).problems) == 3


def test_lost_counts_a_pending_gang_cancelled_on_request_and_catches_one_never_asked() -> None:
    entries = _entries(
        ("workload.submitted", "team-a/asked", {}),
        ("workload.submitted", "team-a/unasked", {}),
    )
    evidence = _evidence(entries, acknowledged={"team-a/asked", "team-a/unasked"})
    evidence.states = {k: ("Cancelled", None) for k in evidence.acknowledged}
    evidence.cancel_asked = evidence.cancelled = {"team-a/asked"}
    result = check_lost(evidence)
    assert result.problems == [
        "team-a/unasked: acknowledged, neither finished nor running (state Cancelled, "
        "last entry workload.submitted)",
        "team-a/unasked: cancelled, never asked",
    ]
    assert result.counts["cancelled"] == 2


def test_unexpected_catches_what_no_client_submitted() -> None:
    entries = _entries(
        ("workload.submitted", "team-a/mine", {}),
        ("workload.submitted", "team-a/mine", {}),
        ("workload.admitted", "team-a/mine", ADMIT),
        ("workload.submitted", "team-a/rogue", {}),
    )
    runs = [
        _run("team-a/mine", "m1", "a1", 0, 1),
        _run("team-a/mine", "m1", "a2", 2, 3),  # a second admission the ledger never made
        _run("team-b/ghost", "m2", "a3", 0, 1),
    ]
    result = check_unexpected(_evidence(entries, acknowledged={"team-a/mine"}, runs=runs))
    assert result.problems == [
        "team-a/rogue: in the ledger, never submitted",
        "team-a/mine: submitted 2 times",
        "team-b/ghost: ran on a member, never submitted",
        "team-a/mine: ran on m1 under 2 admissions, the ledger admitted it there 1 times",
        "team-b/ghost: ran on m2 under 1 admissions, the ledger admitted it there 0 times",
    ]
    # Submitted but never answered (in doubt) is not unexpected.
    doubt = _evidence(entries[:1], acknowledged=set(), attempted={"team-a/mine"})
    assert check_unexpected(doubt).ok
    assert check_unexpected(doubt).counts["in_doubt"] == 1


def test_admitted_twice_catches_a_second_admission_without_a_release() -> None:
    fine = _entries(
        ("workload.admitted", "team-a/g", ADMIT),
        ("workload.evicted", "team-a/g", GONE),
        ("workload.admitted", "team-a/g", ADMIT),
        ("workload.finished", "team-a/g", GONE),
    )
    assert check_admitted_twice(_evidence(fine)).ok
    assert check_admitted_twice(_evidence(fine)).counts["admitted_again_after_release"] == 1
    twice = _entries(
        ("workload.admitted", "team-a/g", ADMIT),
        ("workload.admitted", "team-a/g", ADMIT),
        ("workload.finished", "team-a/g", GONE),
        ("workload.finished", "team-a/g", GONE),
    )
    problems = check_admitted_twice(_evidence(twice)).problems
    assert problems == [
        "entry 2: team-a/g admitted again, still holding",
        "entry 4: workload.finished of team-a/g, which held nothing",
    ]


def test_two_places_catches_a_gang_running_in_two_clusters_at_one_instant() -> None:
    handed_over = [_run("team-a/g", "m1", "a1", 0, 10), _run("team-a/g", "m2", "a2", 10, 20)]
    assert check_two_places(_evidence([], runs=handed_over)).ok
    overlapping = [
        _run("team-a/g", "m1", "a1", 0, 10),
        _run("team-a/g", "m1", "a1", 1, 10),  # the same gang's other pod: fine
        _run("team-a/g", "m2", "a2", 9.5, float("inf")),
        _run("team-a/h", "m1", "b1", 0, 5),
        _run("team-a/h", "m1", "b2", 4, 6),  # two admissions in one cluster at once
    ]
    result = check_two_places(_evidence([], runs=overlapping))
    assert [p.split(",")[0] for p in result.problems] == [
        "team-a/g: in two clusters at once",
        "team-a/g: in two clusters at once",
        "team-a/h: in two admissions at once",
    ]
    assert result.counts["gangs_that_ran_in_two_clusters"] == 1


def test_members_match_catches_usage_billed_but_not_running() -> None:
    entries = _entries(("workload.admitted", "team-a/g", ADMIT))
    result = check_members_match(_evidence(entries))
    assert result.problems == ["team-a/g: open in the ledger on m1, running on no member"]
    running = {"team-a/g": Holding("m1", {GPU: 8})}
    assert check_members_match(_evidence(entries, running=running)).ok
    assert "| ledger's open usage = what members run | 1 |" in table([result])


# --- the runs ------------------------------------------------------------------------------


def _assert_sound(runner: Runner, *, cancels: bool = False, preemptions: bool = False) -> None:
    run = runner.execute()
    report = table(run.checks)
    assert run.checks and run.ok, f"{report}\n{run.to_json()}"
    assert run.check("lost").counts["acknowledged"] > 0
    assert run.check("unexpected").counts["gangs_on_members"] > 0
    # The faults did move gangs: some ran in two clusters (one after the other).
    assert run.check("running in two clusters at once").counts["gangs_that_ran_in_two_clusters"]
    # The cut-off member's agent had to stop gangs (ones that outlast the fence time).
    heal = next(p for p in run.phases if p.name == "heal")
    assert heal.detail["agent_deleted_jobs_so_far"] > 0, heal.detail
    assert run.failures == [], run.failures
    assert not any(a.startswith("500") for a in run.answers), run.answers
    assert run.processes_left == [], run.processes_left
    if cancels:  # the load cancelled gangs, and some were holding capacity then
        assert run.check("lost").counts["cancelled"] > 0, run.check("lost").counts
        assert any(a.startswith("cancel 200") for a in run.answers), run.answers
    if preemptions:
        assert run.check("admitted twice without a release between").counts["preempted"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_partition_and_a_lost_member_under_load_lose_nothing_and_run_nothing_twice(
    tmp_path: Path,
) -> None:
    """Sized down (under ``-m slow``: three minutes of a 2-core box's suite
    of ten; each fault has a quicker test of its own, and test_sync the race
    this run found): the member faults only (a partition with fence agents
    running, then a member killed), 1.5 submissions a second on members of
    32 GPUs, gangs of 1 to 3 s and every sixth of 18 to 22 s (to outlast the
    fence time when cut off): enough to keep two members busy, and no more
    than two can run (so that the gangs of a lost member run elsewhere at
    once)."""
    size = Size(
        rate=1.5,
        warmup=3.0,
        between=1.0,
        run_seconds=(1.0, 3.0),
        long_every=6,
        long_seconds=(18.0, 22.0),
        fresh=4.0,
        nodes=4,
        cancel_every=7,
        high_every=5,
        nominal_fraction=0.5,
        preemption=True,
        faults=("partition", "member-kill"),
    )
    _assert_sound(Runner(tmp_path, size), cancels=True, preemptions=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_fault_sequence_in_full_loses_nothing_adds_nothing_and_runs_nothing_twice(
    tmp_path: Path,
) -> None:
    """As bench/chaos.py runs it, every fault in sequence, somewhat smaller."""
    size = Size(rate=1.5, warmup=8.0, between=3.0)
    _assert_sound(Runner(tmp_path, size))
