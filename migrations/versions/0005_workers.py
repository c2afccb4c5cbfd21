"""Workers: processed outbox messages, leader epochs, admission fair-sharing
history; and a NOTIFY on every transaction that writes the outbox.

The trigger is statement-level and its payload constant, so Postgres folds a
transaction's notifications into one, delivered only at COMMIT: the relay
hears of exactly the committed rows, at once, and polls only as a fallback.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "quartermaster_app"
TABLES = ("processed_messages", "leader_epochs", "admission_usage")


def upgrade() -> None:
    op.create_table(
        "processed_messages",
        sa.Column("consumer", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column(
            "first_delivered_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("consumer", "message_id", name="pk_processed_messages"),
    )
    op.create_table(
        "leader_epochs",
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("role", name="pk_leader_epochs"),
    )
    op.create_table(
        "admission_usage",
        sa.Column("local_queue", sa.Text(), nullable=False),
        sa.Column("consumed", postgresql.JSONB(), nullable=False),
        sa.Column("last_update", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("local_queue", name="pk_admission_usage"),
    )
    op.execute(
        """
        CREATE FUNCTION qm_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('qm_outbox', '');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox "
        "FOR EACH STATEMENT EXECUTE FUNCTION qm_outbox_notify()"
    )
    tables = ", ".join(TABLES)
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {APP_ROLE}';
            END IF;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
    op.execute("DROP FUNCTION IF EXISTS qm_outbox_notify()")
    for table in reversed(TABLES):
        op.drop_table(table)
