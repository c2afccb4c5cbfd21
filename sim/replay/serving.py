"""A seeded stream of one-GPU serving replicas to mix into a training trace.

Replicas arrive as a Poisson process (mean ``interarrival_s`` apart) over
``[start, end)`` and each serves for an exponential time of mean
``mean_duration_s``: the shape of an autoscaled inference fleet adding and
dropping one-GPU replicas all day (kueue PR #10406's NVL72 case). Job ids
are ``svc-000001…``, the team ``serving``; the same seed gives the same
stream on any machine (``random.Random``, no global state).

    python -m sim.replay.serving --seed 22 --start 0 --end 2592000 > serving.csv
"""

from __future__ import annotations

import argparse
import csv
import random
import sys

from sim.replay.trace import TraceJob

__all__ = ["SERVING_TEAM", "serving_stream", "write_csv"]

SERVING_TEAM = "serving"


def serving_stream(
    seed: int,
    start: float,
    end: float,
    interarrival_s: float = 600.0,
    mean_duration_s: float = 6 * 3600.0,
) -> list[TraceJob]:
    """The replicas, in arrival order (see the module)."""
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    now = start + rng.expovariate(1.0 / interarrival_s)
    while now < end:
        duration = max(60.0, rng.expovariate(1.0 / mean_duration_s))
        jobs.append(
            TraceJob(
                job_id=f"svc-{len(jobs) + 1:06d}",
                submission_time=round(now, 1),
                duration=round(duration, 1),
                num_gpu=1,
                team=SERVING_TEAM,
            )
        )
        now += rng.expovariate(1.0 / interarrival_s)
    return jobs


def write_csv(jobs: list[TraceJob], out: object = sys.stdout) -> None:
    writer = csv.writer(out)  # type: ignore[arg-type]
    writer.writerow(["job_id", "submission_time", "duration", "num_gpu", "team"])
    for job in jobs:
        writer.writerow([job.job_id, job.submission_time, job.duration, job.num_gpu, job.team])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--start", type=float, default=0.0)
    parser.add_argument("--end", type=float, required=True)
    parser.add_argument("--interarrival", type=float, default=600.0)
    parser.add_argument("--mean-duration", type=float, default=6 * 3600.0)
    args = parser.parse_args()
    write_csv(
        serving_stream(args.seed, args.start, args.end, args.interarrival, args.mean_duration)
    )


if __name__ == "__main__":
    main()
