"""Job traces: ``job_id,submission_time,duration,num_gpu[,team][,priority]``.

The Microsoft ITP traces (``/work/shared/traces/msft-itp-elasticflow``) carry
only the first four columns. A job without a ``team`` is assigned to one of the
fleet's teams by a *stable hash*: the first 8 bytes of SHA-256 of its
``job_id`` (UTF-8), as a big-endian integer, modulo the number of teams, with
the teams in sorted order. The same trace and fleet therefore always give the
same assignment, on any machine and Python version (unlike ``hash()``);
``sim replay --team-seed N`` salts the hash for another, as stable.
``priority`` is an integer or the name of a WorkloadPriorityClass.
"""

from __future__ import annotations

import csv
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TraceError", "TraceJob", "load_trace", "stable_team"]

REQUIRED = ("job_id", "submission_time", "duration", "num_gpu")


class TraceError(ValueError):
    """The trace file is malformed."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submission_time: float
    duration: float
    num_gpu: int
    team: str | None = None
    priority: int | None = None
    priority_class: str | None = None


def stable_team(job_id: str, teams: Sequence[str], seed: int = 0) -> str:
    """The team a job without one is charged to (see the module docstring);
    ``seed`` > 0 hashes ``f"{seed}:{job_id}"`` instead, another assignment as
    stable as the first, to judge a policy over several."""
    if not teams:
        raise ValueError("no teams to assign jobs to")
    ordered = sorted(teams)
    text = job_id if seed == 0 else f"{seed}:{job_id}"
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return ordered[int.from_bytes(digest[:8], "big") % len(ordered)]


def _job(row: dict[str, str], line: int) -> TraceJob:
    try:
        priority_text = (row.get("priority") or "").strip()
        priority: int | None = None
        priority_class: str | None = None
        if priority_text:
            try:
                priority = int(priority_text)
            except ValueError:
                priority_class = priority_text
        job = TraceJob(
            job_id=row["job_id"].strip(),
            submission_time=float(row["submission_time"]),
            duration=float(row["duration"]),
            num_gpu=int(row["num_gpu"]),
            team=(row.get("team") or "").strip() or None,
            priority=priority,
            priority_class=priority_class,
        )
    except (KeyError, ValueError) as error:
        raise TraceError(f"line {line}: {error}") from None
    if job.num_gpu < 0 or job.duration < 0:
        raise TraceError(f"line {line}: negative num_gpu or duration")
    return job


def load_trace(path: str | os.PathLike[str], limit: int | None = None) -> list[TraceJob]:
    """Jobs in submission order (ties by file order)."""
    with Path(path).open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        jobs = []
        for line, row in enumerate(reader, start=2):
            jobs.append(_job(row, line))
            if limit is not None and len(jobs) >= limit:
                break
    ids = {job.job_id for job in jobs}
    if len(ids) != len(jobs):
        raise TraceError(f"{path}: duplicate job_id")
    return sorted(jobs, key=lambda j: j.submission_time)
