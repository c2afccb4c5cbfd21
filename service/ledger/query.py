"""Auditors' questions of the ledger: filters and cursor paging.

A :class:`LedgerQuery` says which entries; :func:`matches` answers it for one
entry in memory (the specification, and what the in-memory ledger uses) and
:func:`where_clause` turns it into SQL for Postgres. Every field filter is a
JSONB containment (``body @> {...}``) so that one GIN ``jsonb_path_ops`` index
on ``body`` serves them all; ``kind`` and the time range are plain columns.

Field filters follow the top-level naming of ``service/ledger/entries.py``:
``namespace``, ``local_queue``, ``cluster_queue``, ``cluster``, ``workload``,
``actor``. ``flavor`` matches an entry that reserved, released or consumed
anything of that flavor.

Paging is by ``seq``: a page ends with the ``seq`` to pass as ``after_seq``
(or ``before_seq`` for newest-first) to get the next one, so pages are stable
while the ledger grows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final

from service.ledger.chain import LedgerEntry

FIELD_FILTERS: Final = ("namespace", "local_queue", "cluster_queue", "cluster", "workload", "actor")
FLAVOR_KEYS: Final = ("reserved", "released", "consumed")
MAX_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class LedgerQuery:
    namespace: str | None = None
    local_queue: str | None = None
    cluster_queue: str | None = None
    cluster: str | None = None
    workload: str | None = None
    actor: str | None = None
    flavor: str | None = None
    kinds: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    after_seq: int | None = None
    before_seq: int | None = None
    newest_first: bool = False
    limit: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"limit is between 1 and {MAX_LIMIT}")
        if self.since and self.until and self.since >= self.until:
            raise ValueError("since must be before until")

    def field_values(self) -> dict[str, str]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name in FIELD_FILTERS and getattr(self, f.name) is not None
        }


def matches(entry: LedgerEntry, query: LedgerQuery) -> bool:
    """Does ``entry`` answer ``query`` (ignoring paging)?"""
    body: Mapping[str, Any] = entry.body
    if any(body.get(name) != value for name, value in query.field_values().items()):
        return False
    if query.flavor is not None and not any(
        isinstance(body.get(key), dict) and isinstance(body[key].get(query.flavor), dict)
        for key in FLAVOR_KEYS
    ):
        return False
    if query.kinds and entry.kind not in query.kinds:
        return False
    if query.since is not None and entry.recorded_at < query.since:
        return False
    return query.until is None or entry.recorded_at < query.until


def page(entries: Sequence[LedgerEntry], query: LedgerQuery) -> list[LedgerEntry]:
    """One page of ``entries`` (in ``seq`` order) in memory: the reference
    for the SQL below, and the fake's implementation."""
    found = [
        e
        for e in entries
        if matches(e, query)
        and (query.after_seq is None or e.seq > query.after_seq)
        and (query.before_seq is None or e.seq < query.before_seq)
    ]
    if query.newest_first:
        found.reverse()
    return found[: query.limit]


def where_clause(query: LedgerQuery) -> tuple[str, dict[str, Any]]:
    """SQL conditions (ANDed, ``TRUE`` when none) and their parameters."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    values = query.field_values()
    if values:
        conditions.append("body @> %(fields)s::jsonb")
        params["fields"] = json.dumps(values)
    if query.flavor is not None:
        alternatives = []
        for i, key in enumerate(FLAVOR_KEYS):
            alternatives.append(f"body @> %(flavor_{i})s::jsonb")
            params[f"flavor_{i}"] = json.dumps({key: {query.flavor: {}}})
        conditions.append("(" + " OR ".join(alternatives) + ")")
    if query.kinds:
        conditions.append("kind = ANY(%(kinds)s)")
        params["kinds"] = list(query.kinds)
    if query.since is not None:
        conditions.append("recorded_at >= %(since)s")
        params["since"] = query.since
    if query.until is not None:
        conditions.append("recorded_at < %(until)s")
        params["until"] = query.until
    if query.after_seq is not None:
        conditions.append("seq > %(after_seq)s")
        params["after_seq"] = query.after_seq
    if query.before_seq is not None:
        conditions.append("seq < %(before_seq)s")
        params["before_seq"] = query.before_seq
    return (" AND ".join(conditions) or "TRUE"), params


def select_statement(query: LedgerQuery, columns: str) -> tuple[str, dict[str, Any]]:
    where, params = where_clause(query)
    order = "DESC" if query.newest_first else "ASC"
    params["limit"] = query.limit
    sql = f"SELECT {columns} FROM ledger_entries WHERE {where} ORDER BY seq {order} LIMIT %(limit)s"
    return sql, params
