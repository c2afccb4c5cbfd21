"""One admission leader at a time: a Postgres advisory lock, plus a fencing
epoch so that a leader that lost the lock without noticing cannot commit.

The lock lives on a dedicated session (outside the pool: a pooled connection
would keep a session lock after being handed back). When that session dies
(network partition, ``pg_terminate_backend``, a database restart) Postgres
releases the lock and another process may take it: it bumps
``leader_epochs.epoch``. Every cycle's commit first locks that row ``FOR
SHARE`` and checks the epoch it was given (``fence``): the old leader's commit
is refused, and a successor's bump waits for a commit already in flight, so
the successor's first snapshot sees it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import zlib
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)


class Deposed(Exception):
    """This process is no longer the leader of its role."""


def lock_key(role: str) -> int:
    return zlib.crc32(f"quartermaster:{role}".encode())


def psycopg_url(engine: Engine) -> str:
    return make_url(engine.url).set(drivername="postgresql").render_as_string(hide_password=False)


_BUMP = text(
    "INSERT INTO leader_epochs (role, epoch, holder, acquired_at) "
    "VALUES (:role, 1, :holder, now()) "
    "ON CONFLICT (role) DO UPDATE SET epoch = leader_epochs.epoch + 1, "
    "holder = EXCLUDED.holder, acquired_at = EXCLUDED.acquired_at RETURNING epoch"
)
_FENCE = text("SELECT epoch FROM leader_epochs WHERE role = :role FOR SHARE")


def fence(conn: Connection, role: str, epoch: int) -> None:
    """Refuse (``Deposed``) unless ``epoch`` is still the role's epoch; hold
    the row until the caller's transaction ends."""
    current = conn.execute(_FENCE, {"role": role}).scalar_one_or_none()
    if current != epoch:
        raise Deposed(f"{role}: epoch {epoch} was superseded by {current}")


class LeaderLease:
    def __init__(self, engine: Engine, role: str = "admission", holder: str | None = None) -> None:
        self._engine = engine
        self.role = role
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.epoch: int | None = None
        self._session: psycopg.Connection[Any] | None = None

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    def try_acquire(self) -> int | None:
        """The new epoch if this process became the leader, else ``None``."""
        if self.epoch is not None:
            return self.epoch
        session = psycopg.connect(psycopg_url(self._engine), autocommit=True)
        got = session.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(self.role),)).fetchone()
        if not (got and got[0]):
            session.close()
            return None
        try:
            with self._engine.begin() as conn:
                epoch = conn.execute(_BUMP, {"role": self.role, "holder": self.holder})
                self.epoch = int(epoch.scalar_one())
        except BaseException:
            session.close()  # and with it the lock: no epoch, no leadership
            raise
        self._session = session
        log.info("%s is the %s leader, epoch %d", self.holder, self.role, self.epoch)
        return self.epoch

    def check(self) -> bool:
        """Whether the lock's session is still alive; forget leadership if not."""
        if self._session is None:
            return False
        try:
            self._session.execute("SELECT 1")
        except psycopg.Error:
            log.warning("%s lost its %s lock session", self.holder, self.role)
            self._drop()
            return False
        return True

    def fence(self, conn: Connection) -> None:
        if self.epoch is None:
            raise Deposed(f"{self.holder} is not the {self.role} leader")
        fence(conn, self.role, self.epoch)

    def release(self) -> None:
        if self._session is not None:
            with contextlib.suppress(psycopg.Error):
                self._session.execute("SELECT pg_advisory_unlock(%s)", (lock_key(self.role),))
        self._drop()

    def _drop(self) -> None:
        session, self._session, self.epoch = self._session, None, None
        if session is not None:
            session.close()
