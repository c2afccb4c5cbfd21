"""Auditor queries: the SQL answers exactly what the in-memory specification
answers, for random filters over a random ledger, page after page."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from service.app.uow import SqlUnitOfWork
from service.ledger.chain import LedgerEntry
from service.ledger.entries import (
    Body,
    QuotaChanged,
    WorkloadAdmitted,
    WorkloadFinished,
    WorkloadPreempted,
    WorkloadSubmitted,
    new_entry,
)
from service.ledger.postgres import PostgresLedgerReader
from service.ledger.query import LedgerQuery, matches, page

T0 = datetime(2026, 11, 29, tzinfo=UTC)
NAMESPACES = ["team-a", "team-b", "team-c"]
FLAVORS = ["h100", "a100"]
CLUSTERS = ["c1", "c2"]


def random_body(rng: random.Random, i: int) -> Body:
    ns = rng.choice(NAMESPACES)
    q = {
        "namespace": ns,
        "workload": f"w{rng.randrange(20)}",
        "local_queue": f"{ns}-lq{rng.randrange(2)}",
        "cluster_queue": f"cq{rng.randrange(2)}",
    }
    amounts = {rng.choice(FLAVORS): {"nvidia.com/gpu": rng.randrange(1, 9)}}
    cluster = rng.choice(CLUSTERS)
    choice = i % 5
    if choice == 0:
        return WorkloadSubmitted(
            **q,
            actor=rng.choice(["alice", "bob"]),
            workload_class="training",
            priority=0,
            requests={},
        )
    if choice == 1:
        return WorkloadAdmitted(
            **q, cluster=cluster, flavors={}, island=None, reserved=amounts, borrowed={}, reason="r"
        )
    if choice == 2:
        return WorkloadPreempted(
            **q,
            cluster=cluster,
            reason="InClusterQueue",
            preemptor="team-a/x",
            preemptor_cluster_queue="cq0",
            cohort_path=[],
            released=amounts,
        )
    if choice == 3:
        return WorkloadFinished(
            **q,
            cluster=cluster,
            outcome="succeeded",
            started_at=T0,
            finished_at=T0,
            consumed={f: {r: a * 60.5 for r, a in v.items()} for f, v in amounts.items()},
            gpu_seconds=1.5,
            cpu_seconds=0.5,
            memory_gib_seconds=0.5,
        )
    return QuotaChanged(
        actor=rng.choice(["alice", "root"]),
        object_kind="ClusterQueue",
        name="cq0",
        before={},
        after={},
    )


@pytest.fixture
def ledger(engine: sa.Engine) -> list[LedgerEntry]:
    rng = random.Random(6)
    items = [
        new_entry(random_body(rng, i), uuid.uuid4(), T0 + timedelta(minutes=i)) for i in range(240)
    ]
    with SqlUnitOfWork(engine) as uow:
        stored = uow.record(items)
        uow.commit()
    return stored


def random_query(rng: random.Random) -> LedgerQuery:
    def maybe(values: list[str]) -> str | None:
        return rng.choice(values) if rng.random() < 0.35 else None

    since = T0 + timedelta(minutes=rng.randrange(240)) if rng.random() < 0.3 else None
    until = (
        since + timedelta(minutes=rng.randrange(1, 120)) if since and rng.random() < 0.5 else None
    )
    kinds = ("workload.admitted", "workload.preempted", "workload.finished", "quota.changed")
    return LedgerQuery(
        namespace=maybe(NAMESPACES),
        local_queue=maybe(["team-a-lq0", "team-b-lq1"]),
        cluster_queue=maybe(["cq0", "cq1"]),
        cluster=maybe(CLUSTERS),
        workload=maybe([f"w{i}" for i in range(5)]),
        actor=maybe(["alice", "root"]),
        flavor=maybe(FLAVORS),
        kinds=tuple(rng.sample(kinds, rng.randrange(0, 3))),
        since=since,
        until=until,
        newest_first=rng.random() < 0.3,
        limit=rng.choice([1, 7, 50, 1000]),
    )


def test_sql_pages_equal_the_specification(engine: sa.Engine, ledger: list[LedgerEntry]) -> None:
    reader = PostgresLedgerReader(engine)
    rng = random.Random(7)
    non_empty = 0
    for _ in range(120):
        query = random_query(rng)
        expected_all = [e for e in ledger if matches(e, query)]
        seen: list[LedgerEntry] = []
        cursor: LedgerQuery = query
        while True:
            got = reader.query(cursor)
            assert got == page(ledger, cursor)
            seen += got
            if len(got) < query.limit:
                break
            last = got[-1].seq
            cursor = LedgerQuery(
                **{
                    **{f: getattr(query, f) for f in query.__dataclass_fields__},
                    "after_seq": None if query.newest_first else last,
                    "before_seq": last if query.newest_first else None,
                }
            )
        expected = expected_all[::-1] if query.newest_first else expected_all
        assert seen == expected
        non_empty += bool(seen)
    assert non_empty > 30, "the random queries should mostly find something"


def test_each_filter_alone(engine: sa.Engine, ledger: list[LedgerEntry]) -> None:
    reader = PostgresLedgerReader(engine)
    for query in [
        LedgerQuery(namespace="team-b", limit=1000),
        LedgerQuery(flavor="a100", limit=1000),
        LedgerQuery(actor="root", limit=1000),
        LedgerQuery(kinds=("workload.finished",), limit=1000),
        LedgerQuery(since=T0 + timedelta(minutes=100), until=T0 + timedelta(minutes=110)),
    ]:
        got = reader.query(query)
        assert got and got == [e for e in ledger if matches(e, query)]
    flavored = reader.query(LedgerQuery(flavor="h100", limit=1000))
    assert {e.kind for e in flavored} == {
        "workload.admitted",
        "workload.preempted",
        "workload.finished",
    }


@pytest.mark.parametrize(
    "arguments",
    [{"limit": 0}, {"limit": 1001}, {"since": T0, "until": T0}],
)
def test_bad_queries_are_refused(arguments: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LedgerQuery(**arguments)  # type: ignore[arg-type]
