"""The supervisor stops whole process groups: politely, then by force."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from service.runtime.supervisor import Supervisor

#: A child that ignores SIGTERM and leaves a grandchild that ignores it too.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
print("started", flush=True)
time.sleep(60)
"""


def _wait_for(output: Callable[[], str], text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in output() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_polite_children_stop_and_stubborn_groups_are_killed(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path / "logs", {})
    polite = supervisor.start("polite", [sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = supervisor.start("stubborn", [sys.executable, "-c", STUBBORN])
    _wait_for(stubborn.output, "started")
    members = [psutil.Process(stubborn.pid), *psutil.Process(stubborn.pid).children(True)]
    assert len(members) == 2
    began = time.monotonic()
    assert supervisor.stop(grace=0.5) == ["stubborn"]
    assert time.monotonic() - began < 5
    assert polite.process.returncode is not None
    assert not [p for p in members if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert "started" in (tmp_path / "logs" / "stubborn.log").read_text()


def test_a_dead_child_is_reported(tmp_path: Path) -> None:
    with Supervisor(tmp_path / "logs", {}) as supervisor:
        child = supervisor.start("short", [sys.executable, "-c", "print('bye')"])
        child.process.wait(10)
        assert supervisor.dead() is child
        assert child.tail() == "bye"
