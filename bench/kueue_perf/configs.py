"""Kueue's scheduler performance configs, its published figures, and the
physical limit of each.

Transcribed from kubernetes-sigs/kueue ``test/performance/scheduler`` at
commit :data:`KUEUE_COMMIT`: each config's ``generator.yaml`` (the shape of
the work) and ``rangespec.yaml`` (whose comments give the means of Kueue's
own trial runs, and whose values are the thresholds its checker enforces).
The generator's semantics (``runner/generator/generator.go``): in every
ClusterQueue each workload set runs on its own, the ``i``-th workload
(from 0) created ``(i + 1) * creationIntervalMs`` after the set began;
``runtimeMs`` counts from admission (``runner/controller/controller.go``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

KUEUE_REPO = "kubernetes-sigs/kueue"
KUEUE_COMMIT = "ff69552e79ad21652c36caa97038382e55625cf7"
KUEUE_DIR = "test/performance/scheduler"

# Kueue's topology labels (configs/tas/generator.yaml).
BLOCK_LABEL = "cloud.provider.com/topology-block"
RACK_LABEL = "cloud.provider.com/topology-rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class WorkloadClass:
    """One ``workloadsSets[]`` entry with its single workload template."""

    name: str
    count: int
    interval_ms: int
    runtime_ms: int
    priority: int
    request_milli: int  # cpu per pod, milli-cores
    pods: int = 1
    #: ``required`` | ``preferred`` | ``balanced`` | None (no topology request).
    tas: str | None = None
    tas_level: str | None = None
    slice_size: int | None = None

    @property
    def cpu_milli(self) -> int:
        """The whole workload's cpu (milli-cores)."""
        return self.request_milli * self.pods

    def arrival(self, index: int) -> float:
        """Seconds after the start at which workload ``index`` is created."""
        return (index + 1) * self.interval_ms / 1000.0


@dataclass(frozen=True)
class Topology:
    """Kueue's generated topology: blocks x racks x nodes of ``cpu`` cores."""

    blocks: int
    racks: int
    nodes_per_rack: int
    cpu: int
    memory: str


@dataclass(frozen=True)
class Config:
    """A generator config: ``cohorts`` cohorts of ``queues`` ClusterQueues,
    each with every workload class."""

    name: str
    cohorts: int
    queues: int
    nominal_milli: int
    borrowing_limit_milli: int
    reclaim_within_cohort: str
    within_cluster_queue: str
    classes: tuple[WorkloadClass, ...]
    flavor: str = "rf"
    topology: Topology | None = None

    @property
    def cluster_queues(self) -> int:
        return self.cohorts * self.queues

    @property
    def workloads(self) -> int:
        return self.cluster_queues * sum(c.count for c in self.classes)

    def scaled(self, cohorts: int | None, queues: int | None, factor: float) -> Config:
        """Fewer cohorts, queues or workloads per set (at least one), same shape."""
        classes = tuple(replace(c, count=max(1, math.ceil(c.count * factor))) for c in self.classes)
        return replace(
            self, cohorts=cohorts or self.cohorts, queues=queues or self.queues, classes=classes
        )


def cq_name(queue: int, cohort: int) -> str:
    """``fmt.Sprintf("%s-%d-%d-%s", className, queueSetIdx, queueIndex, cohortName)``."""
    return f"cq-0-{queue}-cohort-{cohort}"


def wl_name(cls: WorkloadClass, set_index: int, index: int) -> str:
    """``fmt.Sprintf("%s-%d-%d-%d", className, wlSetIdx, si, i)``."""
    return f"{cls.name}-{set_index}-{index}-0"


@dataclass(frozen=True)
class Arrival:
    """One workload of the generated load."""

    due: float  # seconds after the start
    namespace: str
    name: str
    cls: WorkloadClass


def arrivals(config: Config) -> Iterator[Arrival]:
    """Every workload with its creation time, as Kueue's generator makes them."""
    for cohort in range(config.cohorts):
        for queue in range(config.queues):
            namespace = cq_name(queue, cohort)
            for set_index, cls in enumerate(config.classes):
                for index in range(cls.count):
                    name = wl_name(cls, set_index, index)
                    yield Arrival(cls.arrival(index), namespace, name, cls)


def _baseline_classes(small: int, medium: int, large: int) -> tuple[WorkloadClass, ...]:
    return (
        WorkloadClass("small", small, 100, 200, 50, 1000),
        WorkloadClass("medium", medium, 500, 500, 100, 5000),
        WorkloadClass("large", large, 1200, 1000, 200, 20000),
    )


BASELINE = Config(
    "baseline",
    cohorts=5,
    queues=6,
    nominal_milli=20_000,
    borrowing_limit_milli=100_000,
    reclaim_within_cohort="Any",
    within_cluster_queue="LowerPriority",
    classes=_baseline_classes(350, 100, 50),
)

LARGE_SCALE = Config(
    "large-scale",
    cohorts=10,
    queues=100,
    nominal_milli=20_000,
    borrowing_limit_milli=100_000,
    reclaim_within_cohort="Any",
    within_cluster_queue="LowerPriority",
    classes=(
        WorkloadClass("small", 35, 60, 150, 50, 1000),
        WorkloadClass("medium", 11, 300, 350, 100, 5000),
        WorkloadClass("large", 4, 700, 700, 200, 20000),
    ),
)


def _tas(
    size: str, count: int, kind: str, pods: int, milli: int, slice_size: int | None = None
) -> WorkloadClass:
    interval, runtime, priority = {
        "small": (100, 200, 50),
        "medium": (500, 500, 100),
        "large": (1200, 1000, 200),
    }[size]
    return WorkloadClass(
        f"{size}-{kind}-rack",
        count,
        interval,
        runtime,
        priority,
        milli,
        pods=pods,
        tas=kind,
        tas_level=RACK_LABEL,
        slice_size=slice_size,
    )


TAS = Config(
    "tas",
    cohorts=5,
    queues=6,
    nominal_milli=20_000,
    borrowing_limit_milli=100_000,
    reclaim_within_cohort="Any",
    within_cluster_queue="LowerPriority",
    classes=(
        _tas("small", 120, "required", 2, 500),
        _tas("small", 120, "preferred", 2, 500),
        _tas("small", 110, "balanced", 2, 500, 1),
        _tas("medium", 34, "required", 4, 1250),
        _tas("medium", 33, "preferred", 4, 1250),
        _tas("medium", 33, "balanced", 4, 1250, 2),
        _tas("large", 17, "required", 8, 2500),
        _tas("large", 17, "preferred", 8, 2500),
        _tas("large", 16, "balanced", 8, 2500, 4),
    ),
    flavor="tas-flavor",
    topology=Topology(blocks=1, racks=10, nodes_per_rack=64, cpu=96, memory="256Gi"),
)

CONFIGS = {c.name: c for c in (BASELINE, LARGE_SCALE, TAS)}


# -- Kueue's published figures ---------------------------------------------------------------


def _source(config: str) -> str:
    return f"{KUEUE_REPO}@{KUEUE_COMMIT[:12]}:{KUEUE_DIR}/configs/{config}/rangespec.yaml"


#: The means of Kueue's trial runs (the rangespec comments) and the checker's
#: thresholds (the values), in seconds and percent.
PUBLISHED: dict[str, dict[str, Any]] = {
    "baseline": {
        "source": _source("baseline"),
        "runs": "5 trial runs (#1782760671465705472 …)",
        "wall_s_mean": 351.1164,
        "usage_pct_mean": 55.9,
        "usage_pct_mean_without_equivalence_hashing": 58.7,
        "time_to_admission_s_mean": {"small": 215.468, "medium": 76.768, "large": 16.501},
        "large_time_to_admission_s_mean_without_equivalence_hashing": 6.666,
        "thresholds": {
            "max_wall_s": 425.0,
            "min_usage_pct": 50.0,
            "max_mean_time_to_admission_s": {"small": 260.0, "medium": 90.0, "large": 23.0},
        },
    },
    "large-scale": {
        "source": _source("large-scale"),
        "runs": "19 periodic runs of periodic-kueue-test-large-scale-scheduling-perf-main",
        "wall_s_mean": 1179.411,
        "usage_pct_mean": 38.64,
        "time_to_admission_s_mean": {"small": 700.379, "medium": 256.413, "large": 105.604},
        "thresholds": {
            "max_wall_s": 1416.0,
            "min_usage_pct": 31.6,
            "max_mean_time_to_admission_s": {"small": 841.0, "medium": 308.0, "large": 128.0},
        },
    },
    "tas": {
        "source": _source("tas"),
        "runs": "10 CI runs (2025000801608404992 …)",
        "wall_s_mean": 401.472,
        "usage_pct_mean": 62.41,
        "time_to_admission_s_mean": {
            "large-balanced-rack": 37.862,
            "large-preferred-rack": 39.573,
            "large-required-rack": 39.625,
            "medium-balanced-rack": 106.303,
            "medium-preferred-rack": 106.324,
            "medium-required-rack": 107.071,
            "small-balanced-rack": 237.846,
            "small-preferred-rack": 246.090,
            "small-required-rack": 246.755,
        },
        "thresholds": {
            "max_wall_s": 482.0,
            "min_usage_pct": 57.0,
            "max_mean_time_to_admission_s": {
                "large-balanced-rack": 46.0,
                "large-preferred-rack": 48.0,
                "large-required-rack": 48.0,
                "medium-balanced-rack": 128.0,
                "medium-preferred-rack": 128.0,
                "medium-required-rack": 129.0,
                "small-balanced-rack": 286.0,
                "small-preferred-rack": 296.0,
                "small-required-rack": 297.0,
            },
        },
    },
}

#: What Kueue's run is, so that the figures are read for what they are.
KUEUE_SETUP = (
    "minimalkueue (core controllers and scheduler only) against envtest (an API server "
    "and etcd, no nodes and no pods except the TAS config's 640 Node objects); the runner "
    "marks each workload Finished runtimeMs after it saw it admitted; minimalkueue's "
    "client is limited to 50 QPS / burst 100 (minimalkueue/main.go); wall time is the "
    "minimalkueue process's, usage is per ClusterQueue class cpu*time held over nominal "
    "quota * monitored time (runner/recorder/recorder.go, checker/checker_test.go)"
)


# -- the physical limit ----------------------------------------------------------------------


def physical_limit(config: Config) -> dict[str, Any]:
    """The time a perfect scheduler needs, with nothing but quota in the way:
    the last arrival plus its runtime, and all the work over the total
    nominal quota (the cohorts' borrowing only moves quota, it adds none),
    and the tighter fluid bound that combines them, ``max over t of t +
    (work arriving at or after t) / quota``. The arithmetic is in ``says``."""
    quota = config.cluster_queues * config.nominal_milli / 1000.0
    per_queue = [
        (c.name, c.count * c.cpu_milli / 1000.0 * c.runtime_ms / 1000.0) for c in config.classes
    ]
    work = config.cluster_queues * sum(w for _, w in per_queue)
    last = max(config.classes, key=lambda c: c.arrival(c.count - 1) + c.runtime_ms / 1000.0)
    arrival_bound = last.arrival(last.count - 1) + last.runtime_ms / 1000.0
    work_bound = work / quota
    fluid = _fluid_bound(config, quota)
    limit = max(arrival_bound, work_bound, fluid)
    if fluid > max(arrival_bound, work_bound) + 1e-9:
        binds = "arrivals and work together"
    else:
        binds = "the work" if work_bound >= arrival_bound else "the arrivals"
    terms = " + ".join(f"{w:g} ({n})" for n, w in per_queue)
    return {
        "total_nominal_quota_cpu": quota,
        "total_work_cpu_s": round(work, 3),
        "arrival_bound_s": round(arrival_bound, 3),
        "work_bound_s": round(work_bound, 3),
        "fluid_bound_s": round(fluid, 3),
        "limit_s": round(limit, 3),
        "binds": binds,
        "says": (
            f"work per ClusterQueue = sum of count x cpu x runtime = {terms} = "
            f"{sum(w for _, w in per_queue):g} cpu·s; x {config.cluster_queues} ClusterQueues = "
            f"{work:g} cpu·s; quota = {config.cluster_queues} x "
            f"{config.nominal_milli / 1000:g} cpu = {quota:g} cpu; work / quota = "
            f"{work_bound:.2f} s. Arrivals: the last ({last.name}, #{last.count}) at "
            f"{last.count} x {last.interval_ms} ms = {last.arrival(last.count - 1):g} s, "
            f"+ {last.runtime_ms} ms runtime = {arrival_bound:.2f} s. Fluid bound "
            f"max_t(t + work arriving ≥ t / quota) = {fluid:.2f} s. Limit = "
            f"{limit:.2f} s ({binds}); usage at the limit = "
            f"{100 * work / (quota * limit):.1f} %."
        ),
    }


def _fluid_bound(config: Config, quota: float) -> float:
    """``max over arrival times t of t + (work arriving at or after t) / quota``."""
    events: dict[float, float] = {}
    for cls in config.classes:
        work = cls.cpu_milli / 1000.0 * cls.runtime_ms / 1000.0 * config.cluster_queues
        for index in range(cls.count):
            at = cls.arrival(index)
            events[at] = events.get(at, 0.0) + work
    best, later = 0.0, 0.0
    for at in sorted(events, reverse=True):
        later += events[at]
        best = max(best, at + later / quota)
    return best
