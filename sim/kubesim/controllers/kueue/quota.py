"""ClusterQueue quota arithmetic for one admission cycle: nominal quota, borrowing and
lending limits within a cohort, and Kueue's words when a request does not fit."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sim.kubesim.controllers.kueue.workload import amount_of
from sim.kubesim.quantity import resource_quantity

__all__ = ["Ledger", "Quota", "cohort_of", "quotas_of"]

Obj = dict[str, Any]


@dataclass(slots=True)
class Quota:
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None

    @property
    def lendable(self) -> int:
        return self.nominal if self.lending_limit is None else min(self.lending_limit, self.nominal)

    @property
    def guaranteed(self) -> int:
        return self.nominal - self.lendable


def quotas_of(cq: Obj) -> dict[tuple[str, str], Quota]:
    quotas = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            for resource in flavor.get("resources") or ():
                name = resource["name"]
                borrowing = resource.get("borrowingLimit")
                lending = resource.get("lendingLimit")
                quotas[(flavor["name"], name)] = Quota(
                    amount_of(name, resource.get("nominalQuota", 0)),
                    None if borrowing is None else amount_of(name, borrowing),
                    None if lending is None else amount_of(name, lending),
                )
    return quotas


def cohort_of(cq: Obj) -> str:
    spec = cq.get("spec") or {}
    return spec.get("cohortName") or spec.get("cohort") or ""


def _insufficient(resource: str, flavor: str, lack: str) -> str:
    return f"insufficient unused quota for {resource} in flavor {flavor}, {lack} more needed"


class Ledger:
    """Reserved usage per (ClusterQueue, flavor, resource) during one cycle."""

    def __init__(self, cqs: dict[str, Obj]) -> None:
        self.cqs = cqs
        self.quotas = {name: quotas_of(cq) for name, cq in cqs.items()}
        self.used: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
        self.cohorts: dict[str, list[str]] = defaultdict(list)
        for name, cq in cqs.items():
            if cohort_of(cq):
                self.cohorts[cohort_of(cq)].append(name)

    def add(self, cq: str, usage: Iterable[tuple[str, str, int]]) -> None:
        for flavor, resource, amount in usage:
            self.used[cq][(flavor, resource)] += amount

    def _cohort_free(self, cohort: str, key: tuple[str, str]) -> int:
        free = 0
        for member in self.cohorts[cohort]:
            quota = self.quotas[member].get(key)
            if quota is None:
                continue
            free += quota.lendable - max(0, self.used[member][key] - quota.guaranteed)
        return free

    def check(self, cq: str, flavor: str, resource: str, request: int) -> str | None:
        """``None`` when ``request`` more fits; else Kueue's reason."""
        key = (flavor, resource)
        quota = self.quotas[cq].get(key)
        if quota is None:
            return f"insufficient quota for {resource} in flavor {flavor} in ClusterQueue"
        used = self.used[cq][key]
        cohort = cohort_of(self.cqs[cq])

        def shown(amount: int) -> str:
            return resource_quantity(resource, amount)

        if not cohort:
            if request > quota.nominal:
                return (
                    f"insufficient quota for {resource} in flavor {flavor}, request > maximum "
                    f"capacity ({shown(request)} > {shown(quota.nominal)})"
                )
            if used + request > quota.nominal:
                return _insufficient(resource, flavor, shown(used + request - quota.nominal))
            return None
        pool = sum(
            self.quotas[m][key].lendable for m in self.cohorts[cohort] if key in self.quotas[m]
        )
        ceiling = quota.guaranteed + pool
        if quota.borrowing_limit is not None:
            ceiling = min(ceiling, quota.nominal + quota.borrowing_limit)
        if request > ceiling:
            return (
                f"insufficient quota for {resource} in flavor {flavor}, request > maximum capacity "
                f"({shown(request)} > {shown(ceiling)})"
            )
        own_free = max(0, quota.guaranteed - used)
        available = own_free + self._cohort_free(cohort, key)
        limit_left = (
            None if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit - used
        )
        if request > available or (limit_left is not None and request > limit_left):
            lack = request - min(available, limit_left if limit_left is not None else available)
            return _insufficient(resource, flavor, shown(lack))
        return None
