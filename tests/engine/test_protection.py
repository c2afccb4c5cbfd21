"""Protection and consolidation, as tables of cases over two base scenarios (issue 24).

Each case edits a copy of a scenario file (``tests/engine/scenarios``): the
ClusterQueue's ``preemption.protection`` / ``budget``, the clock, the buckets
left by the last cycle; then one cycle must give what ``expect`` says, keep
every invariant (``tests.engine.invariants``), and be deterministic.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.engine import admission_cycle
from tests.engine.invariants import apply, violations
from tests.engine.scenario import SCENARIOS, build, key_of
from tests.engine.test_scenarios import check_expectations

Data = dict[str, Any]


def _base(name: str) -> Data:
    data: Data = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text(encoding="utf-8"))
    return data


def _queue(data: Data, name: str) -> Data:
    queue: Data = next(q for q in data["clusterQueues"] if q["name"] == name)
    return queue


def _protect(queue: str, **fields: Any) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        _queue(data, queue).setdefault("preemption", {})["protection"] = fields

    return edit


def _budget(queue: str, preemptions: int, period: int) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        preemption = _queue(data, queue).setdefault("preemption", {})
        preemption["budget"] = {"preemptions": preemptions, "periodSeconds": period}

    return edit


def _set(**fields: Any) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        data.update(copy.deepcopy(fields))

    return edit


def _admitted_at(at: float) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        for wl in data["admitted"]:
            wl["admittedAt"] = at

    return edit


MOVED = {
    "admitted": {"gang": {"cluster": "c2", "islands": ["c2-h100-i0"]}},
    "preempted": [
        {"workload": "c0", "reason": "Consolidation", "preemptor": "gang"},
        {"workload": "c1", "reason": "Consolidation", "preemptor": "gang"},
    ],
}
WAITS = {
    "admitted": [],
    "preempted": [],
    "pending": {"gang": {"reason": "WaitingForCapacity", "cause": "FragmentedAcrossIslands"}},
}

CASES: list[tuple[str, str, list[Callable[[Data], None]], Data]] = [
    (
        "min-runtime-not-passed-the-move-waits",
        "qm_consolidation_admits_64_gang",
        [_protect("team", minRuntimeSeconds=3600), _admitted_at(8000), _set(now=11000)],
        WAITS,
    ),
    (
        "min-runtime-passed-the-move-is-made",
        "qm_consolidation_admits_64_gang",
        [_protect("team", minRuntimeSeconds=3600), _admitted_at(8000), _set(now=11600)],
        MOVED,
    ),
    (
        "budget-spent-the-move-waits-for-the-next-token",
        "qm_consolidation_admits_64_gang",
        [
            _budget("team", preemptions=2, period=3600),
            _set(preemptionBudgets={"team": {"tokens": 1.5, "lastUpdate": 10000}}),
        ],
        {**WAITS, "preemptionBudgets": {"team": 1.5}},
    ),
    (
        "budget-refilled-the-move-is-made-and-charged",
        "qm_consolidation_admits_64_gang",
        [
            _budget("team", preemptions=2, period=3600),
            # 900 s later the bucket holds 1.5 + 900 * 2 / 3600 = 2 tokens: one per victim.
            _set(now=10900, preemptionBudgets={"team": {"tokens": 1.5, "lastUpdate": 10000}}),
        ],
        {
            **MOVED,
            "preempted": [{**p, "budgeted": True} for p in MOVED["preempted"]],
            "preemptionBudgets": {"team": 0.0},
        },
    ),
    (
        "budget-never-charged-is-full",
        "qm_consolidation_admits_64_gang",
        [_budget("team", preemptions=2, period=3600)],
        {**MOVED, "preemptionBudgets": {"team": 0.0}},
    ),
    (
        "nominal-reclaim-stays-immediate-under-min-runtime",
        "up_reclaim_from_borrower",
        [_protect("c2", minRuntimeSeconds=3600), _set(now=1000), _admitted_at(900)],
        {
            "admitted": ["in"],
            "preempted": [{"workload": "c2-mid", "reason": "InCohortReclamation"}],
        },
    ),
    (
        "nominal-reclaim-protected-takes-the-unprotected-victim",
        "up_reclaim_from_borrower",
        [
            _protect("c2", minRuntimeSeconds=3600, reclaimNominal="Protected"),
            _set(now=1000),
            _admitted_at(900),
        ],
        {"admitted": ["in"], "preempted": [{"workload": "c1-low", "reason": "InClusterQueue"}]},
    ),
    (
        "budget-of-the-victims-queue-is-not-charged-by-nominal-reclaim",
        "up_reclaim_from_borrower",
        [
            _budget("c2", preemptions=1, period=3600),
            _set(preemptionBudgets={"c2": {"tokens": 0.0, "lastUpdate": 1000}}),
        ],
        {
            "admitted": ["in"],
            "preempted": [
                {"workload": "c2-mid", "reason": "InCohortReclamation", "budgeted": False}
            ],
            "preemptionBudgets": {"c2": 0.0},
        },
    ),
]


@pytest.mark.parametrize(("name", "base", "edits", "expect"), CASES, ids=[c[0] for c in CASES])
def test_case(name: str, base: str, edits: list[Callable[[Data], None]], expect: Data) -> None:
    data = _base(base)
    for edit in edits:
        edit(data)
    data["expect"] = expect
    scenario = build(data, Path(f"{name}.yaml"))
    result = admission_cycle(scenario.snapshot, scenario.now)
    assert admission_cycle(scenario.snapshot, scenario.now) == result, "not deterministic"
    problems = violations(scenario.snapshot, result, scenario.now)
    assert not problems, problems
    check_expectations(scenario, result)


def test_a_fresh_checkpoint_goes_before_none_inside_the_island() -> None:
    """One island can be emptied; of its two equal gangs, the one that saved a
    minute ago is moved, though it is the older (newest-first would take the other)."""
    data = _base("qm_consolidation_admits_64_gang")
    # Higher-priority gangs fill c2's islands and 48 GPUs of c1-i1: only c1-i0
    # (16 GPUs in use by a0 and a1) can be emptied enough, and the victim fits
    # again in c1-i1's 16 free GPUs.
    data["admitted"] = [
        *(wl for wl in data["admitted"] if wl["name"] in ("a0", "a1")),
        *_fillers({"c1-h100-i1": 6, "c2-h100-i0": 8, "c2-h100-i1": 8}),
    ]
    data["admitted"][0]["lastCheckpoint"] = 9940
    data["admitted"][1]["admittedAt"] = 5000
    # 56 GPUs needed, 48 free in c1-i0: one of a0 and a1 must go.
    data["pending"][0]["count"] = 7
    data["expect"] = {
        "admitted": {"gang": {"cluster": "c1", "islands": ["c1-h100-i0"]}},
        "preempted": [{"workload": "a0", "reason": "Consolidation", "workDestroyed": 480}],
    }
    scenario = build(data)
    result = admission_cycle(scenario.snapshot, scenario.now)
    assert not violations(scenario.snapshot, result, scenario.now)
    check_expectations(scenario, result)


def _gang(name: str, cluster: str, node: str) -> Data:
    return {
        "name": name,
        "clusterQueue": "team",
        "priority": 20,
        "admittedAt": 1000,
        "requests": {"nvidia.com/gpu": 8},
        "admission": {"cluster": cluster, "flavors": "h100", "nodes": {node: 1}},
    }


def _fillers(nodes: dict[str, int]) -> list[Data]:
    """Higher-priority 8-GPU gangs on the first ``nodes[island]`` nodes of each island."""
    return [
        _gang(f"f-{island}-{n}", island.split("-")[0], f"{island}-n{n}")
        for island, count in nodes.items()
        for n in range(count)
    ]


def test_the_victims_run_again_elsewhere_in_the_next_cycle() -> None:
    """The move of the base scenario, then the next cycle: both victims are
    admitted again at once, outside the gang's island, with no further move."""
    scenario = build(_base("qm_consolidation_admits_64_gang"))
    first = admission_cycle(scenario.snapshot, scenario.now)
    moved = {p.workload for p in first.preemptions}
    assert moved == {key_of("c0"), key_of("c1")}
    running = apply(scenario.snapshot, first, scenario.now)
    requeued = tuple(
        dataclasses.replace(a.workload, queued_at=scenario.now)
        for a in scenario.snapshot.admitted
        if a.workload.key in moved
    )
    later = scenario.now + 60
    second_snapshot = dataclasses.replace(
        scenario.snapshot, admitted=tuple(running), pending=requeued
    )
    second = admission_cycle(second_snapshot, later)
    assert not violations(second_snapshot, second, later)
    assert second.preemptions == ()
    again = {d.workload: d.admission for d in second.admissions}
    assert set(again) == moved
    for admission in again.values():
        islands = {i for ps in admission.pod_set_assignments for i in ps.islands}
        assert "c2-h100-i0" not in islands
