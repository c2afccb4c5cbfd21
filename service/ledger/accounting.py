"""GPU-, CPU- and memory-hours from the ledger alone, and the decayed usage
that admission fair sharing reads. Two measures (docs/billing.md):

*held* — what its admission reserved, per flavor and resource, from the
``workload.admitted`` entry to the entry that released it
(``workload.finished``, ``workload.preempted``, ``workload.evicted``, or
``cluster.lost`` for the gangs on that cluster): the allocation, as Slurm's
``sreport`` and Kueue's quota both count it. Fair sharing reads this one.

*ran* — what the admission's pods ran, by the member's own timestamps, from
its ``workload.ran`` entry (``measured: member``), or its estimate while the
member was lost (``measured: estimate``, superseded by a later ``member``
entry of the same admission). An admission without one ran nothing.

Times are *ledger time*: an entry's ``recorded_at``, or the latest earlier
entry's if that is later (appenders' clocks may disagree a little; ledger
time never runs backwards, so every interval is well formed).

Sums are kept exactly, as integers of amount * microseconds per UTC hour, so
that rolling up incrementally (entry by entry) equals recomputing from
scratch to the last digit; days and months are sums of hours.

Decayed usage: with ``λ = ln 2 / half_life``, a LocalQueue's decayed usage at
``t`` is ``λ ∫ u(s) e^(-λ(t-s)) ds`` over its allocations ``u`` — the
continuous form of Kueue's admission fair-sharing moving average
(KEP-4136), in the same units as the engine's
:class:`~service.engine.LocalQueueUsage`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from service.engine import LocalQueueUsage
from service.ledger.chain import LedgerEntry
from service.ledger.ran import (
    EPOCH,
    HOUR_US,
    RAN,
    HourKey,
    RanRollup,
    micros,
    ran_bodies,
    ran_by_workload,
    ran_hours_from_scratch,
    ran_mismatches,
    ran_problems,
    run_seconds,
)
from service.ledger.ran import workload_key as _workload_key

__all__ = [
    "EPOCH",
    "HOUR_US",
    "Allocation",
    "Granularity",
    "Holding",
    "HourKey",
    "OutOfOrder",
    "UsageRollup",
    "UsageRow",
    "allocations",
    "audit",
    "decayed_from_scratch",
    "double_closes",
    "hours_from_scratch",
    "micros",
    "open_usage",
    "ran_bodies",
    "ran_by_workload",
    "ran_hours_from_scratch",
    "ran_mismatches",
    "ran_problems",
    "rows",
    "run_seconds",
    "usage_mismatches",
]

DIMENSIONS: Final = ("namespace", "local_queue", "cluster_queue", "cluster", "flavor")
RELEASING: Final = frozenset({"workload.finished", "workload.preempted", "workload.evicted"})

Granularity = Literal["hour", "day", "month"]


@dataclass(frozen=True, slots=True)
class Allocation:
    namespace: str
    local_queue: str
    cluster_queue: str
    cluster: str
    reserved: tuple[tuple[str, str, int], ...]  # (flavor, resource, amount)
    start_us: int
    workload: str = ""
    """``namespace/workload``: who holds it."""

    @property
    def queue_key(self) -> str:
        """The engine's LocalQueue key."""
        return f"{self.namespace}/{self.local_queue}"

    @classmethod
    def of(cls, body: Mapping[str, Any], start_us: int) -> Allocation:
        reserved = tuple(
            (flavor, resource, int(amount))
            for flavor, amounts in sorted(body["reserved"].items())
            for resource, amount in sorted(amounts.items())
        )
        return cls(
            str(body["namespace"]),
            str(body["local_queue"]),
            str(body["cluster_queue"]),
            str(body["cluster"]),
            reserved,
            start_us,
            _workload_key(body),
        )

    def per_resource(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for _, resource, amount in self.reserved:
            totals[resource] += amount
        return dict(totals)


class OutOfOrder(ValueError):
    """An entry that is not the next one after the roll-up's position."""


@dataclass(frozen=True, slots=True)
class _Decayed:
    """Decayed integral ``value`` (amount * seconds) at ``at_us``, with
    ``running`` allocated since then."""

    value: float
    at_us: int
    running: int


class UsageRollup:
    """Incremental accounting: apply ledger entries in ``seq`` order."""

    def __init__(self, half_life_seconds: float = 7 * 24 * 3600.0) -> None:
        if half_life_seconds <= 0:
            raise ValueError("the half-life is positive")
        self.half_life_seconds = half_life_seconds
        self.seq = 0
        self.clock_us = 0
        self._open: dict[str, Allocation] = {}
        self._hours: dict[HourKey, int] = defaultdict(int)
        self._decayed: dict[tuple[str, str], _Decayed] = {}
        self._ran = RanRollup()

    # --- applying entries ------------------------------------------------------------

    def apply_all(self, entries: Iterable[LedgerEntry]) -> None:
        for entry in entries:
            self.apply(entry)

    def apply(self, entry: LedgerEntry) -> None:
        if entry.seq != self.seq + 1:
            raise OutOfOrder(f"entry {entry.seq} after {self.seq}")
        self.seq = entry.seq
        self.clock_us = max(self.clock_us, micros(entry.recorded_at))
        body, now = entry.body, self.clock_us
        if entry.kind == "workload.admitted":
            key = _workload_key(body)
            if key in self._open:  # admitted again without a release: close the old one
                self._release(key, now)
            self._hold(key, Allocation.of(body, now))
        elif entry.kind in RELEASING:
            self._release(_workload_key(body), now)
        elif entry.kind == "cluster.lost":
            for key in [k for k, a in self._open.items() if a.cluster == body["cluster"]]:
                self._release(key, now)
        elif entry.kind == RAN:
            self._ran.apply(body)

    def _hold(self, key: str, allocation: Allocation) -> None:
        self._open[key] = allocation
        for resource, amount in allocation.per_resource().items():
            self._shift_running(allocation.queue_key, resource, amount, allocation.start_us)

    def _release(self, key: str, now: int) -> None:
        allocation = self._open.pop(key, None)
        if allocation is None:
            return
        _charge_hours(allocation, now, self._hours)
        for resource, amount in allocation.per_resource().items():
            self._shift_running(allocation.queue_key, resource, -amount, now)

    def _shift_running(self, queue: str, resource: str, delta: int, now: int) -> None:
        state = self._decayed.get((queue, resource), _Decayed(0.0, now, 0))
        value = _advance(state, now, self.half_life_seconds)
        self._decayed[(queue, resource)] = _Decayed(value, now, state.running + delta)

    # --- reading -----------------------------------------------------------------------

    def hours(self, as_of: datetime | None = None) -> dict[HourKey, int]:
        """Amount * microseconds per hour and key: the closed allocations, and
        the open ones charged up to ``as_of`` (default: the last entry's time)."""
        end = self.clock_us if as_of is None else max(self.clock_us, micros(as_of))
        result = dict(self._hours)
        for allocation in self._open.values():
            _charge_hours(allocation, end, result)
        return {k: v for k, v in result.items() if v}

    def ran_hours(self) -> dict[HourKey, int]:
        """Amount * microseconds that ran, per hour and key (as :meth:`hours`)."""
        return self._ran.hours()

    def report(
        self,
        granularity: Granularity = "day",
        by: Sequence[str] = ("namespace",),
        as_of: datetime | None = None,
    ) -> list[UsageRow]:
        """Held and ran resource-hours per period, group and resource."""
        return rows(self.hours(as_of), granularity, by, self.ran_hours())

    def local_queue_usage(self, as_of: datetime | None = None) -> dict[str, LocalQueueUsage]:
        """The engine's admission fair-sharing input, per LocalQueue key."""
        end = self.clock_us if as_of is None else max(self.clock_us, micros(as_of))
        rate = math.log(2) / self.half_life_seconds
        consumed: dict[str, dict[str, float]] = defaultdict(dict)
        for (queue, resource), state in sorted(self._decayed.items()):
            value = _advance(state, end, self.half_life_seconds) * rate
            if value > 0:
                consumed[queue][resource] = value
        return {
            queue: LocalQueueUsage(consumed=usage, last_update=end / 1e6)
            for queue, usage in consumed.items()
        }


def _advance(state: _Decayed, now: int, half_life_seconds: float) -> float:
    """The decayed integral at ``now``: the old value decays, and what ran
    since ``at_us`` adds ``running * (1 - decay) / λ``."""
    elapsed = max(0, now - state.at_us) / 1e6
    decay = math.pow(0.5, elapsed / half_life_seconds)
    rate = math.log(2) / half_life_seconds
    return state.value * decay + state.running * (1.0 - decay) / rate


def _charge_hours(allocation: Allocation, end_us: int, into: dict[HourKey, int]) -> None:
    start = allocation.start_us
    if end_us <= start:
        return
    ns, lq, cq, cluster = (
        allocation.namespace,
        allocation.local_queue,
        allocation.cluster_queue,
        allocation.cluster,
    )
    for hour in range(start // HOUR_US, (end_us - 1) // HOUR_US + 1):
        overlap = min(end_us, (hour + 1) * HOUR_US) - max(start, hour * HOUR_US)
        for flavor, resource, amount in allocation.reserved:
            key = (hour, ns, lq, cq, cluster, flavor, resource)
            into[key] = into.get(key, 0) + amount * overlap


# --- from scratch ------------------------------------------------------------------------


def allocations(entries: Iterable[LedgerEntry]) -> Iterator[tuple[Allocation, int | None]]:
    """Every allocation in the ledger with its end in ledger time (``None``
    while it still runs), in the order they end, then the open ones."""
    clock = 0
    running: dict[str, Allocation] = {}
    for entry in entries:
        clock = max(clock, micros(entry.recorded_at))
        ended: list[str] = []
        if entry.kind == "workload.admitted" or entry.kind in RELEASING:
            ended = [_workload_key(entry.body)]
        elif entry.kind == "cluster.lost":
            ended = [k for k, a in running.items() if a.cluster == entry.body["cluster"]]
        for key in ended:
            if key in running:
                yield running.pop(key), clock
        if entry.kind == "workload.admitted":
            running[_workload_key(entry.body)] = Allocation.of(entry.body, clock)
    for allocation in running.values():
        yield allocation, None


def hours_from_scratch(
    entries: Iterable[LedgerEntry], as_of: datetime | None = None
) -> dict[HourKey, int]:
    """What :meth:`UsageRollup.hours` must equal, recomputed from the entries."""
    materialised = list(entries)
    last = max((micros(e.recorded_at) for e in materialised), default=0)
    end_of_open = last if as_of is None else max(last, micros(as_of))
    result: dict[HourKey, int] = {}
    for allocation, end in allocations(materialised):
        _charge_hours(allocation, end_of_open if end is None else end, result)
    return {k: v for k, v in result.items() if v}


def decayed_from_scratch(
    entries: Iterable[LedgerEntry], as_of: datetime, half_life_seconds: float
) -> dict[str, dict[str, float]]:
    """Closed form of the decayed usage: each allocation ``A`` over ``[a, b]``
    contributes ``A (e^(-λ(t-b)) - e^(-λ(t-a)))``, in the units of
    :meth:`UsageRollup.local_queue_usage`."""
    materialised = list(entries)
    t = max([micros(as_of), *(micros(e.recorded_at) for e in materialised)]) / 1e6
    rate = math.log(2) / half_life_seconds
    result: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for allocation, end in allocations(materialised):
        a = allocation.start_us / 1e6
        b = t if end is None else end / 1e6
        weight = math.exp(-rate * (t - b)) - math.exp(-rate * (t - a))
        for resource, amount in allocation.per_resource().items():
            result[allocation.queue_key][resource] += amount * weight
    return {q: {r: v for r, v in u.items() if v > 0} for q, u in result.items() if any(u.values())}


# --- the audit: open usage against what the members run ---------------------------------


@dataclass(frozen=True, slots=True)
class Holding:
    """What one gang holds on a member cluster: ``{resource: amount}`` in
    canonical units (as a ledger entry's ``reserved``, summed over flavors)."""

    cluster: str
    amounts: Mapping[str, int]


def open_usage(
    entries: Iterable[LedgerEntry], as_of: datetime | None = None
) -> dict[str, Allocation]:
    """The allocations open at ``as_of`` (default: after the last entry), by
    ``namespace/workload``, from the ledger alone: admitted and not yet
    released by a ``workload.finished``, ``.preempted``, ``.evicted`` or the
    ``cluster.lost`` of its cluster. Entries recorded after ``as_of`` are
    not read."""
    limit = None if as_of is None else micros(as_of)
    materialised = [e for e in entries if limit is None or micros(e.recorded_at) <= limit]
    return {a.workload: a for a, end in allocations(materialised) if end is None}


def double_closes(entries: Iterable[LedgerEntry]) -> list[str]:
    """Releases of a workload that holds nothing then: a second close of one
    admission (or a close without one). Each way a gang stops holding
    capacity writes exactly one, so this is empty on a sound ledger."""
    holding: set[str] = set()
    problems: list[str] = []
    for entry in entries:
        if entry.kind == "workload.admitted":
            holding.add(_workload_key(entry.body))
        elif entry.kind in RELEASING:
            key = _workload_key(entry.body)
            if key not in holding:
                problems.append(f"entry {entry.seq}: {entry.kind} of {key}, which held nothing")
            holding.discard(key)
    return problems


def usage_mismatches(
    open_allocations: Mapping[str, Allocation],
    running: Mapping[str, Holding],
    resources: Collection[str] | None = None,
) -> list[str]:
    """Everything that differs between the ledger's open usage and what the
    member clusters run (by ``namespace/workload``): a gang billed but not
    running, running but not billed, or billed elsewhere or for other
    amounts (of ``resources`` only, when given). Empty when the ledger is
    right."""
    problems: list[str] = []
    for key in sorted(set(open_allocations) | set(running)):
        allocation, held = open_allocations.get(key), running.get(key)
        if held is None:
            problems.append(
                f"{key}: open in the ledger on {allocation and allocation.cluster}, "
                "running on no member"
            )
        elif allocation is None:
            problems.append(f"{key}: running on {held.cluster}, not open in the ledger")
        elif allocation.cluster != held.cluster:
            problems.append(f"{key}: open on {allocation.cluster}, running on {held.cluster}")
        else:

            def wanted(resource: str) -> bool:
                return resources is None or resource in resources

            billed = {r: a for r, a in allocation.per_resource().items() if a and wanted(r)}
            ran = {r: int(a) for r, a in held.amounts.items() if a and wanted(r)}
            if billed != ran:
                problems.append(f"{key}: billed {billed}, running {ran}")
    return problems


def audit(
    entries: Iterable[LedgerEntry],
    running: Mapping[str, Holding],
    as_of: datetime | None = None,
    resources: Collection[str] | None = None,
) -> list[str]:
    """The ledger against the members at one instant: no admission closed
    twice, and the open usage (of ``resources``, when given) equals what
    the members run."""
    materialised = list(entries)
    billed = open_usage(materialised, as_of)
    return double_closes(materialised) + usage_mismatches(billed, running, resources)


# --- reports -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UsageRow:
    period: datetime
    group: tuple[tuple[str, str], ...]
    resource: str
    hours: float
    """Held resource-hours in human units: devices, cores or GiB times hours."""
    ran: float = 0.0
    """Resource-hours that ran, by the members' timestamps, in the same units."""

    @property
    def held(self) -> float:
        return self.hours


_SCALE: Final = {"cpu": 1000.0, "memory": float(2**30)}


def resource_hours(resource: str, amount_micros: int) -> float:
    return amount_micros / HOUR_US / _SCALE.get(resource, 1.0)


def period_start(hour: int, granularity: Granularity) -> datetime:
    moment = EPOCH + timedelta(hours=hour)
    if granularity == "day":
        return moment.replace(hour=0)
    if granularity == "month":
        return moment.replace(day=1, hour=0)
    return moment


def rows(
    hours: Mapping[HourKey, int],
    granularity: Granularity,
    by: Sequence[str],
    ran: Mapping[HourKey, int] | None = None,
) -> list[UsageRow]:
    """Sum hourly usage (held, and ``ran``) into periods, grouped by the
    ``by`` dimensions."""
    unknown = set(by) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"unknown dimensions {sorted(unknown)}; known: {DIMENSIONS}")
    positions = [DIMENSIONS.index(d) + 1 for d in by]
    totals: dict[tuple[datetime, tuple[str, ...], str], list[int]] = defaultdict(lambda: [0, 0])
    for column, source in enumerate((hours, ran or {})):
        for key, value in source.items():
            group = tuple(str(key[p]) for p in positions)
            totals[(period_start(key[0], granularity), group, key[6])][column] += value
    return [
        UsageRow(
            period,
            tuple(zip(by, group, strict=True)),
            resource,
            resource_hours(resource, held),
            resource_hours(resource, ran_us),
        )
        for (period, group, resource), (held, ran_us) in sorted(totals.items())
    ]
