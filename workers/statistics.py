"""Planner statistics kept up with tables that grow faster than autovacuum looks.

Every connection of ours prepares its hot statements (psycopg prepares a
statement on its fifth execution) and Postgres then settles on a generic plan,
chosen with the statistics of that moment. On a new database, the moment is
when ``resources`` holds a few queues and no workload, and ``ledger_entries``
is empty: the plans chosen then are sequential scans and indexes on ``kind``
alone (cheapest for an empty table), and they stay cached while the tables
grow by thousands of rows a minute. Autovacuum analyzes a database at most
once a ``autovacuum_naptime`` (a minute by default): in a fresh fleet's first
busy minute, a submission's queue lookup scanned every workload and a ledger
append every entry (a large share of Postgres's CPU under bench/e2e.py).

An ANALYZE updates the statistics and invalidates the cached plans that read
the table, so every connection plans again. The admission leader looks every
few seconds for tables whose rows changed more than they held at their last
analyze (they at least doubled, or turned over entirely) and analyzes those:
a handful of times while a table grows from empty, never once autovacuum's own
thresholds (10 % of a table) keep it current.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

# Our schema's tables, with the rows they held at their last analyze (-1:
# never analyzed) and the rows changed since.
_STALE = text(
    "SELECT s.relname, greatest(c.reltuples, 0)::bigint AS analyzed, s.n_mod_since_analyze "
    "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
    "WHERE s.schemaname = current_schema() "
    "AND s.n_mod_since_analyze >= :floor "
    "AND s.n_mod_since_analyze > :factor * greatest(c.reltuples, 0) "
    "ORDER BY s.relname"
)


@dataclass(frozen=True)
class Analyzed:
    table: str
    rows_then: int
    changed: int


class StatisticsKeeper:
    """Analyzes the tables whose statistics fell ``factor`` times behind.

    ``floor`` keeps small tables out (a plan over a few hundred rows is cheap
    whatever it is); a table being analyzed by autovacuum at that moment is
    skipped, not waited for (``lock_timeout``)."""

    def __init__(
        self,
        engine: Engine,
        *,
        interval: float = 5.0,
        factor: float = 1.0,
        floor: int = 1000,
    ) -> None:
        self._engine = engine
        self.interval = interval
        self._factor = factor
        self._floor = floor
        self.stop = threading.Event()
        self.analyzed = 0

    def stale(self) -> list[Analyzed]:
        with self._engine.connect() as conn:
            rows = conn.execute(_STALE, {"floor": self._floor, "factor": self._factor})
            return [Analyzed(str(t), int(then), int(changed)) for t, then, changed in rows]

    def step(self) -> list[Analyzed]:
        """Analyze what is stale now; what it analyzed."""
        done = []
        for table in self.stale():
            if self._analyze(table.table):
                log.info(
                    "analyzed %s: %d rows changed since it was analyzed with %d",
                    table.table,
                    table.changed,
                    table.rows_then,
                )
                done.append(table)
        self.analyzed += len(done)
        return done

    def _analyze(self, table: str) -> bool:
        try:
            with self._engine.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '200ms'"))
                # The name comes from pg_stat_user_tables, quoted as an identifier.
                quoted = conn.dialect.identifier_preparer.quote(table)
                conn.execute(text(f"ANALYZE {quoted}"))
            return True
        except DBAPIError as error:
            log.info("analyze of %s skipped: %s", table, error.orig)
            return False

    def run(self, active: Callable[[], bool] = lambda: True) -> None:
        """Every ``interval`` while ``active()`` (the admission leader's
        lease: one process does this for the fleet), until ``stop``."""
        while not self.stop.wait(self.interval):
            if not active():
                continue
            try:
                self.step()
            except Exception:
                log.exception("planner statistics check failed; the next one retries")
