"""The console's knobs, from the same ``QM_`` environment as the rest."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QM_", extra="ignore")

    console_session_hours: float = Field(
        default=8.0, gt=0, le=24 * 7, description="How long a console sign-in lasts."
    )
    console_insecure_localhost: bool = Field(
        default=False,
        description="Set the session cookie without Secure, but only for plain-HTTP "
        "requests from and to a loopback address (a browser that refuses Secure cookies "
        "on http://localhost). Off: the cookie is always Secure.",
    )
    console_stream_seconds: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description="How long one live-update stream stays open before the browser "
        "reconnects (and resumes from the last event it saw).",
    )
    # Read as the workers read them (workers/settings.py): what the pages show of them.
    fair_sharing: bool = Field(default=False, description="Kueue's fairSharing is on.")
    cluster_lease: float = Field(
        default=900.0, description="A member silent this long (seconds) is Lost."
    )
