"""Drop ``stream_index``: no projection has written it since the stream index
projection went (issue 16, item 7).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_stream_index_category_stream", table_name="stream_index")
    op.drop_table("stream_index")


def downgrade() -> None:
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
    op.execute(
        """
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'quartermaster_app') THEN
                EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON stream_index TO quartermaster_app';
            END IF;
        END
        $$
        """
    )
