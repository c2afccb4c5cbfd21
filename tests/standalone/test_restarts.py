"""A live ``quartermaster standalone`` whose parts are killed: each is started
again on the same ports and data, the console and ``logs/supervisor.log`` say
so, and the system works afterwards; a part that keeps dying at once is given
up on while the rest keeps running. Real processes throughout: the parts are
killed with SIGKILL, and a crash loop is made by taking the API's port."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from service.runtime.embedded import steady_ports
from tests.standalone.test_standalone import (
    DEMO_JOB,
    OURS,
    Standalone,
    _stop_and_check_clean,
    ours,
)

#: Generous, per condition waited for: a machine three times slower than ours still passes.
CEILING = 180.0
#: Each test waits for several conditions (the suite's default is 300 s).
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture
def run() -> Iterator[Standalone]:
    """A live standalone in a directory of its own, stopped and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="qm-restarts-") as where:
        env = {k: v for k, v in os.environ.items() if k not in OURS}
        env["QMCTL_CONFIG"] = str(Path(where) / "qmctl-config")
        started = Standalone(Path(where) / "data", steady_ports(2), env)
        try:
            yield started
        finally:
            if started.process.poll() is None:
                started.interrupt()


def _until(condition: Callable[[], object], what: str, run: Standalone) -> None:
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > CEILING or run.process.poll() is not None:
            pytest.fail(f"{what}; standalone printed:\n{run.transcript()}")
        time.sleep(0.2)


def _said(run: Standalone, *texts: str) -> bool:
    """Whether one console line holds every text."""
    return any(all(t in line for t in texts) for line in list(run.err))


def _part(run: Standalone, *words: str) -> psutil.Process:
    """The process of a part whose command line holds every word: a child of
    standalone's, or else a daemon of its (which names its data directory)."""
    found = [*psutil.Process(run.process.pid).children(), *ours(run.data)]
    for process in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            if all(any(w in arg for arg in process.cmdline()) for w in words):
                return process
    raise AssertionError(f"no part {words} in {[p.cmdline() for p in found]}")


def _kill(run: Standalone, *words: str) -> int:
    process = _part(run, *words)
    process.send_signal(signal.SIGKILL)
    return process.pid


def _kill_redis(run: Standalone) -> None:
    """SIGKILL whatever serves the Redis URL standalone printed."""
    (port,) = {int(p) for p in re.findall(r"redis://127\.0\.0\.1:(\d+)", run.transcript())}
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            psutil.Process(conn.pid).send_signal(signal.SIGKILL)
            return
    raise AssertionError(f"nothing listens on Redis's port {port}")


def _logged(run: Standalone, *texts: str) -> bool:
    log = run.data / "logs" / "supervisor.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return any(all(t in line for t in texts) for line in lines)


def _a_job_runs(run: Standalone) -> None:
    """The demo job, submitted now, reaches Running on a member cluster."""
    submitted = run.qmctl("submit", "-n", "vision", "-f", str(DEMO_JOB))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    waited = subprocess.run(
        [
            *(str(run.bin / "qmctl"), "wait", "resnet-4x8", "-n", "vision"),
            *("--for", "state=Running", "--timeout", f"{CEILING:.0f}"),
        ],
        env=run.env,
        capture_output=True,
        text=True,
        timeout=CEILING + 30,
        check=False,
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr + run.transcript()


def test_a_killed_worker_is_restarted_and_a_job_submitted_afterwards_runs(run: Standalone) -> None:
    killed = _kill(run, "workers.cli", "worker")
    _until(lambda: _said(run, "worker died (signal SIGKILL)", "restarting in"), "no death", run)
    _until(lambda: _said(run, "worker back after"), "the worker did not come back", run)
    assert _part(run, "workers.cli", "worker").pid != killed
    assert _logged(run, "worker died (signal SIGKILL)")
    assert _logged(run, "worker back after")
    assert "exited (signal SIGKILL)" in (run.data / "logs" / "worker.log").read_text()
    _a_job_runs(run)
    _stop_and_check_clean(run)


def test_killed_redis_and_postgres_are_restarted_and_the_system_works_again(
    run: Standalone,
) -> None:
    _kill_redis(run)
    _until(lambda: _said(run, "redis died (signal SIGKILL)"), "no Redis death", run)
    _until(lambda: _said(run, "redis back after"), "Redis did not come back", run)
    _kill(run, "postgres", "-D")
    _until(lambda: _said(run, "postgres died (signal SIGKILL)"), "no Postgres death", run)
    _until(lambda: _said(run, "postgres back after"), "Postgres did not come back", run)
    assert _logged(run, "redis back after") and _logged(run, "postgres back after")
    _a_job_runs(run)
    _stop_and_check_clean(run)


def test_killed_stand_ins_come_back_on_their_ports_and_their_clusters_work(run: Standalone) -> None:
    servers = _servers(run.data)
    _kill(run, "sim", "cluster")
    _until(lambda: _said(run, "clusters died (signal SIGKILL)"), "no stand-in death", run)
    _until(lambda: _said(run, "clusters back after"), "the stand-ins did not come back", run)
    _until(lambda: _said(run, "member clusters", "registered again"), "not re-registered", run)
    assert _servers(run.data) == servers
    with run.api() as api:
        registered = {
            c["metadata"]["name"]: c["spec"]["server"]
            for c in api.get("/v1/clusters").json()["items"]
        }
    assert registered == servers
    # Only the new token and CA the Clusters now carry get a job onto a member.
    _a_job_runs(run)
    _stop_and_check_clean(run)


def _servers(data: Path) -> dict[str, str]:
    kubeconfig = yaml.safe_load((data / "clusters" / "kubeconfig").read_text())
    return {c["name"]: c["cluster"]["server"] for c in kubeconfig["clusters"]}


def test_a_part_in_a_crash_loop_is_given_up_on_and_the_rest_keeps_running(run: Standalone) -> None:
    # The API is killed and its port taken: every restart of it exits at once.
    _kill(run, "service", "api")
    taken = _take(run.port, run)
    try:
        _until(lambda: _said(run, "api died", "given up"), "the API was not given up on", run)
        assert _said(run, "api died (exit 3)"), run.transcript()  # uvicorn: cannot bind
        assert sum("api restarting" in line for line in run.err) == 4, run.transcript()
        assert _logged(run, "api died", "given up")
        assert run.process.poll() is None
        # The others are still supervised: a killed worker comes back.
        _kill(run, "workers.cli", "worker")
        _until(lambda: _said(run, "worker back after"), "the worker did not come back", run)
        _part(run, "workers.cli", "scheduler")
        _part(run, "sim", "cluster")
    finally:
        taken.close()
    _stop_and_check_clean(run)


def _take(port: int, run: Standalone) -> socket.socket:
    """Listen on ``port`` once the killed API has let go of it."""
    began = time.monotonic()
    while True:
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            if time.monotonic() - began > CEILING:
                pytest.fail(f"port {port} was not let go of:\n{run.transcript()}")
            time.sleep(0.01)
