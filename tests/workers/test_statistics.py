"""Planner statistics kept up with fast-growing tables (workers/statistics.py),
against the real Postgres: its statistics views, ANALYZE and plan cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from workers.leader import psycopg_url
from workers.statistics import StatisticsKeeper


@pytest.fixture
def probe(engine: sa.Engine) -> Iterator[str]:
    """A table of our own in the test database, analyzed while it held 10 rows."""
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS stats_probe"))
        conn.execute(sa.text("CREATE TABLE stats_probe (id uuid PRIMARY KEY, kind text NOT NULL)"))
        conn.execute(sa.text("CREATE INDEX ix_stats_probe_kind ON stats_probe (kind)"))
    _grow(engine, 10, "seed")
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE stats_probe"))
    yield "stats_probe"
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE stats_probe"))


def _grow(engine: sa.Engine, rows: int, kind: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO stats_probe "
                "SELECT gen_random_uuid(), :kind FROM generate_series(1, :n)"
            ),
            {"kind": kind, "n": rows},
        )
        # Statistics counters reach the shared views when a backend flushes
        # them (at most once a second); this transaction's end flushes.
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))


def _analyses(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables "
                    "WHERE relname = 'stats_probe'"
                )
            ).scalar_one()
        )


def _mine(done: list[Any]) -> list[str]:
    return [a.table for a in done if a.table == "stats_probe"]


def test_a_table_that_outgrew_its_statistics_is_analyzed_once(
    engine: sa.Engine, probe: str
) -> None:
    keeper = StatisticsKeeper(engine, floor=1000)
    before = _analyses(engine)
    _grow(engine, 5000, "grown")
    done = keeper.step()
    assert _mine(done) == [probe]
    grown = next(a for a in done if a.table == probe)
    assert grown.rows_then == 10 and grown.changed == 5000
    assert _analyses(engine) == before + 1
    assert _mine(keeper.step()) == []  # current now
    assert _analyses(engine) == before + 1


def test_small_or_proportionate_changes_are_left_to_autovacuum(
    engine: sa.Engine, probe: str
) -> None:
    keeper = StatisticsKeeper(engine, floor=1000)
    _grow(engine, 500, "few")  # more than the 10 rows analyzed, under the floor
    assert _mine(keeper.step()) == []
    _grow(engine, 3000, "more")
    assert _mine(keeper.step()) == [probe]
    _grow(engine, 2000, "again")  # 2,000 changed since it held 3,510: not stale
    assert _mine(keeper.step()) == []


def test_a_cached_plan_from_the_empty_table_is_replaced(engine: sa.Engine, probe: str) -> None:
    """The reason it exists: a session that prepared a lookup while the table
    was small keeps its generic plan, a scan of every row, however large the
    table grows, until the table is analyzed."""
    query = "SELECT id FROM stats_probe WHERE kind = %(kind)s AND id = ANY(%(ids)s)"
    with psycopg.connect(psycopg_url(engine), prepare_threshold=0, autocommit=True) as session:
        for _ in range(10):  # custom plans first, then Postgres settles on a generic one
            session.execute(query, {"kind": "seed", "ids": []})
        _grow(engine, 20000, "grown")

        def plan() -> str:
            rows = session.execute(f"EXPLAIN EXECUTE {_prepared(session)}('grown', '{{}}')")
            return "\n".join(r[0] for r in rows)

        assert "Seq Scan on stats_probe" in plan()
        StatisticsKeeper(engine).step()
        assert "Index Scan using stats_probe_pkey" in plan()


def _prepared(session: psycopg.Connection[Any]) -> str:
    """The server-side name psycopg prepared the lookup under."""
    names = [
        r[0]
        for r in session.execute(
            "SELECT name FROM pg_prepared_statements "
            "WHERE statement LIKE 'SELECT id FROM stats_probe%%'",
            prepare=False,
        )
    ]
    assert len(names) == 1, names
    return str(names[0])
