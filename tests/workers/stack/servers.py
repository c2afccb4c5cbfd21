"""A private Postgres (``pg_ctl`` on a data directory of ours) and a private
``redis-server``, on free ports, that a chaos test may stop and start without
touching the servers other tests share."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.runtime.embedded import admin_tool, free_port
from tests.waiting import wait_for as wait_until


def _as_postgres() -> list[str]:
    """initdb and postgres refuse to run as root: run them as ``postgres``
    (``runuser`` lives in sbin, which a root shell's PATH may lack)."""
    if os.geteuid() != 0:
        return []
    return [admin_tool("runuser"), "-u", "postgres", "--"]


class PrivatePostgres:
    """A Postgres server of our own (``pg_ctl``), which a test may stop and start."""

    def __init__(self, root: Path, durable: bool = False) -> None:
        self.root = root
        #: Commits flushed as the service asks (``synchronous_commit`` on), so
        #: that a crash (``stop("immediate")``) loses nothing acknowledged;
        #: ``fsync`` stays off, since a crash of the server keeps what it wrote.
        self.durable = durable
        self.data = root / "pgdata"
        self.log = root / "postgres.log"
        self.port = free_port()
        self.server_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str) -> None:
        subprocess.run(
            [*_as_postgres(), *argv], check=True, capture_output=True, timeout=120, cwd=self.root
        )

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
            f" -c synchronous_commit={'on' if self.durable else 'off'}"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` disconnects everyone and shuts down cleanly; ``immediate``
        is a crash (recovery at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


@contextmanager
def private_postgres(durable: bool = False) -> Iterator[PrivatePostgres]:
    root = Path(tempfile.mkdtemp(prefix="qm-e2e-pg-"))
    server = PrivatePostgres(root, durable)
    try:
        server.init()
        server.start()
        yield server
    finally:
        if server.running():
            with contextlib.suppress(subprocess.SubprocessError):
                server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


class PrivateRedis:
    """A ``redis-server`` of our own without persistence: a restart loses
    everything it held, as the workers must survive."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.root / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                "redis-server",
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.root)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            wait_until(lambda: _pings(client), 60, "redis-server")
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    root = Path(tempfile.mkdtemp(prefix="qm-e2e-redis-"))
    server = PrivateRedis(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
