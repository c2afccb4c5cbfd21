"""JSON decoding for the workers' hot paths: orjson where it can, the
standard library where it cannot.

Reconcile and sync decode every member listing and every workload row they
read, and the admission cycle and sync encode every row they upsert;
``json`` was the largest single cost of a pass. orjson reads and writes the
same documents several times faster; what it refuses (an integer past 64
bits, ``NaN``, a non-UTF-8 encoding) goes through ``json`` as before.
"""

from __future__ import annotations

import psycopg.types.json

from service.jsonio import dumps, loads


def postgres_json() -> None:
    """Have psycopg read and write ``json``/``jsonb`` with :func:`loads` and
    :func:`dumps` in this process (the worker and scheduler processes call it
    at start): the read-model rows a pass reads and the ones its events
    upsert."""
    psycopg.types.json.set_json_loads(loads)
    psycopg.types.json.set_json_dumps(dumps)


__all__ = ["dumps", "loads", "postgres_json"]
