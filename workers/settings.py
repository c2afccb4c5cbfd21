"""The workers' own knobs (prefix ``QM_``, like the service's settings)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
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
