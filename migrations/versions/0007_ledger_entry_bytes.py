"""Ledger entries keep the bytes that were hashed, tied to their columns.

``entry_bytes`` is the RFC 8785 serialisation that ``entry_hash`` hashes and
that is the entry's Merkle leaf (docs/ledger.md, "An entry"). Verifying the
live ledger then streams these bytes and hashes them as they are, instead of
decoding every ``body`` from JSONB and serialising it again (which cost three
times the 10 s budget per million entries: bench/results/README.md).

The CHECK constraint ties the queryable columns to those bytes: Postgres
refuses a row whose ``seq``, ``entry_id``, ``kind``, ``recorded_at``, ``body``
or ``prev_hash`` differ from the fields of its ``entry_bytes``, for every role
(``session_replication_role = replica`` skips triggers, not CHECKs). The live
verifier checks that this constraint is in place and validated
(service/ledger/postgres.py, ``entry_bytes_guard``), so bytes it verified
describe the columns that queries and exports read.

Existing rows are filled from their columns with the reference RFC 8785
implementation, the append-only trigger switched off for this transaction only.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import rfc8785
import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The same text as service/ledger/schema.py's ENTRY_MATCHES_SOURCE, which the
# live verifier compares with pg_proc.prosrc: a later change needs a new
# migration and a new constant together.
MATCHES_SOURCE = """
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

_BATCH = 2000


def upgrade() -> None:
    op.execute(
        "CREATE FUNCTION qm_ledger_entry_matches(entry_bytes bytea, seq bigint, entry_id uuid, "
        "kind text, recorded_at timestamptz, body jsonb, prev_hash bytea) RETURNS boolean "
        "LANGUAGE plpgsql STABLE SET search_path = pg_catalog "
        f"AS $fn${MATCHES_SOURCE}$fn$"
    )
    op.add_column("ledger_entries", sa.Column("entry_bytes", sa.LargeBinary(), nullable=True))
    op.execute("ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_append_only")
    _fill_entry_bytes(op.get_bind())
    op.execute("ALTER TABLE ledger_entries ENABLE TRIGGER ledger_entries_append_only")
    op.alter_column("ledger_entries", "entry_bytes", nullable=False)
    op.create_check_constraint(
        "ck_ledger_entries_entry_bytes",
        "ledger_entries",
        "qm_ledger_entry_matches(entry_bytes, seq, entry_id, kind, recorded_at, body, prev_hash)",
    )


def _fill_entry_bytes(conn: sa.Connection) -> None:
    select = sa.text(
        "SELECT seq, entry_id, kind, recorded_at, body, encode(prev_hash, 'hex') "
        "FROM ledger_entries WHERE seq > :after ORDER BY seq LIMIT :limit"
    )
    update = sa.text("UPDATE ledger_entries SET entry_bytes = :data WHERE seq = :seq")
    after = 0
    while rows := conn.execute(select, {"after": after, "limit": _BATCH}).all():
        conn.execute(update, [{"seq": row[0], "data": _entry_bytes(*row)} for row in rows])
        after = rows[-1][0]


def _entry_bytes(
    seq: int, entry_id: object, kind: str, recorded_at: datetime, body: object, prev_hex: str
) -> bytes:
    document = {
        "v": 1,
        "seq": seq,
        "entry_id": str(entry_id),
        "kind": kind,
        "recorded_at": recorded_at.astimezone(UTC).isoformat(),
        "body": body,
        "prev_hash": prev_hex,
    }
    return rfc8785.dumps(document)


def downgrade() -> None:
    op.drop_constraint("ck_ledger_entries_entry_bytes", "ledger_entries", type_="check")
    op.drop_column("ledger_entries", "entry_bytes")
    op.execute(
        "DROP FUNCTION qm_ledger_entry_matches"
        "(bytea, bigint, uuid, text, timestamptz, jsonb, bytea)"
    )
