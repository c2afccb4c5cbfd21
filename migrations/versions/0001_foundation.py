"""Foundation: events, sequencer, outbox, projections, ledger chain.

Events and ledger entries are append-only from the first migration: a trigger
refuses UPDATE, DELETE and TRUNCATE for every role, and the application role
``quartermaster_app`` is granted only SELECT and INSERT on them.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPEND_ONLY = ("events", "ledger_entries")
MUTABLE = ("event_head", "outbox", "projection_tracking", "stream_index", "ledger_head")
APP_ROLE = "quartermaster_app"


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("position", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("data", postgresql.JSONB(), nullable=False),
        sa.Column("metadata", postgresql.JSONB(), nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("position", name="pk_events"),
        sa.UniqueConstraint("stream", "version", name="uq_events_stream_version"),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )
    op.create_table(
        "event_head",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_event_head_single_row"),
        sa.PrimaryKeyConstraint("id", name="pk_event_head"),
    )
    op.execute("INSERT INTO event_head (id, position) VALUES (1, 0)")
    op.create_table(
        "outbox",
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("message_id", name="pk_outbox"),
    )
    op.create_index(
        "ix_outbox_unpublished",
        "outbox",
        ["created_at"],
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "projection_tracking",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_projection_tracking"),
    )
    op.create_table(
        "stream_index",
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("category", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("last_type", sa.Text(), nullable=False),
        sa.Column("last_position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("stream", name="pk_stream_index"),
    )
    op.create_index("ix_stream_index_category_stream", "stream_index", ["category", "stream"])
    op.create_table(
        "ledger_entries",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("entry_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", postgresql.JSONB(), nullable=False),
        sa.Column("prev_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column("entry_hash", sa.LargeBinary(length=32), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_ledger_entries"),
        sa.UniqueConstraint("entry_id", name="uq_ledger_entries_entry_id"),
    )
    op.create_index("ix_ledger_entries_kind_recorded_at", "ledger_entries", ["kind", "recorded_at"])
    op.create_table(
        "ledger_head",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("entry_hash", sa.LargeBinary(length=32), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_ledger_head_single_row"),
        sa.PrimaryKeyConstraint("id", name="pk_ledger_head"),
    )
    op.execute(
        "INSERT INTO ledger_head (id, seq, entry_hash) "
        "VALUES (1, 0, decode(repeat('00', 32), 'hex'))"
    )
    _refuse_mutation()
    _grant_app_role()


def _refuse_mutation() -> None:
    op.execute(
        """
        CREATE FUNCTION qm_refuse_mutation() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'quartermaster: % on % is refused: the table is append-only',
                TG_OP, TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
        END
        $$
        """
    )
    for table in APPEND_ONLY:
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION qm_refuse_mutation()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION qm_refuse_mutation()"
        )


def _grant_app_role() -> None:
    # Roles are cluster-wide and creating one needs CREATEROLE; a migrator
    # without it leaves role management to the DBA (the triggers still hold).
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                CREATE ROLE {APP_ROLE} NOLOGIN;
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'cannot create role {APP_ROLE}; grant it yourself';
        END
        $$
        """
    )
    append_only, mutable = ", ".join(APPEND_ONLY), ", ".join(MUTABLE)
    op.execute(f"REVOKE UPDATE, DELETE, TRUNCATE ON {append_only} FROM PUBLIC")
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                EXECUTE 'GRANT USAGE ON SCHEMA public TO {APP_ROLE}';
                EXECUTE 'GRANT SELECT, INSERT ON {append_only} TO {APP_ROLE}';
                EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON {mutable} TO {APP_ROLE}';
            END IF;
        END
        $$
        """
    )


def downgrade() -> None:
    for table in ("ledger_head", "ledger_entries", "stream_index", "projection_tracking"):
        op.drop_table(table)
    op.drop_table("outbox")
    op.drop_table("event_head")
    op.drop_table("events")
    op.execute("DROP FUNCTION qm_refuse_mutation()")
