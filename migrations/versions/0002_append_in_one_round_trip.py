"""Appends check their expected version inside the numbering INSERT.

``qm_version_conflict`` raises SQLSTATE QM409 with the stream's actual
version as DETAIL, so that an append can be sent together with its COMMIT in
one round trip and still abort the whole transaction on a stale version.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION qm_version_conflict(stream text, expected bigint, actual bigint)
        RETURNS bigint LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'stream %: expected version %, found %', stream, expected, actual
                USING ERRCODE = 'QM409', DETAIL = actual::text;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION qm_version_conflict(text, bigint, bigint)")
