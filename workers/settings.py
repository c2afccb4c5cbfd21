"""The workers' own knobs (prefix ``QM_``, like the service's settings)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.engine import (
    ConsolidationConfig,
    EngineConfig,
    FairSharingConfig,
    WaitForPodsReadyConfig,
)

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QM_", extra="ignore")

    database_url: str | None = None
    broker_url: str = DEFAULT_BROKER_URL
    task_time_limit: float = Field(
        default=300.0, description="Hard limit of one task; the visibility timeout exceeds it."
    )
    visibility_timeout: float = Field(
        default=3600.0,
        description="Seconds before Redis hands an unacknowledged message to another worker "
        "(a worker that died holding it). Must exceed every task's run time and countdown.",
    )
    max_deliveries: int = Field(
        default=5, description="Deliveries of one message before it is dead-lettered."
    )
    retry_backoff_max: float = Field(default=60.0, description="Longest retry countdown.")
    cycle_interval: float = Field(
        default=1.0, description="The admission cycle runs at least this often (seconds)."
    )
    cycle_spacing: float = Field(
        default=0.2,
        ge=0.0,
        description="An admission cycle begins at least this long (seconds) after the previous "
        "one began, and after a pause as long as the previous one took: wake-ups meanwhile "
        "are one cycle (each reads and checks every live workload).",
    )
    relay_poll_interval: float = Field(
        default=1.0, description="Outbox relay's fallback poll, besides LISTEN/NOTIFY."
    )
    fair_sharing: bool = Field(
        default=False, description="Kueue's fairSharing: DRS ordering and fair preemption."
    )
    consolidation: bool = Field(
        default=False,
        description="Consolidation (issue 24): a gang blocked only by fragmentation may "
        "preempt lower-priority gangs inside one island when they fit again elsewhere at "
        "once (docs/scheduling-quality.md).",
    )
    pods_ready_timeout: float = Field(
        default=0.0,
        description="waitForPodsReady: evict and requeue a gang not fully running within "
        "this many seconds of admission (0: off). Needs sync to report podsReady.",
    )

    cluster_lease: float = Field(
        default=900.0,
        description="A member cluster silent this long (seconds) is Lost and its gangs are "
        "requeued (Kueue MultiKueue's default: 15 minutes).",
    )
    heartbeat_interval: float = Field(
        default=30.0, description="Write a cluster's heartbeat at least this often (seconds)."
    )
    resync_interval: float = Field(
        default=5.0, description="Sync and reconcile every member cluster this often (seconds)."
    )
    reconcile_spacing: float = Field(
        default=0.25,
        ge=0.0,
        description="A reconcile pass of a cluster begins at least this long (seconds) after "
        "the previous one of it in the same process: passes asked for meanwhile are one.",
    )
    member_qps: float = Field(
        default=50.0,
        description="Client-side rate limit per member cluster (requests/s); client-go's 5 "
        "capped MultiKueue at 1.3 workloads/s (kueue#8564).",
    )
    member_burst: int = Field(default=100, description="Requests a member client may burst.")
    member_connect_timeout: float = Field(default=5.0, description="Seconds to connect.")
    member_read_timeout: float = Field(default=30.0, description="Seconds to read a response.")
    delete_wait: float = Field(
        default=30.0,
        description="How long a reconcile waits for deleted jobs to be gone before it "
        "dispatches (else the next pass does); in a Celery task at most half its time limit.",
    )
    secret_key: str = Field(
        default="dev-insecure-secret-key-change-me",
        description="QM_SECRET_KEY, the service's: decrypts member-cluster credentials.",
    )
    secret_key_previous: str | None = Field(
        default=None,
        description="QM_SECRET_KEY_PREVIOUS, the service's: during a rotation, decrypts what "
        "the previous key sealed.",
    )
    ledger_signing_key: str | None = Field(
        default=None,
        description="QM_LEDGER_SIGNING_KEY, the service's: signs the periodic ledger checkpoints "
        "(unset: none are made, which the scheduler logs once).",
    )
    ledger_checkpoint_interval: float = Field(
        default=60.0,
        ge=0.0,
        description="The admission leader signs a ledger checkpoint this often (seconds) when "
        "the ledger grew since the last one; 0: only on demand.",
    )

    fence_time: float | None = Field(
        default=None,
        gt=0.0,
        description="A member's fence agent stops our jobs when the centre's heartbeat to it "
        "is this old (seconds, the agent's clock). Unset: the longest the lease allows, "
        "QM_CLUSTER_LEASE - QM_FENCE_MARGIN - the write window (docs/fencing.md); none "
        "when that is not positive.",
    )
    fence_margin: float = Field(
        default=120.0,
        ge=0.0,
        description="Seconds the centre waits past the fence time before it requeues a lost "
        "member's gangs: covers the agent's poll, its stopping the jobs and clock-rate drift.",
    )
    fence_poll_interval: float = Field(
        default=10.0, gt=0.0, description="How often the fence agent reads the heartbeat."
    )
    fence_stop_time: float = Field(
        default=60.0,
        ge=0.0,
        description="Seconds the agent's deletion may take to end the jobs' pods (grace).",
    )
    fence_drift: float = Field(
        default=0.01,
        ge=0.0,
        lt=1.0,
        description="Clock-rate difference allowed between centre and agent (0.01: 1 %).",
    )

    @property
    def fence_window(self) -> float:
        """How far ahead the centre promises its heartbeat writes (two heartbeats and
        the longest write attempt): the last write may end this long after the last
        heartbeat recorded in Postgres."""
        return 2 * self.heartbeat_interval + self.member_connect_timeout + self.member_read_timeout

    @property
    def fence_seconds(self) -> float:
        """The fence time in force; 0: no fencing (a lease too short for one)."""
        if self.fence_time is not None:
            return self.fence_time
        return max(0.0, self.cluster_lease - self.fence_margin - self.fence_window)

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        if self.heartbeat_interval >= self.cluster_lease:
            raise ValueError(
                "QM_HEARTBEAT_INTERVAL must be shorter than QM_CLUSTER_LEASE, "
                "or a healthy cluster would be marked Lost between heartbeats"
            )
        fence = self.fence_seconds
        if self.fence_time is not None:
            needed = fence + self.fence_margin + self.fence_window
            if self.cluster_lease < needed:
                raise ValueError(
                    f"QM_CLUSTER_LEASE ({self.cluster_lease:g} s) must be at least "
                    f"QM_FENCE_TIME + QM_FENCE_MARGIN + the write window ({needed:g} s), "
                    "or a partitioned member's gangs could run twice (docs/fencing.md)"
                )
        if fence > 0:
            covered = self.fence_poll_interval + self.fence_stop_time + self.fence_drift * fence
            if self.fence_margin < covered:
                raise ValueError(
                    f"QM_FENCE_MARGIN ({self.fence_margin:g} s) must cover the agent's poll, "
                    f"its stop time and the drift over the fence time ({covered:g} s)"
                )
        return self

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            fair_sharing=FairSharingConfig(enable=self.fair_sharing),
            consolidation=ConsolidationConfig(enable=self.consolidation),
            wait_for_pods_ready=WaitForPodsReadyConfig(
                enable=self.pods_ready_timeout > 0,
                timeout_seconds=self.pods_ready_timeout or 300.0,
            ),
        )


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()
