"""Runs every scenario under tests/engine/scenarios/ (see scenario.py for the format)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.domain.quantity import canonical_amount
from service.engine import CycleResult, Fragmentation, admission_cycle
from tests.engine.invariants import violations
from tests.engine.scenario import Scenario, all_scenario_paths, key_of, load

PATHS = all_scenario_paths()


def test_there_are_enough_scenarios() -> None:
    assert len(PATHS) >= 40
    upstream = [p for p in PATHS if "upstream:" in p.read_text(encoding="utf-8")]
    assert len(upstream) >= 15
    for source in (
        "scheduler_test.go",
        "scheduler_fs_test.go",
        "preemption_test.go",
        "preemption_fair_test.go",
        "preemption_hierarchical_test.go",
    ):
        assert any(source in p.read_text(encoding="utf-8") for p in upstream), source
    fair = [p for p in upstream if "scheduler_fs_test.go" in p.read_text(encoding="utf-8")]
    assert len(fair) >= 5


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_scenario(path: Path) -> None:
    scenario = load(path)
    result = admission_cycle(scenario.snapshot, scenario.now)
    assert admission_cycle(scenario.snapshot, scenario.now) == result, "not deterministic"
    problems = violations(scenario.snapshot, result, scenario.now)
    assert not problems, problems
    check_expectations(scenario, result)


def check_expectations(scenario: Scenario, result: CycleResult) -> None:
    expect = scenario.expect
    _check_admitted(expect.get("admitted") or {}, result)
    _check_preempted(expect.get("preempted") or [], result)
    _check_evicted(expect.get("evicted") or [], result)
    _check_pending(expect.get("pending") or {}, result)
    _check_budgets(expect.get("preemptionBudgets"), result)


def _check_budgets(expected: dict[str, Any] | None, result: CycleResult) -> None:
    if expected is None:
        return
    got = {name: state.tokens for name, state in result.preemption_budgets.items()}
    assert got == pytest.approx(expected), got


def _check_admitted(expected: dict[str, Any] | list[str], result: CycleResult) -> None:
    if isinstance(expected, list):
        expected = dict.fromkeys(expected)
    want = {key_of(k): v or {} for k, v in expected.items()}
    got = {d.workload: d for d in result.admissions}
    assert sorted(got) == sorted(want), (
        f"admitted {sorted(got)}, expected {sorted(want)}; pending: "
        + "; ".join(f"{k}: {v.reason}: {v.message}" for k, v in result.pending.items())
    )
    for key, details in want.items():
        decision = got[key]
        admission = decision.admission
        if "cluster" in details:
            assert admission.cluster == details["cluster"], f"{key} cluster"
        if "clusterQueue" in details:
            assert admission.cluster_queue == details["clusterQueue"], f"{key} clusterQueue"
        if "flavors" in details:
            flavors: dict[str, str] = {}
            for ps in admission.pod_set_assignments:
                flavors.update(ps.flavors)
            assert flavors == details["flavors"], f"{key} flavors {flavors}"
        if "islands" in details:
            islands = [i for ps in admission.pod_set_assignments for i in ps.islands]
            assert sorted(islands) == sorted(details["islands"]), f"{key} islands {islands}"
        if "islandCount" in details:
            islands = {i for ps in admission.pod_set_assignments for i in ps.islands}
            assert len(islands) == details["islandCount"], f"{key} islands {islands}"
        if "nodes" in details:
            nodes: dict[str, int] = {}
            for ps in admission.pod_set_assignments:
                for node, pods in ps.placement:
                    nodes[node] = nodes.get(node, 0) + pods
            assert nodes == details["nodes"], f"{key} nodes {nodes}"
        if "borrowed" in details:
            borrowed = {f"{f}/{r}": a for (f, r), a in decision.borrowed.items()}
            want_borrowed = {
                k: canonical_amount(k.split("/", 1)[1], v) for k, v in details["borrowed"].items()
            }
            assert borrowed == want_borrowed, f"{key} borrowed {borrowed}"


def _check_preempted(expected: list[dict[str, Any]], result: CycleResult) -> None:
    got = {(p.workload, p.reason) for p in result.preemptions}
    want = {(key_of(e["workload"]), e["reason"]) for e in expected}
    assert got == want, f"preempted {sorted(got)}, expected {sorted(want)}"
    by_victim = {p.workload: p for p in result.preemptions}
    for entry in expected:
        if "preemptor" in entry:
            assert by_victim[key_of(entry["workload"])].preemptor == key_of(entry["preemptor"])
        if "cluster" in entry:
            assert by_victim[key_of(entry["workload"])].cluster == entry["cluster"]
        if "workDestroyed" in entry:
            got_work = by_victim[key_of(entry["workload"])].work_destroyed
            assert got_work == pytest.approx(entry["workDestroyed"]), got_work
        if "budgeted" in entry:
            assert by_victim[key_of(entry["workload"])].budgeted is entry["budgeted"]


def _check_evicted(expected: list[dict[str, Any]], result: CycleResult) -> None:
    got = {(e.workload, e.reason) for e in result.evictions}
    want = {(key_of(e["workload"]), e["reason"]) for e in expected}
    assert got == want, f"evicted {sorted(got)}, expected {sorted(want)}"
    by_key = {e.workload: e for e in result.evictions}
    for entry in expected:
        eviction = by_key[key_of(entry["workload"])]
        if "requeueAt" in entry:
            assert eviction.requeue_state is not None
            assert eviction.requeue_state.requeue_at == entry["requeueAt"]
        if "deactivated" in entry:
            assert eviction.deactivated == entry["deactivated"]


def _check_pending(expected: dict[str, Any], result: CycleResult) -> None:
    for name, given in expected.items():
        key = key_of(name)
        assert key in result.pending, f"{key} is not pending"
        reason = result.pending[key]
        details = given or {}
        if "reason" in details:
            assert reason.reason == details["reason"], f"{key}: {reason.reason}: {reason.message}"
        if "message" in details:
            assert details["message"] in reason.message, f"{key}: {reason.message}"
        if "position" in details:
            assert reason.position_in_cluster_queue == details["position"], f"{key} position"
        if "localPosition" in details:
            assert reason.position_in_local_queue == details["localPosition"], key
        if "cause" in details:
            assert reason.cause == details["cause"], f"{key}: cause {reason.cause}"
        if "fragmentation" in details:
            _check_fragmentation(key, details["fragmentation"], reason.fragmentation)


def _check_fragmentation(key: str, want: dict[str, Any], got: Fragmentation | None) -> None:
    """``requested``, ``fleetFree``, ``largestFree`` (GPUs etc.) and ``largestIsland``."""
    assert got is not None, f"{key}: no fragmentation"
    numbers = {
        "requested": got.requested,
        "fleetFree": got.fleet_free,
        "largestFree": got.largest_free,
        "largestIsland": got.largest_island,
    }
    assert {k: numbers[k] for k in want} == want, f"{key}: fragmentation {numbers}"
