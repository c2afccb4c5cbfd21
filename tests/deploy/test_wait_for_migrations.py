"""``quartermaster wait-for-migrations``, every part's init container: it
lets its part start only on the schema of its own version — not on an
unmigrated database, not on one a newer version migrated, not on one it
cannot reach — and waits rather than fails until its timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from service.app.migrate import head_revision, upgrade
from tests.harness import scratch_database

QUARTERMASTER = str(Path(sys.executable).parent / "quartermaster")


def _wait(url: str, timeout: str = "1") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QM_")}
    return subprocess.run(
        [QUARTERMASTER, "wait-for-migrations", "--timeout", timeout, "--interval", "0.2"],
        env={**env, "QM_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_it_waits_for_this_versions_schema_and_no_other(postgres_server_url: str) -> None:
    with scratch_database(postgres_server_url, "waiting") as url:
        empty = _wait(url)
        assert empty.returncode == 1 and "not migrated" in empty.stderr, empty.stderr
        upgrade(url)
        current = _wait(url, "30")
        assert current.returncode == 0, current.stderr
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("UPDATE alembic_version SET version_num = 'a-newer-one'"))
        finally:
            engine.dispose()
        ahead = _wait(url)
        assert ahead.returncode == 1, ahead.stderr
        assert f"database at migration a-newer-one, expected {head_revision()}" in ahead.stderr
    gone = _wait(url)
    assert gone.returncode == 1 and "unreachable" in gone.stderr, gone.stderr
