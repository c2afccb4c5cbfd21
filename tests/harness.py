"""Where tests find Postgres and Redis.

In order: ``QM_TEST_DATABASE_URL`` / ``QM_TEST_BROKER_URL`` when set; else the
local servers at 127.0.0.1:5432 / :6379 when they answer; else embedded ones
started for this test session and removed after it. Every test process gets a
database of its own (and a Redis db number of its own), so parallel workers
never see each other's rows.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from service.runtime.embedded import embedded_postgres, embedded_redis, reachable

APPEND_ONLY_TABLES = ("events", "ledger_entries", "ledger_checkpoints")
MUTABLE_TABLES = ("outbox", "projection_tracking")


def worker_tag() -> str:
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"


@contextmanager
def postgres_server(stack: ExitStack) -> Iterator[str]:
    """A URL of a database on a server where we may create databases."""
    configured = os.environ.get("QM_TEST_DATABASE_URL")
    if configured:
        yield configured
    elif reachable("127.0.0.1", 5432):
        yield "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    else:
        data = Path(tempfile.mkdtemp(prefix="qm-test-pg-"))
        yield stack.enter_context(embedded_postgres(data / "pgdata", cleanup="delete"))


@contextmanager
def redis_server(stack: ExitStack) -> Iterator[str]:
    configured = os.environ.get("QM_TEST_BROKER_URL")
    if configured:
        yield configured
    elif reachable("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
    else:
        data = Path(tempfile.mkdtemp(prefix="qm-test-redis-"))
        yield stack.enter_context(embedded_redis(data))


#: Redis databases 1..15 are handed to test processes; db 0 keeps the claims.
_REDIS_DBS = range(1, 16)
_CLAIM_SECONDS = 3600


@contextmanager
def redis_database(server_url: str, wait_seconds: float = 120.0) -> Iterator[str]:
    """A Redis db number of this process's own on ``server_url``.

    Claimed with SET NX in db 0 (so that parallel workers, and test runs of
    other checkouts on the same server, never share a broker), released
    afterwards; a claim left by a killed run expires after an hour.
    """
    import redis

    base, _, _ = server_url.rpartition("/")
    claims = redis.Redis.from_url(f"{base}/0")
    tag = worker_tag()
    deadline = time.monotonic() + wait_seconds
    try:
        while True:
            number = next(
                (
                    n
                    for n in _REDIS_DBS
                    if claims.set(f"qm-test:redis-db:{n}", tag, nx=True, ex=_CLAIM_SECONDS)
                ),
                None,
            )
            if number is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no free Redis db on {base} (1..15 all claimed)")
            time.sleep(0.5)
        try:
            yield f"{base}/{number}"
        finally:
            key = f"qm-test:redis-db:{number}"
            if claims.get(key) == tag.encode():
                claims.delete(key)
    finally:
        claims.close()


@contextmanager
def scratch_database(server_url: str, purpose: str = "main") -> Iterator[str]:
    """Create an empty database for this process; drop it afterwards."""
    name = f"qm_test_{purpose}_{worker_tag()}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def reset_database(engine: sa.Engine) -> None:
    """Empty every table between tests. The append-only triggers would refuse
    TRUNCATE; ``session_replication_role = replica`` (superuser only) skips them
    for this one session, which is exactly the bypass a test harness needs."""
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        names = conn.exec_driver_sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename NOT IN ('alembic_version', 'event_head', 'ledger_head')"
        ).scalars()
        tables = ", ".join(sorted(set(names) | set(APPEND_ONLY_TABLES + MUTABLE_TABLES)))
        conn.exec_driver_sql(f"TRUNCATE {tables}")
        conn.exec_driver_sql("UPDATE event_head SET position = 0")
        conn.exec_driver_sql(
            "UPDATE ledger_head SET seq = 0, entry_hash = decode(repeat('00', 32), 'hex')"
        )
