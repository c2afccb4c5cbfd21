"""Indexes for the workloads list filtered by state or priority class (the
console's and ``GET /v1/workloads?fieldSelector=``): each in the list's
keyset order, so that a page of a rare state is an index range, not a scan
of every workload (100,000 workloads, 1% Admitted: 38-70 ms -> well under
1 ms a page, EXPLAIN ANALYZE).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_resources_workload_state",
        "resources",
        ["kind", sa.text("(status ->> 'state'::text)"), "namespace", "name"],
    )
    op.create_index(
        "ix_resources_workload_priority_class",
        "resources",
        ["kind", sa.text("(spec ->> 'priorityClassName'::text)"), "namespace", "name"],
    )


def downgrade() -> None:
    op.drop_index("ix_resources_workload_priority_class", table_name="resources")
    op.drop_index("ix_resources_workload_state", table_name="resources")
