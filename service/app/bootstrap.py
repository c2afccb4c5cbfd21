"""The composition root: the one place that picks every adapter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine

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


def bootstrap(settings: Settings, database_url: str | None = None) -> Services:
    url = database_url or settings.database_url
    if not url:
        raise ValueError("no database configured: set QM_DATABASE_URL")
    engine = make_engine(url)
    return Services(
        settings=settings,
        engine=engine,
        events=PostgresEventStore(engine),
        ledger=PostgresLedgerReader(engine),
        projections=ProjectionRunner(engine, all_projections()),
        unit_of_work=lambda: SqlUnitOfWork(engine),
    )
