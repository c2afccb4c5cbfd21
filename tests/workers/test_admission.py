"""The admission cycle's application side, in process: read models in,
events + read models + ledger out, in one transaction."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import sqlalchemy as sa

from service.app.admission import PENDING_MESSAGE_REFRESH, AdmissionCycle
from service.app.admission.snapshot import load
from service.app.auth import Principal, Role
from service.app.bootstrap import Services
from service.app.events import EventFilter
from service.app.uow import SqlUnitOfWork
from service.app.visibility import ANOTHER
from service.engine import ConsolidationConfig, EngineConfig, PreemptionBudgetState
from service.projections import ProjectionRunner, Resources
from service.projections.resources import resource_row, upsert_resources
from tests.workers.conftest import (
    ADMIN,
    GPU,
    ledger_kinds,
    setup_fleet,
    setup_nodes,
    workload,
    workload_status,
)


def _no_guard(uow: SqlUnitOfWork) -> None:
    return None


def _cycle(services: Services) -> AdmissionCycle:
    return AdmissionCycle(services.engine, services.unit_of_work)


def test_admits_within_quota_and_explains_the_rest(services: Services) -> None:
    setup_fleet(services, gpu_quota=16)
    for name in ("a", "b", "c"):
        services.submissions.submit(ADMIN, "team-a", workload(name, count=1, gpus=8))
    report = _cycle(services).run(_no_guard)
    assert report.writes.admitted == 2
    admitted = [workload_status(services.engine, "team-a", n) for n in ("a", "b")]
    for status in admitted:
        assert status["state"] == "Admitted"
        assert status["admission"]["cluster"] == "c1"
        (assignment,) = status["admission"]["podSetAssignments"]
        assert assignment["flavors"][GPU] == "h100"
        assert assignment["resourceUsage"][GPU] == "8"
        assert sum(p["count"] for p in assignment["placement"]) == 1
        assert "pendingReason" not in status
    explained = services.submissions.explain(ADMIN, "team-a", "c")
    assert explained["state"] == "Pending"
    assert "quota" in explained["waitingFor"].lower(), explained
    assert (
        explained["reason"] == workload_status(services.engine, "team-a", "c")["pendingReasonCode"]
    )
    assert ledger_kinds(services.engine) == ["workload.admitted"] * 2
    # An unchanged world: the next cycle writes nothing at all.
    again = _cycle(services).run(_no_guard)
    assert again.writes.appends == [] and again.writes.ledger == []


def test_a_gang_that_asks_for_an_island_lands_in_one(services: Services) -> None:
    setup_fleet(services, gpu_quota=64, islands=2, nodes_per_island=2)
    services.submissions.submit(ADMIN, "team-a", workload("small", count=1, gpus=8))
    services.submissions.submit(ADMIN, "team-a", workload("gang", count=2, gpus=8, island=True))
    services.submissions.submit(ADMIN, "team-a", workload("huge", count=3, gpus=8, island=True))
    _cycle(services).run(_no_guard)
    gang = workload_status(services.engine, "team-a", "gang")["admission"]
    assert gang["island"] is not None
    assert {p["node"].rsplit("-", 1)[0] for p in gang["podSetAssignments"][0]["placement"]} == {
        gang["island"]
    }
    huge = workload_status(services.engine, "team-a", "huge")
    assert huge["state"] == "Pending"  # 3 nodes of one island: there are only 2 per island
    assert huge["pendingReason"]


def test_preemption_evicts_the_whole_victim_with_reason_and_preemptor(
    services: Services,
) -> None:
    setup_fleet(services, gpu_quota=16, preemption={"withinClusterQueue": "LowerPriority"})
    services.resources.create(
        ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000}
    )
    services.submissions.submit(ADMIN, "team-a", workload("low", count=2, gpus=8))
    _cycle(services).run(_no_guard)
    assert workload_status(services.engine, "team-a", "low")["state"] == "Admitted"
    services.submissions.submit(
        ADMIN, "team-a", workload("high", count=2, gpus=8, priorityClassName="urgent")
    )
    report = _cycle(services).run(_no_guard)
    assert (report.writes.preempted, report.writes.admitted) == (1, 1)
    victim = workload_status(services.engine, "team-a", "low")
    assert victim["state"] == "Evicted"
    assert "admission" not in victim
    assert victim["eviction"]["reason"] == "Preempted"
    assert victim["eviction"]["preemptor"] == "team-a/high"
    assert victim["eviction"]["cluster"] == "c1"
    high = workload_status(services.engine, "team-a", "high")
    assert high["state"] == "Admitted"
    assert high["admission"]["preempted"] == ["team-a/low"]
    assert ledger_kinds(services.engine)[-2:] == ["workload.preempted", "workload.admitted"]
    with services.engine.connect() as conn:
        body = conn.exec_driver_sql(
            "SELECT body FROM ledger_entries WHERE kind = 'workload.preempted'"
        ).scalar_one()
    assert body["preemptor"] == "team-a/high"
    assert body["reason"] == "InClusterQueue"
    assert body["released"] == {"h100": {"cpu": 16000, "memory": 2 * 64 * 2**30, GPU: 16}}


def test_a_preemption_across_namespaces_names_neither_side_to_the_other(
    services: Services,
) -> None:
    """Each team's submitter reads its own workload's preemption with the
    other namespace's workload unnamed, in the object, its messages and the
    events; an admin reads both names."""
    setup_fleet(
        services,
        gpu_quota=16,
        namespaces=("team-a", "team-b"),
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    services.resources.create(
        ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000}
    )
    services.submissions.submit(ADMIN, "team-b", workload("low", count=2, gpus=8))
    _cycle(services).run(_no_guard)
    services.submissions.submit(
        ADMIN, "team-a", workload("high", count=2, gpus=8, priorityClassName="urgent")
    )
    assert _cycle(services).run(_no_guard).writes.preempted == 1

    def reader(namespace: str) -> Principal:
        return Principal(f"sub-{namespace}", frozenset({Role.SUBMITTER}), frozenset({namespace}))

    def read(principal: Principal, namespace: str, name: str) -> str:
        obj = services.resources.get(principal, "workloads", namespace, name)
        events = services.event_queries.after(principal, 0, EventFilter(workload=name), 1000)
        return json.dumps([obj, events])

    admin = ADMIN.principal
    assert "team-b/low" in read(admin, "team-a", "high")
    assert "team-a/high" in read(admin, "team-b", "low")
    theirs = read(reader("team-a"), "team-a", "high")
    assert "team-b" not in theirs and ANOTHER in theirs
    victims = read(reader("team-b"), "team-b", "low")
    assert "team-a" not in victims and ANOTHER in victims
    (listed,) = services.resources.list(reader("team-b"), "workloads", "team-b").items
    assert listed["status"]["eviction"]["preemptor"] == ANOTHER


def test_a_workload_changed_under_the_cycle_rolls_the_whole_cycle_back(
    services: Services,
) -> None:
    setup_fleet(services, gpu_quota=16)
    services.submissions.submit(ADMIN, "team-a", workload("a"))
    services.submissions.submit(ADMIN, "team-a", workload("b"))
    cycle = _cycle(services)

    def cancel_first(uow: SqlUnitOfWork) -> None:
        services.submissions.cancel(ADMIN, "team-a", "b")

    try:
        cycle.run(cancel_first)
    except Exception as error:
        assert type(error).__name__ == "ConcurrencyConflict"
    else:
        raise AssertionError("the stale cycle committed")
    assert workload_status(services.engine, "team-a", "a")["state"] == "Pending"
    assert ledger_kinds(services.engine) == []
    cycle.run(_no_guard)
    assert workload_status(services.engine, "team-a", "a")["state"] == "Admitted"
    assert workload_status(services.engine, "team-a", "b")["state"] == "Cancelled"


def test_read_models_rebuilt_from_the_log_equal_the_live_ones(services: Services) -> None:
    setup_fleet(services, gpu_quota=8)
    services.submissions.submit(ADMIN, "team-a", workload("a"))
    services.submissions.submit(ADMIN, "team-a", workload("b"))
    _cycle(services).run(_no_guard)
    query = sa.text(
        "SELECT kind, namespace, name, resource_version, spec, status FROM resources "
        "ORDER BY kind, namespace, name"
    )
    with services.engine.connect() as conn:
        live = conn.execute(query).all()
    ProjectionRunner(services.engine, [Resources()]).rebuild("resources")
    with services.engine.connect() as conn:
        rebuilt = conn.execute(query).all()
    assert rebuilt == live
    assert {r.status.get("state") for r in live if r.kind == "Workload"} == {"Admitted", "Pending"}


def test_an_unreadable_workload_is_left_out_not_fatal(services: Services) -> None:
    setup_fleet(services, gpu_quota=16)
    services.submissions.submit(ADMIN, "team-a", workload("good"))
    broken = {
        "kind": "Workload",
        "namespace": "team-a",
        "name": "broken",
        "uid": str(uuid4()),
        "spec": {"podSets": [{"count": "many"}]},  # no queueName, no template
        "status": {"state": "Pending"},
        "created_at": datetime.now(UTC).isoformat(),
    }
    with services.engine.begin() as conn:
        upsert_resources(conn, [resource_row(broken, 1, datetime.now(UTC))])
    cycle = _cycle(services)
    report = cycle.run(_no_guard)
    assert report.writes.admitted == 1
    assert workload_status(services.engine, "team-a", "good")["state"] == "Admitted"
    assert cycle.run(_no_guard).pending == 0


def test_the_same_pending_reason_in_other_numbers_is_rewritten_at_most_every_30_s(
    services: Services,
) -> None:
    """Kueue's "N more needed" changes with every admission and completion
    around a pending gang; the reason itself is written at once, its numbers
    refreshed at most every ``PENDING_MESSAGE_REFRESH`` seconds."""
    setup_fleet(services, gpu_quota=16)
    t0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    clock = [t0]
    cycle = AdmissionCycle(services.engine, services.unit_of_work, clock=lambda: clock[0])
    for name, gpus in (("a", 8), ("b", 4)):
        services.submissions.submit(ADMIN, "team-a", workload(name, count=1, gpus=gpus))
    assert cycle.run(_no_guard).writes.admitted == 2
    services.submissions.submit(ADMIN, "team-a", workload("c", count=2, gpus=8))
    assert cycle.run(_no_guard).writes.pending_changed == 1
    first = workload_status(services.engine, "team-a", "c")
    assert first["pendingReasonAt"] == "2026-11-30T12:00:00Z"
    with services.engine.begin() as conn:  # b finishes: 4 more GPUs free, the same reason
        conn.execute(
            sa.text(
                'UPDATE resources SET status = status || \'{"state": "Finished"}\', '
                "resource_version = resource_version + 1 WHERE kind = 'Workload' AND name = 'b'"
            )
        )
    clock[0] = t0 + timedelta(seconds=5)
    assert cycle.run(_no_guard).writes.pending_changed == 0
    assert (
        workload_status(services.engine, "team-a", "c")["pendingReason"] == first["pendingReason"]
    )
    clock[0] = t0 + timedelta(seconds=PENDING_MESSAGE_REFRESH + 1)
    assert cycle.run(_no_guard).writes.pending_changed == 1
    later = workload_status(services.engine, "team-a", "c")
    assert later["pendingReasonCode"] == first["pendingReasonCode"]
    assert later["pendingReason"] != first["pendingReason"]
    assert later["pendingReasonAt"] == "2026-11-30T12:00:31Z"


def test_a_consolidation_move_reaches_the_ledger_and_its_budget_outlives_the_cycle(
    services: Services,
) -> None:
    """Issue 24, end to end through the application: two islands half used by
    low-priority gangs, a 16-GPU gang that must stay in one island; with
    consolidation on, one victim is preempted with reason ``Consolidation``,
    its preemptor and the GPU-seconds it loses in the ledger, and the budget's
    token it took is there again for a scheduler that starts afresh."""
    budget = {"preemptions": 2, "periodSeconds": 3600}
    setup_fleet(services, gpu_quota=64, nodes_per_island=1, preemption={"budget": budget})
    services.resources.create(
        ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000}
    )
    clock = [datetime(2026, 1, 1, tzinfo=UTC)]
    config = EngineConfig(consolidation=ConsolidationConfig(enable=True))
    cycle = AdmissionCycle(services.engine, services.unit_of_work, config, lambda: clock[0])
    for name in ("a", "b"):
        services.submissions.submit(ADMIN, "team-a", workload(name, count=1, gpus=8))
    cycle.run(_no_guard)
    # One node an island: each gang has an island of its own.
    islands = {
        workload_status(services.engine, "team-a", n)["admission"]["podSetAssignments"][0][
            "placement"
        ][0]["node"]
        for n in ("a", "b")
    }
    assert islands == {"c1-i0-n0", "c1-i1-n0"}, islands
    # The islands grow to two nodes: each is half used, 16 GPUs free, 8 in each.
    setup_nodes(services, islands=2, nodes_per_island=2)
    clock[0] += timedelta(seconds=600)
    services.submissions.submit(
        ADMIN,
        "team-a",
        workload("gang", count=2, gpus=8, island=True, priorityClassName="urgent"),
    )
    report = cycle.run(_no_guard)
    assert (report.writes.preempted, report.writes.admitted) == (1, 1)
    with services.engine.connect() as conn:
        (body,) = conn.exec_driver_sql(
            "SELECT body FROM ledger_entries WHERE kind = 'workload.preempted'"
        ).scalars()
    assert body["reason"] == "Consolidation"
    assert body["preemptor"] == "team-a/gang"
    assert body["work_destroyed_gpu_seconds"] == 600 * 8
    assert body["budgeted"] is True
    victim = workload_status(services.engine, "team-a", body["workload"])
    assert victim["eviction"]["preemptionReason"] == "Consolidation"
    assert workload_status(services.engine, "team-a", "gang")["state"] == "Admitted"
    left = {"cq": PreemptionBudgetState(tokens=1.0, last_update=clock[0].timestamp())}
    assert cycle.budgets == left
    # A scheduler that starts afresh derives the same bucket from the ledger.
    assert load(services.engine, config, {}).snapshot.preemption_budgets == left
