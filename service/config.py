"""Settings from the environment, prefix ``QM_`` (see DESIGN.md, "Contracts")."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service. Defaults suit standalone mode on one machine."""

    model_config = SettingsConfigDict(env_prefix="QM_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of Postgres (postgresql+psycopg://...). "
        "Unset: standalone mode starts an embedded Postgres in the data directory.",
    )
    broker_url: str | None = Field(
        default=None,
        description="Redis URL for Celery. Unset: standalone mode starts an embedded Redis.",
    )
    data_dir: Path = Field(
        default=Path(".qm-data"),
        description="Where standalone mode keeps its embedded databases and state.",
    )
    secret_key: str = Field(
        default="dev-insecure-secret-key-change-me",
        description="Encrypts member-cluster credentials at rest.",
    )
    secret_key_previous: str | None = Field(
        default=None,
        description="The QM_SECRET_KEY before this one, while it is rotated: what it sealed is "
        "still opened, nothing new is sealed with it; `quartermaster secrets rotate` re-seals "
        "every stored credential under QM_SECRET_KEY, after which it may be dropped.",
    )
    ledger_signing_key: str | None = Field(
        default=None,
        description="Ed25519 private key (base64, 32 bytes) that signs ledger checkpoints.",
    )
    bootstrap_token: str | None = Field(
        default=None, description="When set, an admin bearer token valid from start-up."
    )
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    db_pool_size: int = Field(default=10, description="Connections per API process.")
    api_threads: int = Field(
        default=8, ge=1, description="Threads per API process that run blocking handlers."
    )
    max_body_bytes: int = Field(
        default=1 << 20, description="Largest request body, except bulk submissions."
    )
    max_bulk_body_bytes: int = Field(default=64 << 20, description="Largest bulk submission body.")
    rate_limit_per_second: float = Field(
        default=500.0,
        gt=0,
        description="Sustained requests per second per principal, shared by every API process "
        "through Redis (per process while Redis cannot be reached).",
    )
    rate_limit_burst: int = Field(default=1000, ge=1, description="Burst size per principal.")
    rate_limit_anonymous_per_second: float = Field(
        default=100.0,
        gt=0,
        description="Sustained requests per second per client address, for requests whose "
        "principal is not known yet (a token not seen before, a made-up one, none).",
    )
    rate_limit_anonymous_burst: int = Field(
        default=200, ge=1, description="Burst size per client address."
    )
    rate_limit_redis_url: str | None = Field(
        default=None,
        description="Redis URL of the shared rate limits. Unset: the broker's, when it is Redis; "
        "else per API process.",
    )
    trusted_proxies: str = Field(
        default="",
        description="Comma-separated addresses or CIDR networks of the reverse proxies whose "
        "X-Forwarded-For names the client (the address unauthenticated requests are rate "
        "limited by): the rightmost address in it that is not itself a trusted proxy, as "
        "uvicorn's ProxyHeadersMiddleware reads it, and only when the peer is one. Empty: the "
        "peer's address is the client's, whatever the headers say.",
    )
    max_in_flight: int = Field(
        default=256,
        ge=1,
        description="Requests in flight per API process beyond which new ones are answered 503 "
        "at once (they would queue for its threads and database connections).",
    )
    max_submission_backlog: int = Field(
        default=2048,
        ge=1,
        description="Submissions waiting for the group commit beyond which new requests are "
        "answered 503 at once.",
    )
    idempotency_ttl_seconds: int = Field(
        default=24 * 3600, description="How long an Idempotency-Key's response is kept."
    )
    oidc_issuer: str | None = Field(default=None, description="OIDC issuer URL (iss claim).")
    oidc_audience: str | None = Field(default=None, description="Expected aud claim.")
    oidc_jwks_url: str | None = Field(default=None, description="The issuer's JWKS URL.")
    oidc_roles_claim: str = Field(default="groups", description="Claim holding role names.")
    oidc_namespaces_claim: str = Field(
        default="namespaces", description="Claim holding a submitter's namespaces."
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: str) -> str:
        for item in filter(None, (part.strip() for part in value.split(","))):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or CIDR network") from None
        return value

    @property
    def trusted_proxy_networks(self) -> list[str]:
        """``trusted_proxies`` as networks, for uvicorn's ProxyHeadersMiddleware
        (which would take ``10.0.0.1/8``, host bits set, for a host name)."""
        parts = (part.strip() for part in self.trusted_proxies.split(","))
        return [str(ipaddress.ip_network(part, strict=False)) for part in parts if part]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
