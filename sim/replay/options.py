"""Engine options of ``quartermaster sim replay``, parsed and checked.

Each parser takes what the command line gave and returns the engine's value,
or raises :class:`ValueError` saying what is wrong; the command turns that into
an error naming the option. The defaults are :class:`EngineConfig`'s, so a
replay with no option runs the engine as the service runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

from service.engine import (
    AdmissionFairSharingConfig,
    ConsolidationConfig,
    EngineConfig,
    ReservationConfig,
)
from service.engine.types import FairSharingConfig, FairSharingStrategy, SpreadPacking

__all__ = [
    "EngineOptions",
    "parse_budget",
    "parse_resource_weights",
    "parse_spread_packing",
    "parse_strategies",
]

STRATEGIES: tuple[str, ...] = get_args(FairSharingStrategy)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What ``sim replay`` lets one set of :class:`EngineConfig`."""

    fair_sharing: bool = False
    strategies: tuple[FairSharingStrategy, ...] = FairSharingConfig().preemption_strategies
    prioritize_non_borrowing: bool = True
    admission_fair_sharing: bool = True
    half_life_s: float = AdmissionFairSharingConfig().usage_half_life_seconds
    sampling_interval_s: float = AdmissionFairSharingConfig().usage_sampling_interval_seconds
    resource_weights: tuple[tuple[str, float], ...] = ()
    max_heads_per_cluster_queue: int | None = None
    spread_packing: SpreadPacking = "IslandFirst"
    consolidation: bool = False
    consolidation_any_victim_placement: bool = False
    reservation: bool = False
    reservation_min_accelerators: int = ReservationConfig().min_accelerators
    reservation_min_wait_s: float = ReservationConfig().min_wait_seconds
    spare_island_gangs: bool = False

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            fair_sharing=FairSharingConfig(
                enable=self.fair_sharing,
                preemption_strategies=self.strategies,
                prioritize_non_borrowing=self.prioritize_non_borrowing,
            ),
            admission_fair_sharing=AdmissionFairSharingConfig(
                enable=self.admission_fair_sharing,
                usage_half_life_seconds=self.half_life_s,
                usage_sampling_interval_seconds=self.sampling_interval_s,
                resource_weights=dict(self.resource_weights),
            ),
            max_heads_per_cluster_queue=self.max_heads_per_cluster_queue,
            spread_packing=self.spread_packing,
            consolidation=ConsolidationConfig(
                enable=self.consolidation,
                victim_placement="Any" if self.consolidation_any_victim_placement else "Immediate",
            ),
            reservation=ReservationConfig(
                enable=self.reservation,
                min_accelerators=self.reservation_min_accelerators,
                min_wait_seconds=self.reservation_min_wait_s,
            ),
            spare_island_gangs=self.spare_island_gangs,
        )


def parse_strategies(text: str) -> tuple[FairSharingStrategy, ...]:
    """``A,B``: Kueue's fair-sharing preemption strategies, tried in that order."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError(f"give at least one of {', '.join(STRATEGIES)}")
    chosen: list[FairSharingStrategy] = []
    for name in names:
        strategy = _strategy(name)
        if strategy in chosen:
            raise ValueError(f"{name} is given twice")
        chosen.append(strategy)
    return tuple(chosen)


def _strategy(name: str) -> FairSharingStrategy:
    for strategy in get_args(FairSharingStrategy):
        if strategy == name:
            return strategy  # type: ignore[no-any-return]
    raise ValueError(f"unknown strategy {name!r}; the strategies are {', '.join(STRATEGIES)}")


def parse_spread_packing(text: str) -> SpreadPacking:
    """``IslandFirst`` or ``ClusterFirst`` (``EngineConfig.spread_packing``)."""
    for value in get_args(SpreadPacking):
        if value == text:
            return value  # type: ignore[no-any-return]
    known = ", ".join(get_args(SpreadPacking))
    raise ValueError(f"unknown packing {text!r}; the packings are {known}")


def parse_resource_weights(items: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``RESOURCE=WEIGHT`` items: admission fair sharing's weight per resource."""
    weights: dict[str, float] = {}
    for item in items:
        resource, sep, value = item.partition("=")
        resource = resource.strip()
        if not sep or not resource:
            raise ValueError(f"{item!r} is not RESOURCE=WEIGHT")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: the weight is not a number") from None
        if not weight >= 0 or weight == float("inf"):
            raise ValueError(f"{item!r}: the weight must be a finite number ≥ 0")
        weights[resource] = weight
    return tuple(sorted(weights.items()))


def parse_budget(text: str) -> tuple[int, int]:
    """``N/SECONDS``: a preemption budget of N tokens refilled at N per SECONDS."""
    tokens, sep, period = text.partition("/")
    try:
        n, seconds = int(tokens), int(period)
    except ValueError:
        raise ValueError(f"{text!r} is not N/SECONDS (two whole numbers)") from None
    if not sep or n < 0 or seconds <= 0:
        raise ValueError(f"{text!r}: N must be ≥ 0 and SECONDS > 0")
    return n, seconds
