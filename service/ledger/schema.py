"""Tables of the ledger chain."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from service.eventstore.schema import NAMING

metadata = MetaData(naming_convention=NAMING)

ledger_entries = Table(
    "ledger_entries",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("entry_id", Uuid, nullable=False),
    Column("kind", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("body", JSONB, nullable=False),
    Column("prev_hash", LargeBinary(32), nullable=False),
    Column("entry_hash", LargeBinary(32), nullable=False),
    UniqueConstraint("entry_id"),
    Index("ix_ledger_entries_kind_recorded_at", "kind", "recorded_at"),
    Index("ix_ledger_entries_recorded_at", "recorded_at"),
    # Every field filter of service/ledger/query.py is a containment on body.
    Index(
        "ix_ledger_entries_body",
        "body",
        postgresql_using="gin",
        postgresql_ops={"body": "jsonb_path_ops"},
    ),
)

# Every published checkpoint (a signed C2SP note), one per tree size; append-only.
ledger_checkpoints = Table(
    "ledger_checkpoints",
    metadata,
    Column("tree_size", BigInteger, primary_key=True, autoincrement=False),
    Column("origin", Text, nullable=False),
    Column("root_hash", LargeBinary(32), nullable=False),
    Column("note", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# The chain's tip: its row lock serialises appenders exactly as event_head does.
ledger_head = Table(
    "ledger_head",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("seq", BigInteger, nullable=False),
    Column("entry_hash", LargeBinary(32), nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)
