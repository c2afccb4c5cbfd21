"""``quartermaster standalone`` as a user meets it: started as a program, used
over HTTP and through ``qmctl``, stopped with Ctrl-C (SIGINT to its process
group, as a terminal sends it), started again on the same data directory."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from service.runtime.embedded import reachable, steady_ports
from tests.harness import scratch_database
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEMO_JOB = REPO / "sim" / "fleets" / "demo-job.yaml"
#: Variables a developer's shell may carry that would change what standalone does.
OURS = (
    "QM_DATABASE_URL",
    "QM_BROKER_URL",
    "QM_BOOTSTRAP_TOKEN",
    "QM_SECRET_KEY",
    "QM_LEDGER_SIGNING_KEY",
    "QM_DATA_DIR",
    "QMCTL_SERVER",
    "QMCTL_TOKEN",
    "QMCTL_NAMESPACE",
)


class Standalone:
    """One run of ``quartermaster standalone``, its output collected by threads."""

    def __init__(self, data: Path, port: int, env: dict[str, str], bin: Path = BIN) -> None:
        # QM_DATA_DIR as well as --data-dir: every process started, even the
        # daemonized embedded servers, then carries it in its environment.
        self.data, self.port, self.env = data, port, {**env, "QM_DATA_DIR": str(data)}
        self.url = f"http://127.0.0.1:{port}"
        self.bin = bin
        self.out: list[str] = []
        self.err: list[str] = []
        began = time.monotonic()
        command = [str(bin / "quartermaster"), "standalone"]
        self.process = subprocess.Popen(
            [*command, "--data-dir", str(data), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err)):
            threading.Thread(target=self._collect, args=(stream, lines), daemon=True).start()
        self.startup = self._wait_ready(began)

    @staticmethod
    def _collect(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def _wait_ready(self, began: float, timeout: float = LONG_CEILING) -> float:
        # The ready block's last line: the lines between (API, admin token, …)
        # are read by the time it is, however slowly the collector runs.
        while not any("Ctrl-C stops everything" in line for line in self.out):
            if self.process.poll() is not None or time.monotonic() - began > timeout:
                self.interrupt()
                pytest.fail("standalone did not become ready:\n" + self.transcript())
            time.sleep(0.05)
        return time.monotonic() - began

    def transcript(self) -> str:
        return "\n".join(self.err + self.out)

    def printed(self, label: str) -> str:
        """The value of a summary line such as ``admin token  qm_…``."""
        for line in self.out:
            if line.strip().startswith(label):
                return line.strip()[len(label) :].split()[0]
        raise AssertionError(f"no {label!r} line in:\n{self.transcript()}")

    def api(self) -> httpx.Client:
        token = (self.data / "admin-token").read_text().strip()
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def qmctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "qmctl"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def processes(self) -> list[psutil.Process]:
        """Every process of ours: the children (their own process groups) and
        their descendants, and the embedded servers (which daemonize)."""
        found = [psutil.Process(self.process.pid)]
        found += found[0].children(recursive=True)
        found += ours(self.data)
        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port in self.ports() and conn.pid:
                found.append(psutil.Process(conn.pid))
        return list({p.pid: p for p in found}.values())

    def ports(self) -> set[int]:
        """API, embedded Redis, scheduler metrics, each member cluster."""
        text = self.transcript()
        ports = {self.port}
        ports |= {int(p) for p in re.findall(r"redis://127\.0\.0\.1:(\d+)", text)}
        ports |= {int(p) for p in re.findall(r"https?://127\.0\.0\.1:(\d+)", text)}
        return ports

    def interrupt(self, timeout: float = 120.0) -> int:
        """Ctrl-C: SIGINT to the foreground process group."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            _kill(ours(self.data))
            raise


def ours(data: Path) -> list[psutil.Process]:
    """Processes that name the data directory in their command line
    (Postgres, the stand-ins) or their environment (every child)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            named = any(str(data) in part for part in proc.info["cmdline"] or ())
            if named or proc.environ().get("QM_DATA_DIR") == str(data):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _kill(processes: list[psutil.Process]) -> None:
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _stop_and_check_clean(run: Standalone) -> None:
    processes, ports = run.processes(), run.ports()
    assert len(processes) >= 6, [p.cmdline() for p in processes]
    assert run.interrupt() == 0, run.transcript()
    psutil.wait_procs(processes, timeout=60)
    stray = [p for p in processes if _running(p)]
    assert not stray, [p.cmdline() for p in stray]
    busy = [port for port in ports if reachable("127.0.0.1", port, timeout=0.2)]
    assert not busy, f"ports still listening: {busy}"


def _names(api: httpx.Client, path: str) -> list[str]:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return sorted(
        f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}".lstrip("/")
        for i in response.json()["items"]
    )


_DEMO_BACKENDS = {
    "east-1": ("Ready", "kueue"),
    "eu-1": ("Ready", "kueue"),
    "vc-1": ("Ready", "volcano"),
    "west-1": ("Ready", "kueue"),
}


def _backends(api: httpx.Client) -> dict[str, tuple[str, str]]:
    """Each Cluster's state and the backend sync recorded."""
    return {
        c["metadata"]["name"]: (
            (c.get("status") or {}).get("state", ""),
            (c.get("status") or {}).get("backend", ""),
        )
        for c in api.get("/v1/clusters").json()["items"]
    }


def _inventory(api: httpx.Client) -> dict[str, list[str]]:
    return {
        path: _names(api, path)
        for path in (
            "/v1/clusters",
            "/v1/topologies",
            "/v1/resourceflavors",
            "/v1/cohorts",
            "/v1/workloadpriorityclasses",
            "/v1/clusterqueues",
            "/v1/localqueues",
            "/v1/workloads",
        )
    }


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory removed afterwards (pytest's tmp_path would keep the
    embedded databases of the last runs)."""
    path = Path(tempfile.mkdtemp(prefix="qm-standalone-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def environment(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env["QMCTL_CONFIG"] = str(scratch / "qmctl" / "config")
    return env


@pytest.fixture
def runs() -> Iterator[list[Standalone]]:
    """Every run started, stopped (and killed if need be) whatever happens."""
    started: list[Standalone] = []
    yield started
    for run in started:
        if run.process.poll() is None:
            run.interrupt()


def test_embedded_start_use_stop_and_resume(
    scratch: Path, environment: dict[str, str], runs: list[Standalone]
) -> None:
    data, port = scratch / "data", steady_ports(2)
    first = Standalone(data, port, environment)
    runs.append(first)
    print(f"\nstandalone (embedded Postgres and Redis, fresh data) ready in {first.startup:.1f} s")
    for part in ("postgres", "redis", "migrations", "api", "worker", "scheduler", "clusters"):
        assert any(line.startswith(f"✓ {part} ") for line in first.err), first.transcript()
    # The scheduler's metrics are at a place that stays: the port after the API's.
    metrics = f"http://127.0.0.1:{port + 1}/metrics"
    assert f"metrics at {metrics}" in first.transcript()
    assert "qm_admission_leader 1.0" in httpx.get(metrics, timeout=30).text
    # The banner shows the token's first characters only, and where it is.
    token = (data / "admin-token").read_text().strip()
    assert first.printed("admin token") == token[:11] + "…"
    assert token not in first.transcript()

    with first.api() as api:
        seeded = _inventory(api)
        assert seeded["/v1/clusters"] == ["east-1", "eu-1", "vc-1", "west-1"]
        assert seeded["/v1/clusterqueues"] == ["language", "serving", "vision"]
        assert seeded["/v1/resourceflavors"] == ["a100", "h100"]
        assert seeded["/v1/workloadpriorityclasses"] == ["critical", "low", "standard"]
        assert seeded["/v1/localqueues"] == [
            "language/default",
            "serving/default",
            "vision/default",
            "vision/experiments",
        ]
        kubeconfig = yaml.safe_load((data / "clusters" / "kubeconfig").read_text())
        servers = {c["name"]: c["cluster"]["server"] for c in kubeconfig["clusters"]}
        for cluster in api.get("/v1/clusters").json()["items"]:
            assert cluster["spec"]["server"] == servers[cluster["metadata"]["name"]]
            assert "credentials" not in cluster["spec"]
        # Every member Ready, vc-1 found by discovery to be a Volcano member.
        wait_until(lambda: _backends(api) == _DEMO_BACKENDS, LONG_CEILING, "clusters Ready")

        # qmctl finds the server and token through the context standalone wrote.
        config = yaml.safe_load(Path(environment["QMCTL_CONFIG"]).read_text())
        assert config["current-context"] == "standalone"
        listed = first.qmctl("get", "clusterqueues", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        assert "vision" in listed.stdout and "language" in listed.stdout
        submitted = first.qmctl("submit", "-n", "vision", "-f", str(DEMO_JOB))
        assert submitted.returncode == 0, submitted.stderr
        workload = api.get("/v1/namespaces/vision/workloads/resnet-4x8").json()
        assert workload["spec"]["queueName"] == "default"
        assert workload["status"]["state"] in ("Pending", "Admitted", "Running")

    _stop_and_check_clean(first)

    second = Standalone(data, port, environment)
    runs.append(second)
    print(f"standalone restarted on the same data in {second.startup:.1f} s")
    assert second.printed("admin token") == token[:11] + "…"
    assert (data / "admin-token").read_text().strip() == token
    with second.api() as api:
        resumed = _inventory(api)
        assert resumed == {**seeded, "/v1/workloads": ["vision/resnet-4x8"]}
        kubeconfig = yaml.safe_load((data / "clusters" / "kubeconfig").read_text())
        servers = {c["name"]: c["cluster"]["server"] for c in kubeconfig["clusters"]}
        for cluster in api.get("/v1/clusters").json()["items"]:
            # New stand-in processes, new ports: the Cluster objects follow.
            assert cluster["spec"]["server"] == servers[cluster["metadata"]["name"]]
    assert any("14 already there" in line for line in second.err), second.transcript()
    _stop_and_check_clean(second)


def test_configured_database_and_broker(
    scratch: Path,
    environment: dict[str, str],
    runs: list[Standalone],
    postgres_server_url: str,
    redis_url: str,
) -> None:
    with ExitStack() as stack:
        database = stack.enter_context(scratch_database(postgres_server_url, "standalone"))
        env = {**environment, "QM_DATABASE_URL": database, "QM_BROKER_URL": redis_url}
        run = Standalone(scratch / "data", steady_ports(2), env)
        runs.append(run)
        print(f"\nstandalone (configured Postgres and Redis) ready in {run.startup:.1f} s")
        assert not (scratch / "data" / "postgres").exists()
        assert not any("embedded" in line for line in run.err), run.transcript()
        with run.api() as api:
            assert _names(api, "/v1/clusters") == ["east-1", "eu-1", "vc-1", "west-1"]
            status = json.loads(run.qmctl("get", "clusters", "-o", "json").stdout)
            assert len(status["items"]) == 4
        assert run.interrupt() == 0, run.transcript()


def test_ctrl_c_while_starting_leaves_nothing(scratch: Path, environment: dict[str, str]) -> None:
    data, port, err = scratch / "data", steady_ports(2), scratch / "stderr"
    command = [str(BIN / "quartermaster"), "standalone", "--data-dir", str(data)]
    with err.open("w") as stderr:
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**environment, "QM_DATA_DIR": str(data)},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + LONG_CEILING
        # The API, worker and scheduler start right after the migrations.
        while "✓ migrations" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(120) == 0, err.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        left = ours(data)
        psutil.wait_procs(left, timeout=60)
        stray = [p for p in left if _running(p)]
        _kill(stray)
    assert not [p.cmdline() for p in stray]
    assert "✓ stopped clusters, api, worker, scheduler" in err.read_text()
    assert not reachable("127.0.0.1", port, timeout=0.2)


def test_a_taken_port_is_named(scratch: Path, environment: dict[str, str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                str(BIN / "quartermaster"),
                "standalone",
                "--data-dir",
                str(scratch),
                "--port",
                str(port),
            ],
            env=environment,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 1
    assert f"already listens on port {port}" in result.stderr
