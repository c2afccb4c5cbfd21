"""JSON decoding for the workers' hot paths: orjson where it can, the
standard library where it cannot.

Reconcile and sync decode every member listing and every workload row they
read, and the admission cycle and sync encode every row they upsert;
``json`` was the largest single cost of a pass. orjson reads and writes the
same documents several times faster; what it refuses (an integer past 64
bits, ``NaN``, a non-UTF-8 encoding) goes through ``json`` as before.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import psycopg.types.json

#: A run of digits that may be an integer past 64 bits, which orjson reads
#: as a float (losing digits) where ``json.loads`` keeps it exact. Digits
#: inside strings match too: such a document only takes the slow path.
_LONG_NUMBER = re.compile(rb"\d{19}")


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    data = bytes(raw) if isinstance(raw, memoryview) else raw
    if isinstance(data, str):
        data = data.encode()
    if _LONG_NUMBER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON; what orjson refuses (a non-string key, an integer past
    64 bits) is written by ``json.dumps``."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, separators=(",", ":")).encode()


def postgres_json() -> None:
    """Have psycopg read and write ``json``/``jsonb`` with :func:`loads` and
    :func:`dumps` in this process (the worker and scheduler processes call it
    at start): the read-model rows a pass reads and the ones its events
    upsert."""
    psycopg.types.json.set_json_loads(loads)
    psycopg.types.json.set_json_dumps(dumps)


__all__ = ["dumps", "loads", "postgres_json"]
