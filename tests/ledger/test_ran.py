"""Accounting of ``ran`` (issue 17, finding 1): what admissions' pods ran, from
``workload.ran`` entries, beside what they held. Incremental equals from
scratch and a reference written here from the definition; a member
measurement supersedes a lost member's estimate in either order; the
lifecycle builds the entries from pods' timestamps; the audit check finds
entries that contradict the ledger."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from service.app import lifecycle
from service.app.lifecycle import PodTimes, Seen, Status, Subject
from service.ledger.accounting import (
    UsageRollup,
    ran_by_workload,
    ran_hours_from_scratch,
    ran_mismatches,
    ran_problems,
)
from service.ledger.chain import LedgerEntry, NewLedgerEntry
from service.ledger.cli import app
from service.ledger.entries import PodRun, WorkloadAdmitted, WorkloadRan, new_entry
from service.ledger.export import export_ndjson
from service.ledger.memory import InMemoryLedger

T0 = datetime(2026, 11, 29, 23, 30, tzinfo=UTC)  # near an hour, a day and a month boundary
GPU = "nvidia.com/gpu"
NAMES = {"namespace": "team-a", "local_queue": "lq", "cluster_queue": "cq"}


def admitted(w: int, gpus: int = 8, cluster: str = "c1") -> WorkloadAdmitted:
    return WorkloadAdmitted(
        **NAMES,
        workload=f"w{w}",
        cluster=cluster,
        flavors={GPU: "h100", "cpu": "h100"},
        island=None,
        reserved={"h100": {GPU: gpus, "cpu": 1000 * gpus}},
        borrowed={},
        reason="fits",
    )


def ran(
    w: int, admission: uuid.UUID, runs: list[tuple[int, int, int]], measured: str = "member"
) -> WorkloadRan:
    """``runs``: (start second, end second, GPUs) from T0."""
    pod_runs = [
        PodRun(
            started_at=T0 + timedelta(seconds=a),
            finished_at=T0 + timedelta(seconds=b),
            pods=1,
            amounts={"h100": {GPU: g}},
        )
        for a, b, g in runs
    ]
    return WorkloadRan(
        namespace="team-a",
        local_queue="lq",
        cluster_queue="cq",
        workload=f"w{w}",
        cluster="c1",
        admission=str(admission),
        measured=measured,  # type: ignore[arg-type]
        runs=pod_runs,
        gpu_seconds=sum(g * (b - a) for a, b, g in runs),
        cpu_seconds=0,
        memory_gib_seconds=0,
    )


def chain(items: list[NewLedgerEntry]) -> list[LedgerEntry]:
    ledger = InMemoryLedger()
    ledger.append(items)
    return ledger.entries


def test_ran_is_summed_exactly_and_reported_beside_held() -> None:
    adm = uuid.uuid4()
    entries = chain(
        [
            new_entry(admitted(0), adm, T0),
            # two pods: one across the hour boundary (23:30:10 to 00:10:10), one short
            new_entry(ran(0, adm, [(10, 2410, 4), (20, 80, 4)]), uuid.uuid4(), T0),
        ]
    )
    rollup = UsageRollup()
    rollup.apply_all(entries)
    assert rollup.ran_hours() == ran_hours_from_scratch(entries)
    assert ran_by_workload(entries, GPU) == {"team-a/w0": 4 * 2400 + 4 * 60}
    by_hour = {
        r.period.hour: r for r in rollup.report("hour", ("namespace",), T0) if r.resource == GPU
    }
    assert round(by_hour[23].ran * 3600) == 4 * 1790 + 4 * 60
    assert round(by_hour[0].ran * 3600) == 4 * 610
    # held: the admission is still open, charged to an hour later
    later = rollup.report("day", ("namespace",), T0 + timedelta(hours=1))
    days = {r.period.day: (r.held, r.ran) for r in later if r.resource == GPU}
    assert days == {29: (4.0, 7400 / 3600), 30: (4.0, 2440 / 3600)}


def test_a_member_measurement_supersedes_the_estimate_in_either_order() -> None:
    adm = uuid.uuid4()
    estimate = ran(0, adm, [(0, 100, 8)], "estimate")
    measured = ran(0, adm, [(0, 130, 8)])
    for order in ([estimate, measured], [measured, estimate]):
        entries = chain(
            [new_entry(admitted(0), adm, T0)] + [new_entry(b, uuid.uuid4(), T0) for b in order]
        )
        rollup = UsageRollup()
        rollup.apply_all(entries)
        assert ran_by_workload(entries, GPU) == {"team-a/w0": 8 * 130}
        assert rollup.ran_hours() == ran_hours_from_scratch(entries)
        assert sum(rollup.ran_hours().values()) == 8 * 130 * 1_000_000
    # an estimate alone counts, until a measurement comes
    alone = chain([new_entry(admitted(0), adm, T0), new_entry(estimate, uuid.uuid4(), T0)])
    assert ran_by_workload(alone, GPU) == {"team-a/w0": 800}


@st.composite
def histories(draw: st.DrawFn) -> list[NewLedgerEntry]:
    items: list[NewLedgerEntry] = []
    admissions: list[tuple[int, uuid.UUID]] = []
    for _ in range(draw(st.integers(0, 30))):
        if not admissions or draw(st.booleans()):
            w, adm = draw(st.integers(0, 4)), uuid.uuid4()
            admissions.append((w, adm))
            items.append(new_entry(admitted(w), adm, T0))
            continue
        w, adm = draw(st.sampled_from(admissions))
        runs = draw(
            st.lists(
                st.tuples(st.integers(0, 9000), st.integers(0, 9000), st.integers(1, 8)).map(
                    lambda r: (min(r[0], r[1]), max(r[0], r[1]), r[2])
                ),
                max_size=4,
            )
        )
        measured = draw(st.sampled_from(["member", "estimate"]))
        items.append(new_entry(ran(w, adm, runs, measured), uuid.uuid4(), T0))
    return items


def reference(items: list[NewLedgerEntry]) -> dict[str, int]:
    """GPU-seconds per workload from the definition: per admission its first
    member measurement, else its first estimate."""
    chosen: dict[str, dict[str, Any]] = {}
    for item in items:
        if item.kind != "workload.ran":
            continue
        before = chosen.get(item.body["admission"])
        if before is None or (before["measured"], item.body["measured"]) == ("estimate", "member"):
            chosen[item.body["admission"]] = dict(item.body)
    totals: dict[str, int] = defaultdict(int)
    for body in chosen.values():
        totals[f"team-a/{body['workload']}"] += body["gpu_seconds"]
    return dict(totals)


@settings(max_examples=150, deadline=None)
@given(items=histories(), cut=st.integers(0, 30))
def test_incremental_ran_equals_from_scratch_and_the_definition(
    items: list[NewLedgerEntry], cut: int
) -> None:
    entries = chain(items)
    first = UsageRollup()
    first.apply_all(entries[:cut])
    first.apply_all(entries[cut:])
    assert first.ran_hours() == ran_hours_from_scratch(entries)
    assert {k: v for k, v in ran_by_workload(entries, GPU).items() if v} == {
        k: v for k, v in reference(items).items() if v
    }
    assert sum(first.ran_hours().values()) == sum(reference(items).values()) * 1_000_000
    # the generator measures an admission twice at times: nothing else is wrong
    assert all("measured twice" in p for p in ran_problems(entries))


def test_the_audit_check_finds_entries_that_contradict_the_ledger() -> None:
    adm, other = uuid.uuid4(), uuid.uuid4()
    wrong_gpus = ran(0, adm, [(0, 10, 8)]).model_copy(update={"gpu_seconds": 81})
    entries = chain(
        [
            new_entry(admitted(0), adm, T0),
            new_entry(ran(0, adm, [(0, 10, 8)]), uuid.uuid4(), T0),
            new_entry(ran(0, adm, [(0, 10, 8)]), uuid.uuid4(), T0),  # measured again
            new_entry(ran(1, adm, [], "estimate"), uuid.uuid4(), T0),  # another's admission
            new_entry(ran(0, other, []), uuid.uuid4(), T0),  # never admitted
            new_entry(wrong_gpus.model_copy(update={"measured": "estimate"}), uuid.uuid4(), T0),
        ]
    )
    problems = ran_problems(entries)
    assert len(problems) == 4, problems
    assert "measured twice" in problems[0]
    assert "its admission names another" in problems[1]
    assert "never admitted" in problems[2]
    assert "gpu_seconds 81, its runs 80" in problems[3]
    assert ran_problems(entries[:2]) == []
    assert ran_mismatches({"a": 8, "b": 0}, {"a": 8}) == []
    assert ran_mismatches({"a": 8}, {"a": 9}) == [
        "a: ledger ran 8, members report 9",
        "total: ledger 8, members 9",
    ]


# --- the entries, as the lifecycle builds them ----------------------------------------------

SUBJECT = Subject("team-a", "w0", "uid-0", "lq")


def test_a_measured_run_groups_pods_by_their_seconds_and_puts_them_on_flavors() -> None:
    adm = str(uuid.uuid4())
    body = {**admitted(0).model_dump(mode="json")}
    at = [T0 + timedelta(seconds=s) for s in range(4)]
    pods = [
        PodTimes(at[0], at[3], {GPU: 8, "cpu": 8000, "pods": 1}),
        PodTimes(at[0], at[3], {GPU: 8, "cpu": 8000}),
        PodTimes(at[1], at[2], {GPU: 8}),
        PodTimes(None, None, {GPU: 8}),  # never ran
    ]
    entry = lifecycle.measured_run(body, adm, pods, T0)
    assert entry.entry_id == lifecycle.ran_entry_id(adm, "member")
    assert entry.entry_id == lifecycle.measured_run(body, adm, pods[:1], T0).entry_id
    assert entry.body["runs"] == [
        {
            "started_at": "2026-11-29T23:30:00Z",
            "finished_at": "2026-11-29T23:30:03Z",
            "pods": 2,
            "amounts": {"h100": {GPU: 16, "cpu": 16000}},
        },
        {
            "started_at": "2026-11-29T23:30:01Z",
            "finished_at": "2026-11-29T23:30:02Z",
            "pods": 1,
            "amounts": {"h100": {GPU: 8}},
        },
    ]
    assert entry.body["gpu_seconds"] == 16 * 3 + 8
    assert entry.body["cpu_seconds"] == 16 * 3
    assert lifecycle.measured_run(body, adm, pods[3:], T0).body["runs"] == []


def _running_status(adm: str) -> Status:
    return Status(
        {
            "state": "Running",
            "podsReady": True,
            "startedAt": "2026-11-29T23:30:00Z",
            "clusterQueue": "cq",
            "admission": {
                "id": adm,
                "cluster": "c1",
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "workers",
                        "count": 2,
                        "flavors": {GPU: "h100"},
                        "resourceUsage": {GPU: "16"},
                    }
                ],
            },
        }
    )


def test_a_lost_members_gang_is_estimated_up_to_when_it_was_last_seen() -> None:
    adm = str(uuid.uuid4())
    seen = Seen(T0 + timedelta(seconds=90), T0 + timedelta(hours=1))
    change = lifecycle.lose_cluster(
        SUBJECT, _running_status(adm), "c1", "ClusterLost", "gone", T0 + timedelta(hours=2), seen
    )
    assert change is not None
    estimate = [e for e in change.entries if e.kind == "workload.ran"]
    assert [e.entry_id for e in estimate] == [lifecycle.ran_entry_id(adm, "estimate")]
    body = estimate[0].body
    assert body["measured"] == "estimate" and body["gpu_seconds"] == 16 * 90
    assert body["runs"][0]["pods"] == 2
    assert body["at_most_until"] == "2026-11-30T00:30:00Z"
    # never seen running: nothing ran; not seen since it started: nothing either
    admitted_only = Status({**_running_status(adm).raw, "state": "Admitted", "podsReady": False})
    for status, at in ((admitted_only, seen), (_running_status(adm), Seen(T0))):
        lost = lifecycle.lose_cluster(SUBJECT, status, "c1", "ClusterLost", "gone", T0, at)
        assert lost is not None
        assert [e.body["runs"] for e in lost.entries if e.kind == "workload.ran"] == [[]]
    cancelling = Status({**_running_status(adm).raw, "state": "Cancelling"})
    lost = lifecycle.lose_cluster(SUBJECT, cancelling, "c1", "ClusterLost", "gone", T0, seen)
    assert lost is not None and lost.status.state == "Cancelled"
    assert [e.kind for e in lost.entries] == ["workload.finished", "workload.ran"]


def test_ledger_usage_prints_ran_beside_hours(tmp_path: Path) -> None:
    adm = uuid.uuid4()
    entries = chain(
        [
            new_entry(admitted(0), adm, T0),
            new_entry(ran(0, adm, [(0, 1800, 8)]), uuid.uuid4(), T0 + timedelta(minutes=30)),
        ]
    )
    path = tmp_path / "ledger.ndjson"
    path.write_bytes(b"".join(export_ndjson(entries)))
    result = CliRunner().invoke(app, ["usage", "--export", str(path), "--granularity", "hour"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "period\tnamespace\tresource\thours\tran",
        "2026-11-29T23:00:00+00:00\tteam-a\tcpu\t4.000000\t0.000000",
        "2026-11-29T23:00:00+00:00\tteam-a\tnvidia.com/gpu\t4.000000\t4.000000",
    ]
