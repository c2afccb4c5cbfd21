"""The composition root: the one place that picks every adapter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine

from service.app.audit import AuditService
from service.app.auth import OidcConfig, TokenService
from service.app.crypto import SecretBox
from service.app.events import EventQueries
from service.app.idempotency import IdempotencyStore
from service.app.resources import ResourceService
from service.app.submissions import SubmissionService
from service.app.uow import SqlUnitOfWork
from service.config import Settings
from service.eventstore.postgres import PostgresEventStore
from service.ledger.postgres import PostgresLedgerReader
from service.projections import ProjectionRunner, all_projections


@dataclass(frozen=True)
class Services:
    settings: Settings
    engine: Engine
    events: PostgresEventStore
    ledger: PostgresLedgerReader
    projections: ProjectionRunner
    unit_of_work: Callable[[], SqlUnitOfWork]
    authenticator: TokenService
    resources: ResourceService
    submissions: SubmissionService
    event_queries: EventQueries
    audit: AuditService
    idempotency: IdempotencyStore

    def close(self) -> None:
        self.engine.dispose()


def make_engine(database_url: str, pool_size: int = 10) -> Engine:
    return create_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=pool_size,
        # No pre-ping: it costs every transaction a round trip. A connection
        # broken by a database restart fails one request (503) and SQLAlchemy
        # then invalidates the pool, so the service recovers by itself.
        pool_pre_ping=False,
        # Appends rely on READ COMMITTED re-reads after the sequencer lock.
        isolation_level="READ COMMITTED",
    )


def _oidc(settings: Settings) -> OidcConfig | None:
    if not (settings.oidc_issuer and settings.oidc_jwks_url):
        return None
    return OidcConfig(
        issuer=settings.oidc_issuer,
        audience=settings.oidc_audience or "quartermaster",
        jwks_url=settings.oidc_jwks_url,
        roles_claim=settings.oidc_roles_claim,
        namespaces_claim=settings.oidc_namespaces_claim,
    )


def bootstrap(settings: Settings, database_url: str | None = None) -> Services:
    url = database_url or settings.database_url
    if not url:
        raise ValueError("no database configured: set QM_DATABASE_URL")
    engine = make_engine(url, settings.db_pool_size)

    def unit_of_work() -> SqlUnitOfWork:
        return SqlUnitOfWork(engine)

    secrets = SecretBox(settings.secret_key, settings.secret_key_previous)
    resources = ResourceService(engine, unit_of_work, secrets)
    return Services(
        settings=settings,
        engine=engine,
        events=PostgresEventStore(engine),
        ledger=PostgresLedgerReader(engine),
        projections=ProjectionRunner(engine, all_projections()),
        unit_of_work=unit_of_work,
        authenticator=TokenService(engine, unit_of_work, settings.bootstrap_token, _oidc(settings)),
        resources=resources,
        submissions=SubmissionService(engine, unit_of_work, resources),
        event_queries=EventQueries(engine),
        audit=AuditService(engine, settings.ledger_signing_key),
        idempotency=IdempotencyStore(engine, settings.idempotency_ttl_seconds),
    )
