"""Reads of the central database that survive its restarts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from service.app.bootstrap import make_engine
from service.ledger.chain import LedgerEntry
from service.ledger.postgres import PostgresLedgerReader

_STATES = sa.text(
    "SELECT namespace, name, status->>'state', status->'admission'->>'cluster' "
    "FROM resources WHERE kind = 'Workload' AND NOT deleted"
)
_CLUSTER = sa.text(
    "SELECT status->>'state' FROM resources WHERE kind = 'Cluster' AND name = :name AND NOT deleted"
)
_ADMITTED_AFTER = sa.text(
    "SELECT count(*) FROM events WHERE type = 'WorkloadAdmitted' AND recorded_at > :at"
)
_RECONCILED_AFTER = sa.text(
    "SELECT count(*) FROM processed_messages WHERE outcome = 'done' "
    "AND consumer = 'reconcile.cluster' AND processed_at > :at"
)
_ADMITTED_ELSEWHERE = sa.text(
    "SELECT DISTINCT data->>'namespace' || '/' || (data->>'name') FROM events "
    "WHERE type = 'WorkloadAdmitted' AND recorded_at > :at "
    "AND data->'status'->'admission'->>'cluster' <> :cluster"
)
HOLDING = ("Admitted", "Running", "Cancelling")


class Centre:
    """Reads of the central database that survive its restarts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=2)

    def reset(self) -> None:
        self.engine.dispose()

    def _scalar(self, statement: sa.TextClause, **params: Any) -> Any:
        try:
            with self.engine.connect() as conn:
                return conn.execute(statement, params).scalar_one_or_none()
        except sa.exc.DBAPIError:
            self.engine.dispose()
            return None

    def states(self) -> dict[str, tuple[str, str | None]]:
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(_STATES).all()
        except sa.exc.DBAPIError:
            self.engine.dispose()
            return {}
        return {f"{ns}/{name}": (state or "Pending", cluster) for ns, name, state, cluster in rows}

    def cluster_state(self, name: str) -> str | None:
        value = self._scalar(_CLUSTER, name=name)
        return None if value is None else str(value)

    def work_after(self, at: float) -> dict[str, int]:
        moment = datetime.fromtimestamp(at, UTC)
        return {
            "admitted": int(self._scalar(_ADMITTED_AFTER, at=moment) or 0),
            "reconciled": int(self._scalar(_RECONCILED_AFTER, at=moment) or 0),
        }

    def admitted_elsewhere(self, cluster: str, since: float) -> set[str]:
        """The gangs admitted to a member other than ``cluster`` after ``since`` (wall time)."""
        at = datetime.fromtimestamp(since, UTC)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(_ADMITTED_ELSEWHERE, {"at": at, "cluster": cluster}).all()
        except sa.exc.DBAPIError:
            self.engine.dispose()
            return set()
        return {str(key) for (key,) in rows}

    def holding_on(self, cluster: str) -> int:
        return sum(1 for s, c in self.states().values() if s in HOLDING and c == cluster)

    def entries(self) -> list[LedgerEntry]:
        return list(PostgresLedgerReader(self.engine).entries())
