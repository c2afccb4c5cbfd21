"""Big gangs: head-of-line reservation and victims that spare island gangs (issue 24).

Tables of cases over two scenario files (``service.engine.reservation``;
``EngineConfig.spare_island_gangs``), each edited then decided in one cycle
(every invariant kept, deterministic); then replays of a small trace in which
a 16-GPU gang starves behind a stream of one-node jobs unless an island is
reserved for it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.engine import EngineConfig, ReservationConfig, admission_cycle
from sim.fleet import Fleet, fleet_from_mapping
from sim.replay import ReplayOptions, Simulator, TraceJob
from sim.replay.loop import fifo_options, single_queue_fleet
from tests.engine.invariants import violations
from tests.engine.scenario import SCENARIOS, build
from tests.engine.test_scenarios import check_expectations

Data = dict[str, Any]
BASE = "qm_reservation_gang_starts_before_backfill"
GPU = "nvidia.com/gpu"


def _reservation(**fields: Any) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        data["config"]["reservation"] = {"enable": True, **fields}

    return edit


def _off(data: Data) -> None:
    data["config"].pop("reservation")


def _pending(name: str, **fields: Any) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        next(w for w in data["pending"] if w["name"] == name).update(copy.deepcopy(fields))

    return edit


def _admit(name: str, node: str) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        data["admitted"].append(
            {
                "name": name,
                "clusterQueue": "small",
                "admittedAt": 500,
                "requests": {GPU: 8},
                "admission": {"cluster": "c1", "flavors": "h100", "nodes": {node: 1}},
            }
        )

    return edit


def _strict(queue: str) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        next(q for q in data["clusterQueues"] if q["name"] == queue)["queueingStrategy"] = (
            "StrictFIFO"
        )

    return edit


def _add_pending(name: str, queue: str, created: float) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        data["pending"].append(
            {"name": name, "clusterQueue": queue, "created": created, "requests": {GPU: 8}}
        )

    return edit


def _nominal(queue: str, gpus: int) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        spec = next(q for q in data["clusterQueues"] if q["name"] == queue)
        spec["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = gpus

    return edit


#: Without a reservation (or without one for this gang) s2 takes i0 and the gang waits.
BACKFILLED = {
    "admitted": {"s1": {"islands": ["c1-h100-i1"]}, "s2": {"islands": ["c1-h100-i0"]}},
    "preempted": [],
    "pending": {"gang": {"reason": "WaitingForCapacity"}},
}
RESERVED = {
    "admitted": {"s1": {"islands": ["c1-h100-i1"]}, "gang": {"islands": ["c1-h100-i0"]}},
    "preempted": [],
    "pending": {"s2": {"reason": "WaitingForCapacity"}},
}

CASES: list[tuple[str, list[Callable[[Data], None]], Data]] = [
    ("reserved-the-gang-starts-and-backfill-waits", [], RESERVED),
    ("off-backfill-breaks-the-island-the-gang-waits", [_off], BACKFILLED),
    ("gang-below-min-accelerators-no-reservation", [_reservation(minAccelerators=33)], BACKFILLED),
    (
        "gang-submitted-too-recently-no-reservation",
        [_reservation(minWaitSeconds=1001)],
        BACKFILLED,
    ),
    ("gang-waited-long-enough-reserved", [_reservation(minWaitSeconds=1000)], RESERVED),
    (
        # Higher priority than the gang: the reserved island is not held from them.
        "higher-priority-backfill-is-not-held-back",
        [_pending("s1", priority=5), _pending("s2", priority=5)],
        BACKFILLED,
    ),
    (
        # Its quota does not fit (the cohort's 48 GPUs less the 24 in use leave
        # 24 < 32): a reservation would only keep GPUs idle, so none is made.
        "gang-short-of-quota-no-reservation",
        [_nominal("big", 0), _nominal("small", 48)],
        {
            "admitted": {"s1": {"islands": ["c1-h100-i1"]}, "s2": {"islands": ["c1-h100-i0"]}},
            "preempted": [],
            "pending": {"gang": {"reason": "WaitingForQuota"}},
        },
    ),
    (
        # i0 has a job on one node: the gang cannot start now, but i0 (three of
        # its four pods fit) is held while it drains; s1 takes i1's last node
        # and s2 waits.
        "gang-cannot-fit-yet-its-island-is-held",
        [_admit("r3", "c1-h100-i0-n0")],
        {
            "admitted": {"s1": {"islands": ["c1-h100-i1"]}},
            "preempted": [],
            "pending": {
                "gang": {"reason": "WaitingForCapacity"},
                "s2": {"reason": "WaitingForCapacity"},
            },
        },
    ),
    (
        # Behind an older job of its StrictFIFO queue the gang is not the head:
        # no reservation (b0 goes first and takes i1's last node, s1 and s2
        # fill i0, the gang waits behind them).
        "strict-queue-reserves-for-its-head-alone",
        [_strict("big"), _add_pending("b0", "big", created=-10)],
        {
            "admitted": {
                "b0": {"islands": ["c1-h100-i1"]},
                "s1": {"islands": ["c1-h100-i0"]},
                "s2": {"islands": ["c1-h100-i0"]},
            },
            "preempted": [],
            "pending": {"gang": {"reason": "WaitingForCapacity"}},
        },
    ),
    (
        "gang-cannot-fit-yet-off-backfill-takes-its-island",
        [_admit("r3", "c1-h100-i0-n0"), _off],
        {
            "admitted": {"s1": {"islands": ["c1-h100-i1"]}, "s2": {"islands": ["c1-h100-i0"]}},
            "preempted": [],
            "pending": {"gang": {"reason": "WaitingForCapacity"}},
        },
    ),
]


@pytest.mark.parametrize(("name", "edits", "expect"), CASES, ids=[c[0] for c in CASES])
def test_case(name: str, edits: list[Callable[[Data], None]], expect: Data) -> None:
    data: Data = yaml.safe_load((SCENARIOS / f"{BASE}.yaml").read_text(encoding="utf-8"))
    for edit in edits:
        edit(data)
    data["expect"] = expect
    scenario = build(data, Path(f"{name}.yaml"))
    result = admission_cycle(scenario.snapshot, scenario.now)
    assert admission_cycle(scenario.snapshot, scenario.now) == result, "not deterministic"
    problems = violations(scenario.snapshot, result, scenario.now)
    assert not problems, problems
    check_expectations(scenario, result)


SPARE = "qm_spare_island_gang_reclaim_takes_small_borrower"


def _spare_off(data: Data) -> None:
    data["config"]["spareIslandGangs"] = False


def _checkpoint(name: str, at: float) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        next(w for w in data["admitted"] if w["name"] == name)["lastCheckpoint"] = at

    return edit


def _grace(data: Data, queue: str, seconds: int) -> None:
    """``islandGangGraceSeconds`` of ClusterQueue ``queue``."""
    found = next(q for q in data["clusterQueues"] if q["name"] == queue)
    found["preemption"]["protection"] = {"islandGangGraceSeconds": seconds}


def _protect_for(seconds: int) -> Callable[[Data], None]:
    """The borrower's gangs protected until their preemptor has been queued
    ``seconds``; sparing off."""

    def edit(data: Data) -> None:
        data["config"] = {}
        _grace(data, "borrower", seconds)

    return edit


def _lender_grace(seconds: int) -> Callable[[Data], None]:
    return lambda data: _grace(data, "lender", seconds)


#: A grace longer than any wait here: protection for as long as the gang runs.
_protect = _protect_for(366 * 24 * 3600)


def _only_the_gang_borrows(data: Data) -> None:
    """The borrower runs only its gang (32 of a nominal 24); the lender 24 of its
    32 on i1, whose last node is free: the cohort's 56 GPUs are all in use."""
    data["admitted"] = [w for w in data["admitted"] if w["name"] == "gang"]
    for n in range(3):
        data["admitted"].append(
            {
                "name": f"l{n}",
                "clusterQueue": "lender",
                "admittedAt": 500,
                "requests": {GPU: 8},
                "admission": {
                    "cluster": "c1",
                    "flavors": "h100",
                    "nodes": {f"c1-h100-i1-n{n}": 1},
                },
            }
        )
    _nominal("borrower", 24)(data)


def _lender_asks(gpus: int, count: int = 1, **fields: Any) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        data["pending"][0].update(requests={GPU: gpus}, count=count, **fields)

    return edit


SPARE_CASES: list[tuple[str, list[Callable[[Data], None]], Data]] = [
    (
        "spared-a-small-borrower-goes",
        [],
        {"admitted": ["in"], "preempted": [{"workload": "s3", "reason": "InCohortReclamation"}]},
    ),
    (
        # Kueue's order and least work per GPU: the gang saved 100 s ago goes.
        "off-the-gang-goes",
        [_spare_off],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
    (
        # As big as the preemptor: nothing to spare, the gang goes as before.
        "preemptor-as-big-as-the-gang-takes-it",
        [_lender_asks(8, count=4, topology={"required": "example.com/block"})],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
    (
        # Among the others the work destroyed still decides: s1 saved its work
        # a second ago and goes instead of s3.
        "spared-the-least-at-risk-small-one-goes",
        [_checkpoint("s1", 999)],
        {"admitted": ["in"], "preempted": [{"workload": "s1", "reason": "InCohortReclamation"}]},
    ),
]


SPARE_CASES += [
    (
        # Protected, not merely last: a small borrower still goes first ...
        "protected-a-small-borrower-goes",
        [_protect],
        {"admitted": ["in"], "preempted": [{"workload": "s3", "reason": "InCohortReclamation"}]},
    ),
    (
        # ... and when the gang is the only victim that frees quota, the lender waits.
        "protected-the-only-borrower-is-the-gang-the-lender-waits",
        [_protect, _only_the_gang_borrows],
        {"admitted": [], "preempted": [], "pending": {"in": {"reason": "WaitingForQuota"}}},
    ),
    (
        "unprotected-the-only-borrower-is-the-gang-it-goes",
        [_only_the_gang_borrows, _spare_off],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
    (
        # Spared (last) is not protected: with no other candidate the gang goes.
        "spared-the-only-borrower-is-the-gang-it-goes",
        [_only_the_gang_borrows],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
    (
        # A preemptor of higher priority is not held back.
        "protected-a-higher-priority-preemptor-takes-the-gang",
        [_protect, _only_the_gang_borrows, _lender_asks(8, priority=10)],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
    (
        # The grace is the victim's ClusterQueue's: set on the lender's, it protects nothing.
        "a-grace-of-the-lenders-queue-protects-nothing",
        [_spare_off, _only_the_gang_borrows, _lender_grace(366 * 24 * 3600)],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
    (
        # Protection that lapses: the lender, queued 100 s ago, waits under 161 s ...
        "protected-for-longer-than-the-lender-waited-it-waits",
        [_protect_for(161), _only_the_gang_borrows],
        {
            "admitted": [],
            "preempted": [],
            "pending": {
                "in": {
                    "reason": "WaitingForQuota",
                    # It is told why, and for how long: 161 - 100 s waited.
                    "message": "islandGangGraceSeconds of island gangs in borrower: "
                    "the first lapses in 61 s",
                }
            },
        },
    ),
    (
        # ... and takes the gang once it has waited the 100 s ...
        "protection-lapsed-the-lender-takes-the-gang",
        [_protect_for(100), _only_the_gang_borrows],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
    (
        # ... and once lapsed the gang is a candidate like any other: with small
        # borrowers beside it, least work destroyed per GPU takes it first.
        "protection-lapsed-kueue-order-the-gang-goes",
        [_protect_for(0)],
        {"admitted": ["in"], "preempted": [{"workload": "gang", "reason": "InCohortReclamation"}]},
    ),
]


@pytest.mark.parametrize(("name", "edits", "expect"), SPARE_CASES, ids=[c[0] for c in SPARE_CASES])
def test_spare_case(name: str, edits: list[Callable[[Data], None]], expect: Data) -> None:
    data: Data = yaml.safe_load((SCENARIOS / f"{SPARE}.yaml").read_text(encoding="utf-8"))
    for edit in edits:
        edit(data)
    data["expect"] = expect
    scenario = build(data, Path(f"{name}.yaml"))
    result = admission_cycle(scenario.snapshot, scenario.now)
    assert admission_cycle(scenario.snapshot, scenario.now) == result, "not deterministic"
    problems = violations(scenario.snapshot, result, scenario.now)
    assert not problems, problems
    check_expectations(scenario, result)


def _fleet() -> Fleet:
    """One cluster of two islands of two 8-GPU nodes, one team."""
    return fleet_from_mapping(
        {
            "topologies": [{"name": "fabric", "levels": ["example.com/block"]}],
            "resourceFlavors": [{"name": "gpu", "topologyName": "fabric"}],
            "clusters": [
                {
                    "name": "c1",
                    "nodeGroups": [
                        {
                            "flavor": "gpu",
                            "islands": 2,
                            "nodesPerIsland": 2,
                            "allocatable": {GPU: 8},
                        }
                    ],
                }
            ],
            "clusterQueues": [
                {
                    "name": "team",
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": [GPU],
                            "flavors": [
                                {"name": "gpu", "resources": [{"name": GPU, "nominalQuota": 32}]}
                            ],
                        }
                    ],
                }
            ],
            "localQueues": [{"namespace": "team", "name": "jobs", "clusterQueue": "team"}],
        }
    )


def _starving_trace() -> list[TraceJob]:
    """Four one-node jobs ending 300 s apart, a 16-GPU gang, then one-node jobs
    submitted every 300 s: whenever a node frees, one is waiting for it, and no
    island is ever wholly free."""
    jobs = [TraceJob(f"fill{i}", 0, 600 + 300 * i, 8) for i in range(4)]
    jobs.append(TraceJob("gang", 10, 1000, 16))
    jobs.extend(TraceJob(f"s{i:02d}", 20 + 300 * i, 1200, 8) for i in range(40))
    return jobs


def _gang_start(reservation: ReservationConfig) -> tuple[float, dict[str, Any]]:
    options = fifo_options(ReplayOptions(cycle_interval=60))
    options = replace(options, engine=replace(options.engine, reservation=reservation))
    simulator = Simulator(single_queue_fleet(_fleet()), _starving_trace(), options)
    result = simulator.run()
    return simulator.stats.first_admission["gang"], result


def test_a_gang_that_starves_behind_backfill_starts_with_a_reservation() -> None:
    without, plain = _gang_start(EngineConfig().reservation)
    with_it, reserved = _gang_start(ReservationConfig(enable=True, min_accelerators=16))
    for result in (plain, reserved):
        assert result["completed"] == len(_starving_trace())
        assert result["island_violations"] == result["capacity_violations"] == 0
    # Without: every freed node goes to a waiting one-node job; the gang starts
    # only when the stream has dried up (the last is submitted at 11,720 s).
    assert without > 11_720
    # With: the first island to drain is held; the gang starts when its second
    # node ends (fill1, at 900 s), at the next cycle.
    assert with_it <= 960
    # A gang smaller than the threshold gets no reservation.
    too_small, _ = _gang_start(ReservationConfig(enable=True, min_accelerators=17))
    assert too_small == without
