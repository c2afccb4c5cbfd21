"""The admission cycle: load, decide, write, in whoever holds the leadership
(workers/scheduler.py), which passes a ``guard`` that runs first in the
commit transaction: its fencing check."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine

from service.app.admission.caches import ConfigCache, WorkloadCache
from service.app.admission.snapshot import load
from service.app.admission.writes import CycleWrites, cycle_writes, stage
from service.app.uow import SqlUnitOfWork
from service.domain.workload import Admission
from service.engine import (
    CycleResult,
    EngineConfig,
    LocalQueueUsage,
    PreemptionBudgetState,
    Snapshot,
    admission_cycle,
)


@dataclass(frozen=True)
class CycleReport:
    result: CycleResult
    writes: CycleWrites
    pending: int
    admitted_before: int
    seconds: float
    #: ``(ClusterQueue, flavor, resource) -> amount`` held after this cycle.
    usage: Mapping[tuple[str, str, str], int]


def _reserved(admission: Admission) -> dict[str, dict[str, int]]:
    """``{flavor: {resource: amount}}`` that an engine admission reserves."""
    reserved: dict[str, dict[str, int]] = {}
    for ps in admission.pod_set_assignments:
        for resource, flavor in ps.flavors.items():
            bucket = reserved.setdefault(flavor, {})
            bucket[resource] = bucket.get(resource, 0) + ps.resource_usage.get(resource, 0)
    return reserved


def cluster_queue_usage(snapshot: Snapshot, result: CycleResult) -> dict[tuple[str, str, str], int]:
    """What each ClusterQueue holds once ``result`` is applied, per flavor
    and resource (Kueue's ``cluster_queue_resource_usage``)."""
    gone = {p.workload for p in result.preemptions} | {e.workload for e in result.evictions}
    admissions = [a.admission for a in snapshot.admitted if a.workload.key not in gone]
    admissions += [d.admission for d in result.admissions]
    usage: dict[tuple[str, str, str], int] = {}
    for admission in admissions:
        for flavor, amounts in _reserved(admission).items():
            for resource, amount in amounts.items():
                key = (admission.cluster_queue, flavor, resource)
                usage[key] = usage.get(key, 0) + amount
    return usage


Guard = Callable[[SqlUnitOfWork], None]
BeforeCommit = Callable[[SqlUnitOfWork, CycleResult], None]


class AdmissionCycle:
    """Load, decide, write. ``guard`` runs first in the commit transaction
    (the leader's fencing check); ``before_commit`` adds the caller's own
    writes to that transaction (persisted fair-sharing history)."""

    def __init__(
        self,
        engine: Engine,
        unit_of_work: Callable[[], SqlUnitOfWork],
        config: EngineConfig | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._engine = engine
        self._uow = unit_of_work
        self.config = config or EngineConfig()
        self._clock = clock
        self._cache = WorkloadCache()
        self._configuration = ConfigCache()
        #: The preemption budgets as the last committed cycle left them; ``None``
        #: (at start, after a failed cycle): derived from the ledger again.
        self.budgets: Mapping[str, PreemptionBudgetState] | None = None

    def run(
        self,
        guard: Guard,
        usage: Mapping[str, LocalQueueUsage] | None = None,
        before_commit: BeforeCommit | None = None,
    ) -> CycleReport:
        started = time.perf_counter()
        budgets, self.budgets = self.budgets, None
        loaded = load(
            self._engine, self.config, usage or {}, self._cache, self._configuration, budgets
        )
        now = self._clock()
        # The engine allocates much and frees nothing until it returns: pause the
        # collector, which would rescan the snapshot over and over (service.engine).
        collecting = gc.isenabled()
        gc.disable()
        try:
            result = admission_cycle(loaded.snapshot, now)
        finally:
            if collecting:
                gc.enable()
        writes = cycle_writes(loaded, result, now)
        self.commit(writes, guard, result, before_commit, now)
        self.budgets = result.preemption_budgets
        self._cache.written(writes.appends)
        return CycleReport(
            result=result,
            writes=writes,
            pending=len(loaded.snapshot.pending),
            admitted_before=len(loaded.snapshot.admitted),
            seconds=time.perf_counter() - started,
            usage=cluster_queue_usage(loaded.snapshot, result),
        )

    def commit(
        self,
        writes: CycleWrites,
        guard: Guard,
        result: CycleResult,
        before_commit: BeforeCommit | None,
        now: datetime,
    ) -> None:
        """One transaction: the guard, the cycle's writes, the caller's. A
        workload changed since the snapshot (cancelled, say) fails its
        expected version and the whole cycle rolls back."""
        with self._uow() as uow:
            guard(uow)
            stage(uow, writes, now)
            if before_commit is not None:
                before_commit(uow, result)
            uow.commit()
