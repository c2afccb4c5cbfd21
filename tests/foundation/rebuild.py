"""What rebuild tests share: every projection's tables as rows, and a member
cluster with nothing of ours on it (what a finished collection finds)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from service.projections import ProjectionRunner, all_projections


def read_models(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """The read models as the commands left them (they keep them inline)."""
    tables = [table for p in all_projections() for table in p.tables]
    with engine.connect() as conn:
        return {
            table.name: [
                tuple(row) for row in conn.execute(sa.select(table).order_by(*table.primary_key))
            ]
            for table in tables
        }


def rebuild_all(engine: sa.Engine) -> None:
    """``quartermaster projections rebuild`` of every projection."""
    runner = ProjectionRunner(engine, all_projections(), batch_size=50)
    for name in runner.names:
        runner.rebuild(name)


def differences(
    live: dict[str, list[tuple[Any, ...]]], rebuilt: dict[str, list[tuple[Any, ...]]]
) -> list[str]:
    """The rows that differ, table by table, as text a failure can show."""
    found = []
    for table, rows in live.items():
        missing = [r for r in rows if r not in rebuilt[table]]
        extra = [r for r in rebuilt[table] if r not in rows]
        found += [f"{table} live:    {r}" for r in missing]
        found += [f"{table} rebuilt: {r}" for r in extra]
    return found


class EmptyMember:
    """A member cluster that answers and holds none of our objects."""

    def list_objects(self, kind: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return []

    def pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return []  # no pod of ours is left to read and let go

    def delete(self, ref: Any) -> None:  # pragma: no cover - nothing is ever listed
        raise AssertionError(f"nothing to delete, asked for {ref}")
