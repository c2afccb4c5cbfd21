"""The ledger's ``workload.ran`` entries: what an admission's pods ran on
their member (docs/billing.md). The lifecycle's transitions write the
allocation's entries; these write the run's — once per admission and
measure, their ids derived from the admission.

``measured_run``: from the pods' own timestamps, read back by the worker
before the pods went (workers/metering.py). ``estimated_run``: for a member
the centre lost, up to the last time it was seen running the gang, bounded
by the fence time; a measurement read when the member returns supersedes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID, uuid5

from service.ledger import entries as ledger
from service.ledger.chain import NewLedgerEntry

GPU_SUFFIX = "gpu"

__all__ = ["PodTimes", "Seen", "estimated_run", "measured_run", "ran_entry_id"]


@dataclass(frozen=True)
class Seen:
    """What the centre last saw of a member it lost: the member's own time
    at the last pass that reached it, and by when its fence agent had
    stopped our jobs at the latest (None: no agent guards it)."""

    until: datetime | None = None
    at_most: datetime | None = None


@dataclass(frozen=True)
class PodTimes:
    """One pod of an admission as its member reports it: when it started
    and ended (whole seconds; None when it never ran) and its requests in
    canonical units."""

    started: datetime | None
    finished: datetime | None
    requests: Mapping[str, int]


def ran_entry_id(admission: str, measured: Literal["member", "estimate"]) -> UUID:
    """One ``workload.ran`` of each measure per admission: the ledger
    stores an id once, so measuring again writes nothing."""
    return uuid5(UUID(admission), f"ran/{measured}")


def _seconds_of(runs: Sequence[ledger.PodRun]) -> tuple[int, float, float]:
    """GPU-, core- and GiB-seconds of ``runs``."""
    gpu = cpu = memory = 0
    for run in runs:
        seconds = int((run.finished_at - run.started_at).total_seconds())
        for resources in run.amounts.values():
            for resource, amount in resources.items():
                if resource.endswith(GPU_SUFFIX):
                    gpu += amount * seconds
                elif resource == "cpu":
                    cpu += amount * seconds
                elif resource == "memory":
                    memory += amount * seconds
    return gpu, cpu / 1000.0, memory / 2**30


def _ran_body(
    names: Mapping[str, Any],
    admission: str,
    measured: Literal["member", "estimate"],
    runs: list[ledger.PodRun],
    seen: Seen = Seen(),
) -> ledger.WorkloadRan:
    gpu, cpu, memory = _seconds_of(runs)
    return ledger.WorkloadRan(
        namespace=str(names["namespace"]),
        workload=str(names["workload"]),
        local_queue=str(names["local_queue"]),
        cluster_queue=str(names["cluster_queue"]),
        cluster=str(names["cluster"]),
        admission=admission,
        measured=measured,
        runs=runs,
        gpu_seconds=gpu,
        cpu_seconds=cpu,
        memory_gib_seconds=memory,
        seen_until=seen.until,
        at_most_until=seen.at_most,
    )


def measured_run(
    admitted: Mapping[str, Any], admission: str, pods: Sequence[PodTimes], now: datetime
) -> NewLedgerEntry:
    """What the pods of ``admission`` ran, by their member's timestamps:
    pods over the same seconds are one run, their requests put on the
    flavors that ``admitted`` (its ``workload.admitted`` body) assigned.
    No pods, or none that started: it ran nothing."""
    flavors: Mapping[str, str] = admitted.get("flavors") or {}
    groups: dict[tuple[datetime, datetime], tuple[int, dict[str, dict[str, int]]]] = {}
    for pod in pods:
        if pod.started is None or pod.finished is None:
            continue
        span = (pod.started, max(pod.started, pod.finished))
        count, amounts = groups.get(span, (0, {}))
        for resource, amount in pod.requests.items():
            if resource in flavors and amount:
                bucket = amounts.setdefault(flavors[resource], {})
                bucket[resource] = bucket.get(resource, 0) + amount
        groups[span] = (count + 1, amounts)
    runs = [
        ledger.PodRun(started_at=start, finished_at=end, pods=count, amounts=amounts)
        for (start, end), (count, amounts) in sorted(groups.items())
    ]
    body = _ran_body(admitted, admission, "member", runs)
    return ledger.new_entry(body, ran_entry_id(admission, "member"), now)


def estimated_run(
    names: Mapping[str, Any],
    admission: str,
    started: datetime | None,
    pods: int,
    reserved: Mapping[str, Mapping[str, int]],
    seen: Seen | None,
    now: datetime,
) -> NewLedgerEntry:
    """The whole gang (``pods`` pods reserving ``reserved``) from
    ``started``, the member's time it was running, up to ``seen.until``,
    the member's time when it was last seen; nothing if it was not seen
    running (``started`` None) or not seen since."""
    seen = seen or Seen()
    runs = []
    if started is not None and seen.until is not None and seen.until > started:
        runs.append(
            ledger.PodRun(
                started_at=started,
                finished_at=seen.until,
                pods=max(1, pods),
                amounts={f: dict(r) for f, r in reserved.items()},
            )
        )
    body = _ran_body(names, admission, "estimate", runs, seen)
    return ledger.new_entry(body, ran_entry_id(admission, "estimate"), now)
