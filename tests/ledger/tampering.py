"""Editing the stored ledger the way only a superuser can: triggers off
(``session_replication_role = replica``) and, where the edit would break it,
migration 0007's constraint that ties the columns to ``entry_bytes`` dropped
— or dropped and added back NOT VALID, to hide that it was."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import pytest
import sqlalchemy as sa

from service.ledger.schema import (
    ENTRY_MATCHES_CALL,
    ENTRY_MATCHES_CONSTRAINT,
    ENTRY_MATCHES_SOURCE,
)

Guard = Literal["keep", "drop", "hide"]

_FUNCTION = (
    "CREATE OR REPLACE FUNCTION qm_ledger_entry_matches(entry_bytes bytea, seq bigint, "
    "entry_id uuid, kind text, recorded_at timestamptz, body jsonb, prev_hash bytea) "
    "RETURNS boolean LANGUAGE plpgsql STABLE SET search_path = pg_catalog "
    "AS $fn${source}$fn$"
)


def tamper(engine: sa.Engine, *statements: str, guard: Guard = "keep") -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        if guard != "keep":
            conn.exec_driver_sql(
                f"ALTER TABLE ledger_entries DROP CONSTRAINT {ENTRY_MATCHES_CONSTRAINT}"
            )
        for statement in statements:
            conn.exec_driver_sql(statement)
        if guard == "hide":
            conn.exec_driver_sql(
                f"ALTER TABLE ledger_entries ADD CONSTRAINT {ENTRY_MATCHES_CONSTRAINT} "
                f"CHECK ({ENTRY_MATCHES_CALL}) NOT VALID"
            )


def replace_function(engine: sa.Engine, source: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(_FUNCTION.format(source=source))


@pytest.fixture
def superuser(engine: sa.Engine) -> Iterator[sa.Engine]:
    """The engine, and afterwards the ledger emptied and migration 0007's
    function and constraint as they were (the database outlives the test)."""
    yield engine
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        conn.exec_driver_sql("TRUNCATE ledger_entries, ledger_checkpoints")
        conn.exec_driver_sql(
            "UPDATE ledger_head SET seq = 0, entry_hash = decode(repeat('00', 32), 'hex')"
        )
        conn.exec_driver_sql(_FUNCTION.format(source=ENTRY_MATCHES_SOURCE))
        conn.exec_driver_sql(
            f"ALTER TABLE ledger_entries DROP CONSTRAINT IF EXISTS {ENTRY_MATCHES_CONSTRAINT}"
        )
        conn.exec_driver_sql(
            f"ALTER TABLE ledger_entries ADD CONSTRAINT {ENTRY_MATCHES_CONSTRAINT} "
            f"CHECK ({ENTRY_MATCHES_CALL})"
        )
