"""Child processes of standalone mode, and how they stop.

Each child runs in a session, and so a process group, of its own: Ctrl-C at
the terminal reaches only us, and we stop the children in order — every group
gets SIGTERM, and whatever is left of a group after the grace period gets
SIGKILL (a Celery worker's pool processes are in its group). On Linux a child
also gets SIGTERM should we die without stopping it (``PR_SET_PDEATHSIG``).
Each child writes to a log file of its own, appended to across restarts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import psutil

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when we die."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # we died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    #: Where this run's output starts in the (appended) log file.
    log_offset: int
    #: The group members seen last, so that stragglers are found after the leader exits.
    members: set[psutil.Process] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        """What this run of the child has written so far."""
        with self.log.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode("utf-8", "replace")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def snapshot(self) -> None:
        """Remember the group's members (the leader and its descendants)."""
        try:
            leader = psutil.Process(self.pid)
            self.members |= {leader, *leader.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass


def _running(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class Supervisor:
    """Starts children and stops them all, politely first."""

    def __init__(self, logs: Path, env: Mapping[str, str]) -> None:
        self.logs = logs
        self.env = dict(env)
        self.children: list[Child] = []
        self._preexec = _die_with_parent()

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            out.write(f"--- {datetime.now(UTC).isoformat()} {' '.join(argv)}\n".encode())
            offset = out.tell()
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **(env or {})},
                start_new_session=True,
                preexec_fn=self._preexec,  # noqa: PLW1509 - only prctl, before exec
            )
        child = Child(name, process, log, offset)
        self.children.append(child)
        return child

    def dead(self) -> Child | None:
        """The first child that has exited, if any."""
        return next((c for c in self.children if not c.alive), None)

    def stop(self, grace: float = 10.0, hurry: Callable[[], bool] = lambda: False) -> list[str]:
        """SIGTERM every group, wait up to ``grace`` seconds (or until
        ``hurry()``), SIGKILL what is left; return the names of the children
        that had to be killed."""
        for child in self.children:
            child.snapshot()
            self._signal(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not hurry() and self._remaining():
            time.sleep(0.05)
        killed = []
        for child in self._remaining():
            killed.append(child.name)
            self._signal(child, signal.SIGKILL)
            for member in child.members:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(5)
            psutil.wait_procs(list(child.members), timeout=5)
        self.children.clear()
        return killed

    def _remaining(self) -> list[Child]:
        for child in self.children:
            if child.alive:
                child.snapshot()
        return [c for c in self.children if c.alive or any(map(_running, c.members))]

    @staticmethod
    def _signal(child: Child, signum: int) -> None:
        # The group outlives its leader while members remain; pgid == pid
        # because every child leads a session of its own.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
