"""A COMMIT cut short, on a real Postgres of our own (``pg_ctl``): the
fixtures and moves of the in-doubt tests (issue 18, finding 6).

A write is held at a lock it takes before COMMIT (its transaction has
begun), commits are made to wait for a synchronous standby that does not
exist (the transaction is then committed locally, not yet acknowledged),
and the write is let go: its backend waits in COMMIT, where the test kills
it (the server up: Postgres can tell the outcome at once) or cuts the
API's connections through a TCP proxy (the API cannot tell until it is
back). No patching: the API, its pool and the server are real.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from service.app.migrate import upgrade
from tests.waiting import wait_for as wait_until
from tests.workers.stack import PrivatePostgres, private_postgres

#: Held, these pause a write before its COMMIT: every unit of work that
#: appends events locks the event head at commit (after the ledger's tip,
#: which submissions and admin writes lock first).
EVENT_HEAD = "SELECT * FROM event_head FOR UPDATE"
LEDGER_HEAD = "SELECT * FROM ledger_head FOR UPDATE"


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    with private_postgres() as pg:
        admin = sa.create_engine(pg.server_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql("CREATE DATABASE qm")
            # The private server runs with synchronous_commit off; here
            # commits are to wait for the (missing) standby when told to.
            conn.exec_driver_sql("ALTER DATABASE qm SET synchronous_commit = on")
        admin.dispose()
        upgrade(pg.url("qm"))
        yield pg


@pytest.fixture
def direct(server: PrivatePostgres) -> Iterator[sa.Engine]:
    """Statements straight to the server (not through the proxy)."""
    engine = sa.create_engine(server.url("qm"), isolation_level="AUTOCOMMIT")
    yield engine
    with engine.connect() as conn:
        conn.exec_driver_sql("ALTER SYSTEM RESET synchronous_standby_names")
        conn.exec_driver_sql("SELECT pg_reload_conf()")
        conn.exec_driver_sql("TRUNCATE idempotency_keys")
    engine.dispose()


def sync_rep(direct: sa.Engine, on: bool) -> None:
    """Make commits wait for a standby that does not exist, or not."""
    with direct.connect() as conn:
        if on:
            conn.exec_driver_sql("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        else:
            conn.exec_driver_sql("ALTER SYSTEM RESET synchronous_standby_names")
        conn.exec_driver_sql("SELECT pg_reload_conf()")
    if on:
        # The server takes the setting up a moment later: on once a probe's
        # COMMIT waits for the standby.
        wait_until(lambda: _probe_waits(direct), 60, "commits wait for a standby")


def _probe_waits(direct: sa.Engine) -> bool:
    probe = direct.connect()
    pid = probe.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

    def commit() -> None:
        with contextlib.suppress(sa.exc.DBAPIError):
            probe.exec_driver_sql("BEGIN")
            probe.exec_driver_sql("SELECT pg_logical_emit_message(true, 'probe', '')")
            probe.exec_driver_sql("COMMIT")

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    with direct.connect() as conn:
        for _ in range(20):
            waiting = conn.exec_driver_sql(
                f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event = 'SyncRep'"
            ).scalar()
            if waiting or not thread.is_alive():
                break
            thread.join(0.05)
    if waiting:
        terminate(direct, pid)
    thread.join(10)
    probe.invalidate()
    return bool(waiting)


def held_at(direct: sa.Engine, lock: str, write: Callable[[], Any]) -> sa.Connection:
    """Start ``write`` in a thread and return once it waits for ``lock``,
    held by the connection returned (in a transaction: roll it back to let
    the write go on)."""
    holder = direct.connect()
    holder.exec_driver_sql("BEGIN")
    holder.exec_driver_sql(lock)
    threading.Thread(target=write, daemon=True).start()
    with direct.connect() as conn:
        wait_until(
            lambda: conn.exec_driver_sql(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
            ).scalar(),
            60,
            "the write waits for the lock held",
        )
    return holder


def _lock_waits(conn: sa.Connection) -> int:
    return int(conn.exec_driver_sql("SELECT count(*) FROM pg_locks WHERE NOT granted").scalar_one())


def waiting_pid(direct: sa.Engine) -> int:
    """The backend whose lock wait is the one there is."""
    with direct.connect() as conn:
        pid: int = conn.exec_driver_sql(
            "SELECT pid FROM pg_locks WHERE NOT granted LIMIT 1"
        ).scalar_one()
    return pid


def commit_waits(direct: sa.Engine, write: Callable[[], Any], lock: str = LEDGER_HEAD) -> int:
    """Start ``write``; hold it at ``lock`` (its Idempotency-Key claimed, its
    COMMIT not sent), make commits wait for a standby, let it go on: the pid
    of its backend, waiting in COMMIT."""
    holder = held_at(direct, lock, write)
    try:
        sync_rep(direct, on=True)
    finally:
        holder.exec_driver_sql("ROLLBACK")
        holder.close()
    with direct.connect() as conn:
        pid: int = wait_until(
            lambda: conn.exec_driver_sql(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).scalar(),
            60,
            "the write's COMMIT waits for the standby",
        )
    return pid


def terminate(direct: sa.Engine, pid: int) -> None:
    with direct.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")


def final(response: httpx.Response) -> bool:
    """Not "retry later": neither a key in flight nor the database away."""
    if response.status_code not in (409, 503):
        return True
    kind = str(response.json().get("type", ""))
    return not kind.endswith(("/idempotency-key-in-flight", "/database-unavailable"))
