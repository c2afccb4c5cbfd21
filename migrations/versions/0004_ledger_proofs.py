"""Ledger proofs: published checkpoints, and indexes for the auditors' queries.

``ledger_checkpoints`` keeps every signed checkpoint (C2SP tlog-checkpoint
notes, service/ledger/checkpoint.py), one per tree size; like the entries it
is append-only, since a published checkpoint is what auditors hold us to.

One GIN ``jsonb_path_ops`` index on ``ledger_entries.body`` serves every
field and flavor filter of service/ledger/query.py (they are all JSONB
containments); a btree on ``recorded_at`` serves time ranges.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "quartermaster_app"


def upgrade() -> None:
    op.create_table(
        "ledger_checkpoints",
        sa.Column("tree_size", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("origin", sa.Text(), nullable=False),
        sa.Column("root_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("tree_size", name="pk_ledger_checkpoints"),
    )
    # qm_refuse_mutation() is 0001's: the same guard as ledger_entries.
    op.execute(
        "CREATE TRIGGER ledger_checkpoints_append_only BEFORE UPDATE OR DELETE "
        "ON ledger_checkpoints FOR EACH ROW EXECUTE FUNCTION qm_refuse_mutation()"
    )
    op.execute(
        "CREATE TRIGGER ledger_checkpoints_no_truncate BEFORE TRUNCATE "
        "ON ledger_checkpoints FOR EACH STATEMENT EXECUTE FUNCTION qm_refuse_mutation()"
    )
    op.execute("REVOKE UPDATE, DELETE, TRUNCATE ON ledger_checkpoints FROM PUBLIC")
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                EXECUTE 'GRANT SELECT, INSERT ON ledger_checkpoints TO {APP_ROLE}';
            END IF;
        END
        $$
        """
    )
    op.create_index(
        "ix_ledger_entries_body",
        "ledger_entries",
        ["body"],
        postgresql_using="gin",
        postgresql_ops={"body": "jsonb_path_ops"},
    )
    op.create_index("ix_ledger_entries_recorded_at", "ledger_entries", ["recorded_at"])


def downgrade() -> None:
    op.drop_index("ix_ledger_entries_recorded_at", table_name="ledger_entries")
    op.drop_index("ix_ledger_entries_body", table_name="ledger_entries")
    op.drop_table("ledger_checkpoints")
