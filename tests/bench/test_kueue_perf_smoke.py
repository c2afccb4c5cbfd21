"""bench/kueue_perf stays working: Kueue's baseline config, sized down to 52
workloads, through the whole stack (API, scheduler, Celery worker, a
stand-in member running each pod its runtime), every workload finished
exactly once and no quota exceeded, checked from the ledger, the events and
the member's kubelet; with ``-m slow``, three members, one killed mid-run
and its gangs run elsewhere after the lease.

The checks are first shown to fail on ledgers that hold what each is for (a
ClusterQueue over its borrowing limit, a cohort over its quota, an
admission while holding one, a workload finished twice or never), so that a
green run means something.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from bench.kueue_perf.checks import (
    check_finished_once,
    check_quota,
    check_submitted,
    check_topology,
)
from bench.kueue_perf.configs import BASELINE, TAS, Config, arrivals, cq_name, physical_limit
from bench.kueue_perf.measure import figures
from bench.kueue_perf.run import ENV, Options, execute
from service.ledger.chain import LedgerEntry

#: 1 cohort x 2 ClusterQueues x (18 small + 5 medium + 3 large).
SMALL = BASELINE.scaled(1, 2, 0.05)


def _entries(*items: tuple[str, str, dict[str, Any]]) -> list[LedgerEntry]:
    """Ledger entries ``(kind, namespace/name, extra body)``, in order."""
    out = []
    for seq, (kind, key, extra) in enumerate(items, start=1):
        namespace, name = key.split("/")
        body = {"namespace": namespace, "workload": name, **extra}
        out.append(LedgerEntry(seq, uuid4(), kind, datetime.now(UTC), body, b"", b""))
    return out


def _admit(cq: str, cpu: int) -> dict[str, Any]:
    return {"cluster_queue": cq, "cluster": "m1", "reserved": {"rf": {"cpu": cpu}}}


def test_quota_check_catches_a_queue_over_its_limit_a_cohort_over_its_quota_and_a_second_hold() -> (
    None
):
    config = BASELINE.scaled(1, 2, 0.05)
    a, b = cq_name(0, 0), cq_name(1, 0)
    within = _entries(
        ("workload.admitted", f"{a}/x", _admit(a, 20_000)),
        ("workload.admitted", f"{b}/y", _admit(b, 20_000)),
        ("workload.finished", f"{a}/x", {}),
        ("workload.admitted", f"{b}/z", _admit(b, 20_000)),
    )
    assert check_quota(config, within).ok
    # b borrows all of a's 20 cpu: 40 of the cohort's 40, within b's 120.
    over_cohort = _entries(
        ("workload.admitted", f"{b}/y", _admit(b, 20_000)),
        ("workload.admitted", f"{b}/z", _admit(b, 20_000)),
        ("workload.admitted", f"{a}/x", _admit(a, 1_000)),
    )
    found = check_quota(config, over_cohort).problems
    assert len(found) == 1 and "cohort-0 holds 41000m" in found[0]
    lone = BASELINE.scaled(1, 10, 0.05)  # a cohort of 200 cpu, a queue's limit 120
    over_queue = _entries(
        *(("workload.admitted", f"{a}/w{i}", _admit(a, 20_000)) for i in range(7))
    )
    found = check_quota(lone, over_queue).problems
    assert len(found) == 1 and "holds 140000m cpu > 120000m" in found[0]
    twice = _entries(
        ("workload.admitted", f"{a}/x", _admit(a, 1_000)),
        ("workload.admitted", f"{a}/x", _admit(a, 1_000)),
    )
    assert ["admitted while holding" in p for p in check_quota(config, twice).problems] == [True]
    lost = _entries(
        ("workload.admitted", f"{b}/y", _admit(b, 20_000)),
        ("workload.admitted", f"{b}/z", _admit(b, 20_000)),
        ("cluster.lost", "-/-", {"cluster": "m1"}),
        ("workload.admitted", f"{a}/x", _admit(a, 20_000)),
    )
    assert check_quota(config, lost).ok


def test_finished_and_submitted_checks_catch_twice_never_and_strangers() -> None:
    config = BASELINE.scaled(1, 1, 0.01)
    keys = [f"{a.namespace}/{a.name}" for a in arrivals(config)]
    entries = _entries(
        *(("workload.submitted", k, {}) for k in keys),
        *(("workload.finished", k, {"outcome": "succeeded"}) for k in keys[1:]),
        ("workload.finished", keys[1], {"outcome": "succeeded"}),
        ("workload.submitted", "stranger/x", {}),
    )
    events = Counter(keys[1:])
    problems = check_finished_once(config, events, entries).problems
    assert [p.split(":")[0] for p in problems] == sorted([keys[0], keys[1]])
    statuses = {k: 201 for k in keys[1:]} | {keys[0]: 422}
    problems = check_submitted(config, statuses, entries).problems
    assert [p.split(":")[0] for p in problems] == [keys[0], "stranger/x"]


def test_topology_check_catches_a_required_pod_set_across_racks() -> None:
    config = TAS.scaled(1, 1, 0.01)
    by_kind = {a.cls.tas: a for a in arrivals(config)}
    racks = {"m1/a": "r0", "m1/b": "r0", "m1/c": "r1"}

    def placed(kind: str, nodes: list[str]) -> tuple[str, str, list[list[str]]]:
        return (by_kind[kind].namespace, by_kind[kind].name, [nodes])

    within = [placed("required", ["m1/a", "m1/b"]), placed("preferred", ["m1/a", "m1/c"])]
    result = check_topology(config, within, racks)
    assert result.ok and result.counts["preferred_in_one_rack"] == 0
    across = [placed("required", ["m1/a", "m1/c"]), placed("balanced", ["m1/b", "m1/c"])]
    assert len(check_topology(config, across, racks).problems) == 2


def test_the_physical_limit_of_the_baseline_is_its_work_over_its_quota_or_later() -> None:
    limit = physical_limit(BASELINE)
    # 30 ClusterQueues x (350 x 1 x 0.2 + 100 x 5 x 0.5 + 50 x 20 x 1) cpu-s over 600 cpu.
    assert (limit["total_work_cpu_s"], limit["work_bound_s"]) == (39_600, 66.0)
    assert limit["arrival_bound_s"] == 61.0  # the 50th large at 60 s, running 1 s
    assert limit["limit_s"] >= 66.0


def _run(config: Config, **options: Any) -> dict[str, Any]:
    said: list[str] = []
    raw = execute(Options(config=config, timeout=900, say=said.append, **options))
    result = figures(raw)
    assert raw.finished_in_time, said
    return result


def _check(result: dict[str, Any], name: str) -> dict[str, Any]:
    check: dict[str, Any] = next(c for c in result["checks"] if c["check"].startswith(name))
    return check


def test_baseline_sized_down_every_workload_finishes_once_within_quota() -> None:
    result = _run(SMALL)
    assert [c["check"] for c in result["checks"] if not c["ok"]] == [], result["checks"]
    assert _check(result, "every workload finished")["finished"] == SMALL.workloads == 52
    quota = _check(result, "no quota")
    assert quota["admissions"] >= SMALL.workloads
    assert 0 < quota["peak_cohort_cpu"] <= quota["cohort_limit_cpu"]
    assert _check(result, "the members ran")["pod_runs"] >= SMALL.workloads
    assert result["states_at_end"] == {"Finished": SMALL.workloads}
    assert set(result["classes"]) == {"small", "medium", "large"}
    assert all(c["time_to_admission_s"]["n"] > 0 for c in result["classes"].values())
    assert result["usage"]["usage_pct"] > 0


@pytest.mark.slow
def test_three_members_one_killed_its_gangs_run_elsewhere_after_the_lease() -> None:
    result = _run(SMALL, members=3, capacity_factor=3.0, kill_at=4.0)
    assert [c["check"] for c in result["checks"] if not c["ok"]] == [], result["checks"]
    loss = result["cluster_loss"]
    assert loss["gangs_held_at_kill"] + loss["gangs_admitted_there_after_kill"] > 0
    assert loss["lost_after_s"] >= float(ENV["QM_CLUSTER_LEASE"]) - 10  # heartbeat's age
    assert loss["never_ran_elsewhere"] == 0
