"""What ran, from the ledger's ``workload.ran`` entries: the second measure
of service/ledger/accounting.py (docs/billing.md), and the hour buckets of
ledger time that both measures are summed in.

Each admission counts once: its member measurement (the pods' own
timestamps, read back before the pods went), else its first estimate (a
lost member's, up to the last time it was seen running it). Runs are whole
seconds, so sums of amount * seconds are exact integers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from service.ledger.chain import LedgerEntry

HOUR_US: Final = 3_600_000_000
EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
RAN: Final = "workload.ran"
GPU_SUFFIX: Final = "gpu"

# (hour, namespace, local_queue, cluster_queue, cluster, flavor, resource)
HourKey = tuple[int, str, str, str, str, str, str]


def micros(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


def workload_key(body: Mapping[str, Any]) -> str:
    """Who holds an allocation: ``namespace/workload``, and ``#replica`` for
    a serving workload's unit (each unit is an allocation of its own)."""
    replica = body.get("replica")
    unit = "" if replica is None else f"#{replica}"
    return f"{body['namespace']}/{body['workload']}{unit}"


def _instant(value: Any) -> int:
    """A stored timestamp (ISO 8601 text or a datetime) in microseconds."""
    if isinstance(value, datetime):
        return micros(value)
    return micros(datetime.fromisoformat(str(value).replace("Z", "+00:00")))


def charge_runs(body: Mapping[str, Any], into: dict[HourKey, int]) -> None:
    """Add a ``workload.ran`` body's runs into ``into``: amount * microseconds
    per hour and key, split at hour boundaries as the held usage is."""
    names = (body["namespace"], body["local_queue"], body["cluster_queue"], body["cluster"])
    for run in body["runs"]:
        start, end = _instant(run["started_at"]), _instant(run["finished_at"])
        for hour in range(start // HOUR_US, (end - 1) // HOUR_US + 1) if end > start else ():
            overlap = min(end, (hour + 1) * HOUR_US) - max(start, hour * HOUR_US)
            for flavor, amounts in sorted(run["amounts"].items()):
                for resource, amount in sorted(amounts.items()):
                    key = (hour, *names, flavor, resource)
                    into[key] = into.get(key, 0) + int(amount) * overlap


class RanRollup:
    """Per admission, its member measurement; until one comes, its first
    estimate (a lost member's), which the measurement then replaces."""

    def __init__(self) -> None:
        self._hours: dict[HourKey, int] = defaultdict(int)
        self._estimated: dict[str, dict[HourKey, int]] = {}
        # Every measured admission: an estimate written after its measurement
        # (a race of a loss with the removal of the job) must not count.
        self._measured: set[str] = set()

    def apply(self, body: Mapping[str, Any]) -> None:
        admission = str(body["admission"])
        if admission in self._measured:
            return
        if body["measured"] == "estimate":
            if admission not in self._estimated:
                share: dict[HourKey, int] = {}
                charge_runs(body, share)
                self._estimated[admission] = share
                self._shift(share, 1)
            return
        self._measured.add(admission)
        self._shift(self._estimated.pop(admission, {}), -1)
        charge_runs(body, self._hours)

    def _shift(self, share: Mapping[HourKey, int], sign: int) -> None:
        for key, value in share.items():
            self._hours[key] += sign * value

    def hours(self) -> dict[HourKey, int]:
        return {k: v for k, v in self._hours.items() if v}


def ran_bodies(entries: Iterable[LedgerEntry]) -> dict[str, Mapping[str, Any]]:
    """The ``workload.ran`` body that counts for each admission: its member
    measurement, else its first estimate."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        if entry.kind != RAN:
            continue
        admission, body = str(entry.body["admission"]), entry.body
        before = chosen.get(admission)
        if before is None or (before["measured"] == "estimate" and body["measured"] == "member"):
            chosen[admission] = body
    return chosen


def ran_hours_from_scratch(entries: Iterable[LedgerEntry]) -> dict[HourKey, int]:
    """What :meth:`UsageRollup.ran_hours` must equal, recomputed."""
    result: dict[HourKey, int] = {}
    for body in ran_bodies(entries).values():
        charge_runs(body, result)
    return {k: v for k, v in result.items() if v}


def run_seconds(body: Mapping[str, Any]) -> dict[str, int]:
    """``{resource: amount * seconds}`` of one ``workload.ran`` body."""
    totals: dict[str, int] = defaultdict(int)
    for run in body["runs"]:
        seconds = (_instant(run["finished_at"]) - _instant(run["started_at"])) // 1_000_000
        for amounts in run["amounts"].values():
            for resource, amount in amounts.items():
                totals[resource] += int(amount) * seconds
    return dict(totals)


def ran_by_workload(entries: Iterable[LedgerEntry], resource: str) -> dict[str, int]:
    """``resource`` * seconds that ran, per ``namespace/workload``, over all
    its admissions (each counted once: its measurement, else its estimate)."""
    totals: dict[str, int] = defaultdict(int)
    for body in ran_bodies(entries).values():
        totals[workload_key(body)] += run_seconds(body).get(resource, 0)
    return dict(totals)


def ran_problems(entries: Iterable[LedgerEntry]) -> list[str]:
    """A ``workload.ran`` that contradicts the ledger: of an admission it
    never made, naming another workload or cluster than the admission did,
    a second member measurement of one admission, or GPU-seconds that are
    not its runs'. Empty on a sound ledger."""
    admitted: dict[str, Mapping[str, Any]] = {}
    measured: set[str] = set()
    problems: list[str] = []
    for entry in entries:
        if entry.kind == "workload.admitted":
            admitted[str(entry.entry_id)] = entry.body
        if entry.kind != RAN:
            continue
        body, where = entry.body, f"entry {entry.seq}: workload.ran of {workload_key(entry.body)}"
        admission = admitted.get(str(body["admission"]))
        if admission is None:
            problems.append(f"{where} for admission {body['admission']}, never admitted")
        elif (workload_key(admission), admission["cluster"]) != (
            workload_key(body),
            body["cluster"],
        ):
            problems.append(f"{where} on {body['cluster']}: its admission names another")
        if body["measured"] == "member":
            if body["admission"] in measured:
                problems.append(f"{where}: admission {body['admission']} measured twice")
            measured.add(str(body["admission"]))
        gpus = sum(v for r, v in run_seconds(body).items() if r.endswith(GPU_SUFFIX))
        if gpus != body["gpu_seconds"]:
            problems.append(f"{where}: gpu_seconds {body['gpu_seconds']}, its runs {gpus}")
    return problems


def ran_mismatches(ledger: Mapping[str, int], reported: Mapping[str, int]) -> list[str]:
    """Every workload whose ``ran`` in the ledger differs from what its
    members report (both amount * whole seconds, by ``namespace/workload``),
    and the totals when they differ. Empty when the ledger is right."""
    problems = [
        f"{key}: ledger ran {ledger.get(key, 0)}, members report {reported.get(key, 0)}"
        for key in sorted(set(ledger) | set(reported))
        if ledger.get(key, 0) != reported.get(key, 0)
    ]
    if sum(ledger.values()) != sum(reported.values()):
        problems.append(f"total: ledger {sum(ledger.values())}, members {sum(reported.values())}")
    return problems
