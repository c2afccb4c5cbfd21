"""Bearer tokens carry an expiry: ``api_tokens.expires_at`` (null for tokens
issued before it, which never expire until revoked).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"])


def downgrade() -> None:
    op.drop_index("ix_api_tokens_name", table_name="api_tokens")
    op.drop_column("api_tokens", "expires_at")
