"""Accounting from the ledger: incremental roll-up (with restarts from saved
state) equals recomputation from scratch and a minute-by-minute reference
written here, after random histories with preemptions, evictions, lost
clusters and quota changes."""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ledger.accounting import (
    Holding,
    HourKey,
    OutOfOrder,
    UsageRollup,
    audit,
    decayed_from_scratch,
    double_closes,
    hours_from_scratch,
    open_usage,
    usage_mismatches,
)
from service.ledger.chain import LedgerEntry
from service.ledger.entries import (
    Body,
    ClusterLost,
    QuotaChanged,
    WorkloadAdmitted,
    WorkloadEvicted,
    WorkloadFinished,
    WorkloadPreempted,
    WorkloadSubmitted,
    new_entry,
)
from service.ledger.memory import InMemoryLedger

T0 = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)  # near a day and a month boundary
GPU = "nvidia.com/gpu"
HALF_LIFE = 3 * 3600.0
WORKLOADS = [("team-a", "lq-a", "cq-a"), ("team-b", "lq-b", "cq-b"), ("team-a", "lq-a2", "cq-a")]


def queue(w: int) -> dict[str, str]:
    ns, lq, cq = WORKLOADS[w % len(WORKLOADS)]
    return {"namespace": ns, "workload": f"w{w}", "local_queue": lq, "cluster_queue": cq}


def admitted(w: int, cluster: str, flavor: str, gpus: int) -> WorkloadAdmitted:
    reserved = {flavor: {GPU: gpus, "cpu": 4000 * gpus, "memory": gpus * 2**34}}
    return WorkloadAdmitted(
        **queue(w),
        cluster=cluster,
        flavors={GPU: flavor, "cpu": flavor, "memory": flavor},
        island=None,
        reserved=reserved,
        borrowed={},
        reason="fits",
    )


def finished(w: int, cluster: str) -> WorkloadFinished:
    return WorkloadFinished(
        **queue(w),
        cluster=cluster,
        outcome="succeeded",
        started_at=T0,
        finished_at=T0,
        consumed={},
        gpu_seconds=0,
        cpu_seconds=0,
        memory_gib_seconds=0,
    )


def preempted(w: int, cluster: str) -> WorkloadPreempted:
    return WorkloadPreempted(
        **queue(w),
        cluster=cluster,
        reason="InCohortReclamation",
        preemptor="team-b/w99",
        preemptor_cluster_queue="cq-b",
        cohort_path=["root"],
        released={},
    )


def evicted(w: int, cluster: str) -> WorkloadEvicted:
    return WorkloadEvicted(
        **queue(w),
        cluster=cluster,
        reason="PodsReadyTimeout",
        message="not ready",
        requeued=True,
        released={},
    )


def quota_changed(n: int) -> QuotaChanged:
    return QuotaChanged(
        actor="admin",
        object_kind="ClusterQueue",
        name="cq-a",
        before={"nominalQuota": n},
        after={"nominalQuota": n + 8},
    )


def ledger_of(steps: list[tuple[int, Body]]) -> list[LedgerEntry]:
    """Entries at ``T0 + minutes``, in the given order (times may go back)."""
    ledger = InMemoryLedger()
    ledger.append([new_entry(body, uuid.uuid4(), T0 + timedelta(minutes=m)) for m, body in steps])
    return ledger.entries


# --- a random history, and a reference written from the definition ----------------------


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[int, Body]]:
    steps: list[tuple[int, Body]] = []
    running: dict[int, str] = {}
    minute = 0
    for _ in range(draw(st.integers(0, 40))):
        minute = max(0, minute + draw(st.integers(-3, 150)))  # clocks may disagree
        w = draw(st.integers(0, 7))
        action = draw(st.sampled_from(["admit", "admit", "end", "end", "lost", "quota", "submit"]))
        if action == "admit":
            cluster = draw(st.sampled_from(["c1", "c2"]))
            flavor = draw(st.sampled_from(["h100", "a100"]))
            steps.append((minute, admitted(w, cluster, flavor, draw(st.integers(1, 16)))))
            running[w] = cluster
        elif action == "end" and running:
            w = draw(st.sampled_from(sorted(running)))
            end = draw(st.sampled_from([finished, preempted, evicted]))
            steps.append((minute, end(w, running.pop(w))))
        elif action == "lost":
            cluster = draw(st.sampled_from(["c1", "c2"]))
            lost = sorted(k for k, c in running.items() if c == cluster)
            steps.append(
                (
                    minute,
                    ClusterLost(
                        cluster=cluster, last_heartbeat=None, requeued=[f"w{k}" for k in lost]
                    ),
                )
            )
            for k in lost:
                del running[k]
        elif action == "quota":
            steps.append((minute, quota_changed(minute)))
        else:
            steps.append(
                (
                    minute,
                    WorkloadSubmitted(
                        **queue(w), actor="ci", workload_class="training", priority=0, requests={}
                    ),
                )
            )
    return steps


def reference(
    entries: list[LedgerEntry], as_of_minute: int
) -> tuple[dict[HourKey, int], dict[str, dict[str, float]]]:
    """Minute by minute: who holds what, charged to that minute's hour; and
    each minute's share of the decayed usage, exactly integrated."""
    minute_us = 60_000_000
    hours: dict[HourKey, int] = defaultdict(int)
    decayed: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    holding: dict[str, dict[str, object]] = {}
    clock = 0
    times: list[int] = []
    for entry in entries:
        clock = max(clock, int((entry.recorded_at - T0) / timedelta(minutes=1)))
        times.append(clock)
    end_minute = max([as_of_minute, *times]) if times else as_of_minute
    rate = math.log(2) / HALF_LIFE
    boundaries = [*times[1:], end_minute] if times else []
    for entry, start, stop in zip(entries, times, boundaries, strict=True):
        body = entry.body
        key = f"{body.get('namespace')}/{body.get('workload')}"
        if entry.kind in {"workload.finished", "workload.preempted", "workload.evicted"}:
            holding.pop(key, None)
        elif entry.kind == "cluster.lost":
            holding = {k: v for k, v in holding.items() if v["cluster"] != body["cluster"]}
        elif entry.kind == "workload.admitted":
            holding[key] = dict(body)
        for minute in range(start, stop):
            t0 = T0 + timedelta(minutes=minute)
            hour = int((t0 - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(hours=1))
            age_start = (end_minute - minute) * 60.0
            weight = (math.exp(-rate * (age_start - 60.0)) - math.exp(-rate * age_start)) / rate
            for held in holding.values():
                reserved: dict[str, dict[str, int]] = held["reserved"]  # type: ignore[assignment]
                lq = f"{held['namespace']}/{held['local_queue']}"
                for flavor, amounts in reserved.items():
                    for resource, amount in amounts.items():
                        hk = (
                            hour,
                            str(held["namespace"]),
                            str(held["local_queue"]),
                            str(held["cluster_queue"]),
                            str(held["cluster"]),
                            flavor,
                            resource,
                        )
                        hours[hk] += amount * minute_us
                        decayed[lq][resource] += amount * weight
    return dict(hours), {q: dict(u) for q, u in decayed.items()}


@settings(max_examples=120, deadline=None)
@given(histories(), st.data())
def test_incremental_equals_from_scratch_and_the_reference(
    steps: list[tuple[int, Body]], data: st.DataObject
) -> None:
    entries = ledger_of(steps)
    last = max([0, *(m for m, _ in steps)])
    as_of_minute = last + data.draw(st.integers(0, 300))
    as_of = T0 + timedelta(minutes=as_of_minute)

    rollup = UsageRollup(HALF_LIFE)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(entries)), max_size=4)))
    position = 0
    for cut in [*cuts, len(entries)]:
        rollup.apply_all(entries[position:cut])
        position = max(position, cut)

    expected_hours, expected_decayed = reference(entries, as_of_minute)
    assert rollup.hours(as_of) == hours_from_scratch(entries, as_of) == expected_hours

    usage = rollup.local_queue_usage(as_of)
    scratch = decayed_from_scratch(entries, as_of, HALF_LIFE)
    rate = math.log(2) / HALF_LIFE
    assert set(usage) == {q for q, u in expected_decayed.items() if any(u.values())}
    for q, per_resource in expected_decayed.items():
        for resource, value in per_resource.items():
            assert usage[q].consumed[resource] == pytest.approx(value * rate, rel=1e-9)
            assert scratch[q][resource] == pytest.approx(value * rate, rel=1e-9)


# --- worked examples ----------------------------------------------------------------------


def test_a_job_across_midnight_is_split_by_hour_day_and_month() -> None:
    # 8 GPUs from 23:30 on Nov 30 to 00:30 on Dec 1: half an hour in each month.
    start = T0 + timedelta(days=1, minutes=90)
    entries = ledger_of(
        [
            (int((start - T0) / timedelta(minutes=1)), admitted(0, "c1", "h100", 8)),
            (int((start - T0) / timedelta(minutes=1)) + 60, finished(0, "c1")),
        ]
    )
    rollup = UsageRollup()
    rollup.apply_all(entries)
    hourly = [(r.period.hour, r.hours) for r in rollup.report("hour", by=()) if r.resource == GPU]
    assert hourly == [(23, 4.0), (0, 4.0)]
    monthly = rollup.report("month", by=("namespace", "flavor"))
    gpu = [(r.period.month, r.group, r.hours) for r in monthly if r.resource == GPU]
    assert gpu == [
        (11, (("namespace", "team-a"), ("flavor", "h100")), 4.0),
        (12, (("namespace", "team-a"), ("flavor", "h100")), 4.0),
    ]
    cpu = sum(r.hours for r in monthly if r.resource == "cpu")
    memory = sum(r.hours for r in monthly if r.resource == "memory")
    assert cpu == 32.0  # 32 cores for an hour
    assert memory == 8 * 16.0  # 128 GiB for an hour


def test_preemption_stops_the_charge_and_readmission_restarts_it() -> None:
    entries = ledger_of(
        [
            (0, admitted(0, "c1", "h100", 4)),
            (30, preempted(0, "c1")),
            (90, admitted(0, "c2", "a100", 4)),
            (120, finished(0, "c2")),
        ]
    )
    rollup = UsageRollup()
    rollup.apply_all(entries)
    by_cluster = {
        r.group: r.hours for r in rollup.report("day", by=("cluster",)) if r.resource == GPU
    }
    assert by_cluster == {(("cluster", "c1"),): 2.0, (("cluster", "c2"),): 2.0}


def test_a_lost_cluster_releases_only_its_own_gangs() -> None:
    entries = ledger_of(
        [
            (0, admitted(0, "c1", "h100", 1)),
            (0, admitted(1, "c2", "h100", 1)),
            (60, ClusterLost(cluster="c1", last_heartbeat=None, requeued=["team-a/w0"])),
        ]
    )
    rollup = UsageRollup()
    rollup.apply_all(entries)
    as_of = T0 + timedelta(hours=3)
    gpu = {
        r.group: r.hours for r in rollup.report("month", ("cluster",), as_of) if r.resource == GPU
    }
    assert gpu == {(("cluster", "c1"),): 1.0, (("cluster", "c2"),): 3.0}


def test_quota_changes_do_not_charge_anyone() -> None:
    entries = ledger_of([(0, quota_changed(8)), (60, quota_changed(16))])
    rollup = UsageRollup()
    rollup.apply_all(entries)
    assert rollup.hours(T0 + timedelta(days=1)) == {}
    assert rollup.local_queue_usage() == {}


def test_decayed_usage_halves_every_half_life_after_the_work_stops() -> None:
    entries = ledger_of([(0, admitted(0, "c1", "h100", 8)), (60, finished(0, "c1"))])
    rollup = UsageRollup(half_life_seconds=3600.0)
    rollup.apply_all(entries)
    at_end = rollup.local_queue_usage(T0 + timedelta(hours=1))["team-a/lq-a"].consumed[GPU]
    later = rollup.local_queue_usage(T0 + timedelta(hours=2))["team-a/lq-a"].consumed[GPU]
    assert at_end == pytest.approx(8 * 0.5)  # one half-life of 8 GPUs: λ∫ = 8(1 - 1/2)
    assert later == pytest.approx(at_end / 2)


def test_entries_must_come_in_order() -> None:
    entries = ledger_of([(0, quota_changed(1)), (1, quota_changed(2))])
    rollup = UsageRollup()
    with pytest.raises(OutOfOrder):
        rollup.apply(entries[1])
    rollup.apply(entries[0])
    with pytest.raises(OutOfOrder):
        rollup.apply(entries[0])


def test_unknown_report_dimensions_are_refused() -> None:
    with pytest.raises(ValueError):
        UsageRollup().report("day", by=("team",))


# --- the audit: the ledger's open usage against what the members run ---------------------


def test_open_usage_is_what_was_admitted_and_not_released_at_that_instant() -> None:
    entries = ledger_of(
        [
            (0, admitted(1, "c1", "h100", 8)),
            (1, admitted(2, "c1", "h100", 16)),
            (2, admitted(3, "c2", "h100", 8)),
            (3, finished(1, "c1")),
            (4, preempted(2, "c1")),
            (5, ClusterLost(cluster="c2", last_heartbeat=None, requeued=[])),
        ]
    )
    at = {m: sorted(open_usage(entries, T0 + timedelta(minutes=m))) for m in range(6)}
    assert at[0] == ["team-b/w1"]
    assert at[2] == ["team-a/w2", "team-a/w3", "team-b/w1"]
    assert at[3] == ["team-a/w2", "team-a/w3"]
    assert at[4] == ["team-a/w3"]
    assert at[5] == [] and open_usage(entries) == {}
    assert open_usage(entries, T0 + timedelta(minutes=2))["team-a/w2"].per_resource()[GPU] == 16


def test_usage_mismatches_name_what_is_billed_but_not_run_and_the_other_way_round() -> None:
    entries = ledger_of([(0, admitted(1, "c1", "h100", 8)), (1, admitted(2, "c1", "h100", 8))])
    billed = open_usage(entries)
    gpus = {GPU: 8, "cpu": 32000, "memory": 8 * 2**34}
    assert usage_mismatches(billed, {k: Holding("c1", gpus) for k in billed}) == []
    problems = usage_mismatches(
        billed,
        {
            "team-b/w1": Holding("c2", gpus),  # elsewhere
            "team-b/w9": Holding("c1", gpus),  # run, never billed
        },
    )
    assert problems == [
        "team-a/w2: open in the ledger on c1, running on no member",
        "team-b/w1: open on c1, running on c2",
        "team-b/w9: running on c1, not open in the ledger",
    ]
    wrong = usage_mismatches(billed, {k: Holding("c1", {**gpus, GPU: 4}) for k in billed})
    assert len(wrong) == 2 and all("billed" in p for p in wrong)


def test_a_second_close_of_one_admission_is_a_double_close() -> None:
    entries = ledger_of(
        [
            (0, admitted(1, "c1", "h100", 8)),
            (1, evicted(1, "c1")),
            (2, finished(1, "c1")),  # the same admission closed again
            (3, admitted(1, "c1", "h100", 8)),
            (4, finished(1, "c1")),
        ]
    )
    (problem,) = double_closes(entries)
    assert problem.startswith("entry 3: workload.finished of team-b/w1")
    assert audit(entries, {}) == [problem]


def test_a_cancelled_running_gang_is_billed_until_its_close_and_not_after() -> None:
    """Issue 17 finding 1 in the ledger's terms: a gang cancelled after an
    hour of 8 GPUs, closed by a ``cancelled`` finish, is charged 8 GPU-hours
    however late the report is asked for; without the close it would be
    charged up to the report's time."""
    cancelled = finished(1, "c1").model_copy(update={"outcome": "cancelled"})
    entries = ledger_of([(0, admitted(1, "c1", "h100", 8)), (60, cancelled)])
    rollup = UsageRollup()
    rollup.apply_all(entries)
    later = T0 + timedelta(days=3)
    (row,) = [r for r in rollup.report("month", ("namespace",), later) if r.resource == GPU]
    assert row.hours == pytest.approx(8.0)
    assert open_usage(entries) == {}
