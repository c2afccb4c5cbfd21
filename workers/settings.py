"""The workers' own knobs (prefix ``QM_``, like the service's settings)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.engine import EngineConfig, FairSharingConfig, WaitForPodsReadyConfig

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

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        if self.heartbeat_interval >= self.cluster_lease:
            raise ValueError(
                "QM_HEARTBEAT_INTERVAL must be shorter than QM_CLUSTER_LEASE, "
                "or a healthy cluster would be marked Lost between heartbeats"
            )
        return self

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            fair_sharing=FairSharingConfig(enable=self.fair_sharing),
            wait_for_pods_ready=WaitForPodsReadyConfig(
                enable=self.pods_ready_timeout > 0,
                timeout_seconds=self.pods_ready_timeout or 300.0,
            ),
        )


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()
