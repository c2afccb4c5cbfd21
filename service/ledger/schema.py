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

#: The constraint that ties a row's columns to its ``entry_bytes``, and the
#: body of the function it calls (migration 0007). The live verifier trusts
#: the bytes to describe the columns only while Postgres shows exactly this
#: constraint, validated, calling exactly this function: see
#: ``PostgresLedgerReader.entry_bytes_guard``.
ENTRY_MATCHES_CONSTRAINT = "ck_ledger_entries_entry_bytes"
ENTRY_MATCHES_CALL = (
    "qm_ledger_entry_matches(entry_bytes, seq, entry_id, kind, recorded_at, body, prev_hash)"
)
ENTRY_MATCHES_SOURCE = """
DECLARE
    document jsonb := convert_from(entry_bytes, 'UTF8')::jsonb;
BEGIN
    RETURN coalesce(
        document -> 'v' = '1'::jsonb
        AND document -> 'seq' = to_jsonb(seq)
        AND document ->> 'entry_id' = entry_id::text
        AND document ->> 'kind' = kind
        AND (document ->> 'recorded_at')::timestamptz = recorded_at
        AND document -> 'body' = body
        AND document ->> 'prev_hash' = encode(prev_hash, 'hex'),
        false
    );
END
"""

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
    # The RFC 8785 bytes that entry_hash hashes: the Merkle leaf (migration 0007).
    Column("entry_bytes", LargeBinary, nullable=False),
    UniqueConstraint("entry_id"),
    # The columns are the fields of entry_bytes (Postgres checks every row).
    CheckConstraint(ENTRY_MATCHES_CALL, name="entry_bytes"),
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
