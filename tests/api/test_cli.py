"""``quartermaster migrate`` then ``quartermaster api --workers 2``, as an
operator runs them, with ``QM_BOOTSTRAP_TOKEN`` as the first admin and the
address from ``QM_API_HOST`` and ``QM_API_PORT``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.runtime.embedded import free_port
from tests.harness import scratch_database
from tests.waiting import LONG_CEILING

CLI = str(Path(sys.executable).with_name("quartermaster"))


@pytest.fixture
def blank_database(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, purpose="cli") as url:
        yield url


def test_migrate_then_api_with_a_bootstrap_token(blank_database: str) -> None:
    env = {**os.environ, "QM_DATABASE_URL": blank_database, "QM_BOOTSTRAP_TOKEN": "first-admin"}
    migrated = subprocess.run(
        [CLI, "migrate"], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    # Where it listens from QM_API_HOST and QM_API_PORT (README's settings).
    listen = {"QM_API_HOST": "127.0.0.1", "QM_API_PORT": str(port)}
    server = subprocess.Popen(
        [CLI, "api", "--workers", "2"],
        env={**env, **listen},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + LONG_CEILING
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the API did not start"
            time.sleep(0.2)
        admin = {"Authorization": "Bearer first-admin"}
        issued = httpx.post(
            f"{base}/v1/tokens", json={"name": "ops", "role": "queue-admin"}, headers=admin
        )
        assert issued.status_code == 201, issued.text
        queue_admin = {"Authorization": f"Bearer {issued.json()['token']}"}
        created = httpx.post(
            f"{base}/v1/resourceflavors",
            json={"metadata": {"name": "h100"}, "spec": {}},
            headers=queue_admin,
        )
        assert created.status_code == 201, created.text
        # Both worker processes see the same database: ask a few times.
        for _ in range(6):
            assert (
                httpx.get(f"{base}/v1/resourceflavors/h100", headers=queue_admin).status_code == 200
            )
        assert httpx.get(f"{base}/v1/resourceflavors", headers={}).status_code == 401
        # /metrics adds up every worker process's samples, whichever answers.
        route = 'route="/v1/resourceflavors/{name}",status="200"'
        for _ in range(3):
            text = httpx.get(f"{base}/metrics").text
            line = next(
                x for x in text.splitlines() if "qm_http_requests_total" in x and route in x
            )
            assert line.endswith(" 6.0"), line
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def test_the_api_sweeps_metrics_directories_of_processes_that_are_gone(tmp_path: Path) -> None:
    from service.cli import METRICS_PREFIX, sweep_metrics_dirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{METRICS_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{METRICS_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{METRICS_PREFIX}notapid"
    for path in (dead, live, other):
        path.mkdir()
        (path / "counter_1.db").write_bytes(b"x")
    assert sweep_metrics_dirs(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()
