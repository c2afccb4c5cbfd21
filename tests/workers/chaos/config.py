"""What a fault run is made of: its members, teams, settings, faults and size."""

from __future__ import annotations

from dataclasses import dataclass

from tests.workers.stack import (
    FAST,
)

WORKLOAD_LABEL = "quartermaster.dev/workload"
ADMISSION_LABEL = "quartermaster.dev/admission"
TEAMS = ("team-a", "team-b")
#: The WorkloadPriorityClass of the high-priority gangs (``Size.high_every``).
HIGH = "high"
MEMBERS = ("m1", "m2", "m3")
#: Quick cycles and heartbeats, and fencing consistent as workers/settings.py
#: demands: the write window W = 2 x 1 s heartbeats + 1 s + 3 s timeouts = 6 s;
#: the margin covers a 0.5 s poll, 1.5 s to stop and 1 % drift of the 10 s
#: fence time; the lease is at least 10 + 3 + 6. A fence time longer than the
#: Postgres outage keeps that outage from fencing every member.
SETTINGS = {
    **FAST,
    "QM_RESYNC_INTERVAL": "0.5",
    "QM_HEARTBEAT_INTERVAL": "1",
    "QM_MEMBER_CONNECT_TIMEOUT": "1",
    "QM_MEMBER_READ_TIMEOUT": "3",
    "QM_FENCE_TIME": "10",
    "QM_FENCE_POLL_INTERVAL": "0.5",
    "QM_FENCE_STOP_TIME": "1.5",
    "QM_FENCE_MARGIN": "3",
    "QM_CLUSTER_LEASE": "20",
}
FAULTS = ("worker", "scheduler", "api", "redis", "postgres", "partition", "member-kill")


@dataclass(frozen=True)
class Size:
    """How big a run is."""

    #: Submissions per second, for the whole run until the drain.
    rate: float = 1.0
    #: Seconds of load before the first fault, and after each recovery.
    warmup: float = 15.0
    between: float = 8.0
    #: How long each gang runs on a member, real seconds (uniform).
    run_seconds: tuple[float, float] = (2.0, 8.0)
    #: Every n-th submission is a long gang of 4 GPUs running this long (real
    #: seconds): longer than the fence time, so that a partition finds some
    #: that its member's agent must stop, and longer than the lease.
    long_every: int = 8
    long_seconds: tuple[float, float] = (40.0, 50.0)
    #: A partition is aimed at the member running the most long gangs that
    #: began running in the last ``fresh`` seconds (so that they still run
    #: when the centre requeues them, a lease later).
    fresh: float = 10.0
    #: 8-GPU nodes per member (one fabric island).
    nodes: int = 6
    seed: int = 18
    #: Stand-ins' simulated time per real second's worth (``--time-scale``).
    time_scale: float = 0.01
    #: Which members run a fence agent (``m2``'s is what keeps the partition safe).
    agents: tuple[str, ...] = MEMBERS
    #: Faults to inject, in :data:`FAULTS` order.
    faults: tuple[str, ...] = FAULTS
    #: Workloads created behind the client's back (to see ``unexpected`` catch them).
    rogue: int = 0
    #: Every n-th acknowledged gang is cancelled within ``cancel_within``
    #: seconds of its 201 (pending, starting or running by then); 0: none.
    cancel_every: int = 0
    cancel_within: float = 6.0
    #: Every n-th gang has a high priority (its ClusterQueue preempts lower
    #: ones for it); 0: none.
    high_every: int = 0
    #: Each team's nominal quota as a share of the fleet's GPUs split evenly,
    #: with as much again to borrow; below 1, and with ``preemption``, teams
    #: borrow and reclaim from each other (reclaimWithinCohort: Any,
    #: withinClusterQueue: LowerPriority).
    nominal_fraction: float = 1.0
    preemption: bool = False
