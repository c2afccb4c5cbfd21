"""``worker`` and ``scheduler`` as the operator runs them: processes that
admit a submission, and stop cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import sqlalchemy as sa

from service.app.bootstrap import Services
from service.runtime.embedded import free_port
from tests.workers.conftest import (
    ADMIN,
    ROOT,
    TEST_ENV,
    setup_fleet,
    wait_for,
    workload,
    workload_status,
)


def _reconciles_processed(services: Services) -> int:
    with services.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM processed_messages "
                    "WHERE consumer = 'reconcile.cluster' AND outcome = 'done'"
                )
            ).scalar_one()
        )


@contextmanager
def _command(database_url: str, redis_url: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        **TEST_ENV,
        "QM_DATABASE_URL": database_url,
        "QM_BROKER_URL": redis_url,
        "QM_CYCLE_INTERVAL": "30",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_worker_and_scheduler_processes_admit_and_stop_on_sigterm(
    services: Services, database_url: str, broker: str
) -> None:
    setup_fleet(services, gpu_quota=16)
    with ExitStack() as stack:
        worker = stack.enter_context(_command(database_url, broker, "worker", "--concurrency", "1"))
        port = free_port()
        scheduler = stack.enter_context(
            _command(database_url, broker, "scheduler", "--metrics-port", str(port))
        )
        services.submissions.submit(ADMIN, "team-a", workload("a"))
        wait_for(lambda: workload_status(services.engine, "team-a", "a")["state"] == "Admitted", 60)
        # The worker is up and consuming: the admission's reconcile message
        # (wake-ups no longer pass through it: the relay gives them itself).
        wait_for(lambda: _reconciles_processed(services) >= 1, 60)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'qm_admitted_workloads_total{cluster_queue="cq"} 1.0' in metrics
        assert "qm_admission_leader 1.0" in metrics
        for proc in (scheduler, worker):
            proc.send_signal(signal.SIGTERM)
        code = scheduler.wait(15)
        assert code == 0, scheduler.stderr.read().decode()[-3000:] if scheduler.stderr else code
        assert worker.wait(15) == 0
