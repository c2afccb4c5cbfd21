"""A live ``quartermaster standalone`` whose parts are killed: each is started
again on the same ports and data, the console and ``logs/supervisor.log`` say
so, and the system works afterwards; a part that keeps dying at once is given
up on while the rest keeps running. Real processes throughout: the parts are
killed with SIGKILL, and a crash loop is made by taking the API's port.

One standalone serves the module's tests in turn, as a user's keeps running
through one fault after another; each test reads only what was said and
logged since it began, submits a job of its own name, and the last (the
crash loop, which gives the API up) stops it and checks that nothing is left."""

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
from dataclasses import dataclass
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


@pytest.fixture(scope="module")
def standalone() -> Iterator[Standalone]:
    """A live standalone in a directory of its own, stopped (and checked to
    leave nothing, unless a test did so) and removed afterwards. Its parts'
    temporary files go to that directory too: a SIGKILLed Celery worker
    leaves its ``pymp-*`` folder behind."""
    with tempfile.TemporaryDirectory(prefix="qm-restarts-") as where:
        env = {k: v for k, v in os.environ.items() if k not in OURS}
        env["QMCTL_CONFIG"] = str(Path(where) / "qmctl-config")
        (Path(where) / "tmp").mkdir()
        env["TMPDIR"] = str(Path(where) / "tmp")
        started = Standalone(Path(where) / "data", steady_ports(2), env)
        try:
            yield started
            if started.process.poll() is None:
                _stop_and_check_clean(started)
        finally:
            if started.process.poll() is None:
                started.interrupt()


@dataclass
class Run:
    """The module's standalone as one test sees it: what it printed to the
    console and logged from the test's start on."""

    standalone: Standalone
    printed: int
    logged: int

    @property
    def err(self) -> list[str]:
        return list(self.standalone.err)[self.printed :]


@pytest.fixture
def run(standalone: Standalone) -> Run:
    if standalone.process.poll() is not None:
        pytest.fail(f"standalone has exited:\n{standalone.transcript()}")
    return Run(standalone, len(standalone.err), len(_log_lines(standalone)))


def _until(condition: Callable[[], object], what: str, run: Run) -> None:
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > CEILING or run.standalone.process.poll() is not None:
            pytest.fail(f"{what}; standalone printed:\n{run.standalone.transcript()}")
        time.sleep(0.2)


def _said(run: Run, *texts: str) -> bool:
    """Whether one console line since the test began holds every text."""
    return any(all(t in line for t in texts) for line in run.err)


def _part(run: Run, *words: str) -> psutil.Process:
    """The process of a part whose command line holds every word as an
    argument (or a program's file name): a child of standalone's, or else a
    daemon of its (which names its data directory). Whole arguments, since
    ``worker`` is a part of ``workers.cli scheduler`` too."""
    standalone = run.standalone
    found = [*psutil.Process(standalone.process.pid).children(), *ours(standalone.data)]
    for process in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            args = {*process.cmdline(), *(Path(a).name for a in process.cmdline())}
            if all(w in args for w in words):
                return process
    raise AssertionError(f"no part {words} in {[p.cmdline() for p in found]}")


def _kill(run: Run, *words: str) -> int:
    process = _part(run, *words)
    process.send_signal(signal.SIGKILL)
    return process.pid


def _kill_redis(run: Run) -> None:
    """SIGKILL whatever serves the Redis URL standalone printed."""
    printed = run.standalone.transcript()
    (port,) = {int(p) for p in re.findall(r"redis://127\.0\.0\.1:(\d+)", printed)}
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            psutil.Process(conn.pid).send_signal(signal.SIGKILL)
            return
    raise AssertionError(f"nothing listens on Redis's port {port}")


def _log_lines(standalone: Standalone) -> list[str]:
    log = standalone.data / "logs" / "supervisor.log"
    return log.read_text().splitlines() if log.exists() else []


def _logged(run: Run, *texts: str) -> bool:
    """Whether one ``supervisor.log`` line since the test began holds every text."""
    lines = _log_lines(run.standalone)[run.logged :]
    return any(all(t in line for t in texts) for line in lines)


def _a_job_runs(run: Run, name: str) -> None:
    """The demo job, named ``name`` and submitted now, reaches Running on a
    member cluster."""
    standalone = run.standalone
    job = yaml.safe_load(DEMO_JOB.read_text())
    job["metadata"]["name"] = name
    manifest = standalone.data.parent / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(job))
    submitted = standalone.qmctl("submit", "-n", "vision", "-f", str(manifest))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    waited = subprocess.run(
        [
            *(str(standalone.bin / "qmctl"), "wait", name, "-n", "vision"),
            *("--for", "state=Running", "--timeout", f"{CEILING:.0f}"),
        ],
        env=standalone.env,
        capture_output=True,
        text=True,
        timeout=CEILING + 30,
        check=False,
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr + standalone.transcript()


def test_a_killed_worker_is_restarted_and_a_job_submitted_afterwards_runs(run: Run) -> None:
    worker_log = run.standalone.data / "logs" / "worker.log"
    written = worker_log.stat().st_size
    killed = _kill(run, "workers.cli", "worker")
    _until(lambda: _said(run, "worker died (signal SIGKILL)", "restarting in"), "no death", run)
    _until(lambda: _said(run, "worker back after"), "the worker did not come back", run)
    assert _part(run, "workers.cli", "worker").pid != killed
    assert _logged(run, "worker died (signal SIGKILL)")
    assert _logged(run, "worker back after")
    with worker_log.open("rb") as log:
        log.seek(written)
        assert b"exited (signal SIGKILL)" in log.read()
    _a_job_runs(run, "after-worker")


def test_killed_redis_and_postgres_are_restarted_and_the_system_works_again(run: Run) -> None:
    _kill_redis(run)
    _until(lambda: _said(run, "redis died (signal SIGKILL)"), "no Redis death", run)
    _until(lambda: _said(run, "redis back after"), "Redis did not come back", run)
    _kill(run, "postgres", "-D")
    _until(lambda: _said(run, "postgres died (signal SIGKILL)"), "no Postgres death", run)
    _until(lambda: _said(run, "postgres back after"), "Postgres did not come back", run)
    assert _logged(run, "redis back after") and _logged(run, "postgres back after")
    _a_job_runs(run, "after-databases")


def test_killed_stand_ins_come_back_on_their_ports_and_their_clusters_work(run: Run) -> None:
    servers = _servers(run.standalone.data)
    _kill(run, "sim.cli", "cluster")
    _until(lambda: _said(run, "clusters died (signal SIGKILL)"), "no stand-in death", run)
    _until(lambda: _said(run, "clusters back after"), "the stand-ins did not come back", run)
    _until(lambda: _said(run, "member clusters", "registered again"), "not re-registered", run)
    assert _servers(run.standalone.data) == servers
    with run.standalone.api() as api:
        registered = {
            c["metadata"]["name"]: c["spec"]["server"]
            for c in api.get("/v1/clusters").json()["items"]
        }
    assert registered == servers
    # Only the new token and CA the Clusters now carry get a job onto a member.
    _a_job_runs(run, "after-stand-ins")


def _servers(data: Path) -> dict[str, str]:
    kubeconfig = yaml.safe_load((data / "clusters" / "kubeconfig").read_text())
    return {c["name"]: c["cluster"]["server"] for c in kubeconfig["clusters"]}


# Last: the API, given up on, stays down.
def test_a_part_in_a_crash_loop_is_given_up_on_and_the_rest_keeps_running(run: Run) -> None:
    standalone = run.standalone
    # The API is killed and its port taken: every restart of it exits at once.
    _kill(run, "service", "api")
    taken = _take(standalone.port, run)
    try:
        _until(lambda: _said(run, "api died", "given up"), "the API was not given up on", run)
        assert _said(run, "api died (exit 3)"), standalone.transcript()  # uvicorn: cannot bind
        # Given up after five quick deaths in a row (within 60 s of a start:
        # the SIGKILL is one of them if the API had run less than that), each
        # death but the last followed by a restart.
        deaths = _deaths(run, "api")
        assert sum(ran < 60 for ran in deaths) == 5, standalone.transcript()
        assert all(ran < 60 for ran in deaths[1:]), standalone.transcript()
        restarts = sum("api restarting" in line for line in run.err)
        assert restarts == len(deaths) - 1, standalone.transcript()
        assert _logged(run, "api died", "given up")
        assert standalone.process.poll() is None
        # The others are still supervised: a killed worker comes back.
        _kill(run, "workers.cli", "worker")
        _until(lambda: _said(run, "worker back after"), "the worker did not come back", run)
        _part(run, "workers.cli", "scheduler")
        _part(run, "sim.cli", "cluster")
    finally:
        taken.close()
    _stop_and_check_clean(standalone)


def _deaths(run: Run, part: str) -> list[float]:
    """How long ``part`` had run at each death printed since the test began."""
    pattern = re.compile(rf"{part} died \([^)]*\) after ([\d.]+) s")
    return [float(m.group(1)) for line in run.err if (m := pattern.search(line))]


def _take(port: int, run: Run) -> socket.socket:
    """Listen on ``port`` once the killed API has let go of it."""
    began = time.monotonic()
    while True:
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            if time.monotonic() - began > CEILING:
                pytest.fail(f"port {port} was not let go of:\n{run.standalone.transcript()}")
            time.sleep(0.01)
