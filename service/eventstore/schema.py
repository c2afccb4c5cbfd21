"""Tables of the event store and the outbox (SQLAlchemy Core metadata).

Alembic's migrations create them; ``alembic check`` compares against this.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

events = Table(
    "events",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("stream", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("event_id", Uuid, nullable=False),
    Column("type", Text, nullable=False),
    Column("data", JSONB, nullable=False),
    Column("metadata", JSONB, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("stream", "version"),
    UniqueConstraint("event_id"),
)

# The sequencer: one row whose lock every appender takes, held to commit. See
# postgres.py for why positions are allocated here and not from a SEQUENCE.
event_head = Table(
    "event_head",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("position", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("message_id", Uuid, primary_key=True),
    Column("topic", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("published_at", DateTime(timezone=True), nullable=True),
    Index(
        "ix_outbox_unpublished",
        "created_at",
        postgresql_where=text("published_at IS NULL"),
    ),
)
