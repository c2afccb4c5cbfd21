"""Sampling profiles of the stack's processes during a run (py-spy).

``py-spy record --format raw`` writes collapsed stacks (``frame;frame;… N``)
per process; :func:`summary` turns each into the functions that held the
most samples on their own (self) and under them (inclusive; of our own
packages only, the frameworks' frames above them say nothing), so that the
results say where a process spent its time. Only samples of a thread
holding the GIL count (``--gil``): Python running, not waiting on a socket
or Postgres. py-spy samples from outside the process (``--nonblocking``: it
does not pause the target), at a low rate.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RATE = 25  # samples per second per process


@dataclass
class Profilers:
    py_spy: str
    directory: Path
    running: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)

    def start(self, name: str, pid: int) -> None:
        out = self.directory / f"{name}.txt"
        argv = [
            *(self.py_spy, "record", "--pid", str(pid), "--rate", str(RATE)),
            *("--format", "raw", "--output", str(out), "--nonblocking", "--subprocesses", "--gil"),
        ]
        log = (self.directory / f"{name}.py-spy.log").open("wb")
        self.running[name] = (
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT),
            out,
        )
        log.close()

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every profiler (it writes its file on SIGINT); their summaries."""
        for process, _ in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
        result = {}
        for name, (process, out) in self.running.items():
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            result[name] = summary(out) if out.exists() else {"error": "no profile written"}
        self.running.clear()
        return result


_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


OURS = ("service/", "workers/", "sim/", "bench/", "tests/")


def _short(path: str) -> str:
    """A library's path from its package; ours from the repository's root."""
    if "/site-packages/" in path:
        return path.rsplit("/site-packages/", 1)[1]
    parts = path.split("/")
    for i, part in enumerate(parts):
        if f"{part}/" in OURS:
            return "/".join(parts[i:])
    return "/".join(parts[-2:])


def _label(frame: str) -> str:
    """``function (/abs/path/file.py:12)`` → ``function (pkg/file.py)``."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    return f"{match.group('function')} ({_short(match.group('file'))})"


def _ours(label: str) -> bool:
    """A frame of our code: ``function (package/file.py)`` under one of ours."""
    return label.endswith(".py)") and label.rsplit("(", 1)[1].startswith(OURS)


def summary(path: Path, top: int = 20) -> dict[str, Any]:
    """Samples in all, the ``top`` functions by self samples, and the ``top``
    of our own functions by inclusive samples (each as a share of all)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        # Python frames only: py-spy's first ones name the process and thread.
        frames = [_label(f) for f in stack.split(";") if _FRAME.match(f)]
        if not frames:
            continue
        own[frames[-1]] += samples
        for frame in set(frames):
            if _ours(frame):
                inclusive[frame] += samples

    def share(counter: Counter[str]) -> list[list[Any]]:
        return [[name, round(100 * n / max(1, total), 1)] for name, n in counter.most_common(top)]

    return {"samples": total, "self_pct": share(own), "inclusive_pct": share(inclusive)}
