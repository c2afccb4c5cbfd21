"""``service projections rebuild``: replays the log into a projection, and
refuses a name it does not know."""

from __future__ import annotations

import subprocess
import sys

import sqlalchemy as sa

from service.eventstore.postgres import PostgresEventStore
from tests.eventstore.contract import new


def _rebuild(database_url: str, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", "projections", "rebuild", name],
        capture_output=True,
        text=True,
        env={"QM_DATABASE_URL": database_url, "PATH": ""},
        check=False,
        timeout=60,
    )


def test_cli_rebuilds_a_projection(engine: sa.Engine, database_url: str) -> None:
    store = PostgresEventStore(engine)
    for i in range(5):
        store.append(f"cohort-{i}", 0, [new()])
    done = _rebuild(database_url, "resources")
    assert done.returncode == 0, done.stderr
    assert "5 events" in done.stderr
    unknown = _rebuild(database_url, "nope")
    assert unknown.returncode == 2 and "unknown projection" in unknown.stderr
