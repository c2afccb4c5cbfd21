"""Alembic environment: online migrations against ``QM_DATABASE_URL`` or the
URL placed in the config by ``service.app.migrate``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from service.eventstore.schema import metadata as eventstore_metadata
from service.ledger.schema import metadata as ledger_metadata
from service.projections.schema import metadata as projections_metadata
from workers.schema import metadata as workers_metadata

target_metadata = [eventstore_metadata, ledger_metadata, projections_metadata, workers_metadata]


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        from service.config import get_settings

        url = get_settings().database_url
    if not url:
        raise SystemExit("no database: set QM_DATABASE_URL")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
