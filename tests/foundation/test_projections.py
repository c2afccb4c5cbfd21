"""Tracking projections: exactly-once, resumable, and rebuilt equal to live."""

from __future__ import annotations

import random
import subprocess
import sys

import sqlalchemy as sa

from service.eventstore.postgres import PostgresEventStore
from service.projections import ProjectionRunner, StreamIndex
from tests.eventstore.contract import new, run_released_together

SNAPSHOT = (
    "SELECT stream, category, version, last_type, last_position FROM stream_index ORDER BY stream"
)


def snapshot(engine: sa.Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.exec_driver_sql(SNAPSHOT)]


def random_history(engine: sa.Engine, runner: ProjectionRunner, seed: int) -> None:
    """Appends to many streams while the projection catches up now and then."""
    rng, store = random.Random(seed), PostgresEventStore(engine)
    versions: dict[str, int] = {}
    for step in range(300):
        stream = f"{rng.choice(['workload', 'clusterqueue', 'cohort'])}-{rng.randrange(20)}"
        store.append(
            stream, versions.get(stream, 0), [new(rng.choice(["Created", "Changed"]), step=step)]
        )
        versions[stream] = versions.get(stream, 0) + 1
        if rng.random() < 0.05:
            runner.catch_up("stream_index")


def test_rebuilt_projection_equals_the_live_one(engine: sa.Engine) -> None:
    runner = ProjectionRunner(engine, [StreamIndex()], batch_size=37)
    random_history(engine, runner, seed=1)
    runner.catch_up("stream_index")
    live = snapshot(engine)
    assert len(live) > 20 and runner.position("stream_index") == 300

    rebuilt = runner.rebuild("stream_index")
    assert rebuilt.applied == 300 and rebuilt.position == 300
    assert snapshot(engine) == live


def test_concurrent_runners_apply_each_event_once(engine: sa.Engine) -> None:
    store = PostgresEventStore(engine)
    for i in range(500):
        store.append(f"workload-{i % 50}", i // 50, [new(i=i)])
    runner = ProjectionRunner(engine, [StreamIndex()], batch_size=25)
    applied = run_released_together(4, lambda _: runner.catch_up("stream_index").applied)
    assert sum(applied) == 500, "every event applied exactly once across the runners"
    assert {row[2] for row in snapshot(engine)} == {10}


def test_cli_rebuilds_a_projection(engine: sa.Engine, database_url: str) -> None:
    store = PostgresEventStore(engine)
    for i in range(5):
        store.append(f"cohort-{i}", 0, [new()])
    env = {"QM_DATABASE_URL": database_url, "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "service", "projections", "rebuild", "stream_index"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "5 events" in done.stderr
    assert len(snapshot(engine)) == 5
    unknown = subprocess.run(
        [sys.executable, "-m", "service", "projections", "rebuild", "nope"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert unknown.returncode == 2 and "unknown projection" in unknown.stderr
