"""Indexes for the workers' per-cluster questions: which workloads are
admitted to, or evicted from, a cluster (reconcile and sync ask every pass).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_resources_workload_admission_cluster",
        "resources",
        ["kind", sa.text("((status -> 'admission'::text) ->> 'cluster'::text)")],
    )
    op.create_index(
        "ix_resources_workload_eviction_cluster",
        "resources",
        ["kind", sa.text("((status -> 'eviction'::text) ->> 'cluster'::text)")],
    )


def downgrade() -> None:
    op.drop_index("ix_resources_workload_eviction_cluster", table_name="resources")
    op.drop_index("ix_resources_workload_admission_cluster", table_name="resources")
