"""JSON for hot paths: orjson where it reads and writes what ``json`` would,
the standard library where it cannot.

orjson is several times faster, but reads an integer past 64 bits as a float
(losing digits) and refuses what ``json`` accepts (a non-string key, an
integer past 64 bits when writing). Such documents take the slow path, so the
result is always what ``json`` would give. The workers' passes and the
member-cluster stand-in use it; the API's body parser and the event store
have their own variants (they must also refuse what cannot be stored).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

#: A run of 19 digits may be an integer past 64 bits, which orjson reads as
#: a float (losing digits) where ``json.loads`` keeps it exact. Digits inside
#: strings count too: such a document only takes the slow path. Found as a
#: substring once every ASCII digit reads "0" and every other byte ".": a
#: regular expression (``\d{19}``) took longer than orjson's whole parse,
#: this a small fraction of it.
_DIGITS = bytes(ord("0") if chr(b) in "0123456789" else ord(".") for b in range(256))
_LONG_RUN = b"0" * 19


def _long_number(data: bytes) -> bool:
    return _LONG_RUN in data.translate(_DIGITS)


def read_fast(data: bytes) -> tuple[bool, Any]:
    """``(True, document)`` where orjson reads ``data`` as ``json.loads``
    would; ``(False, None)`` where only ``json.loads`` can say (a long number
    orjson would read differently, NaN, or not JSON at all: it then reads it,
    or refuses it with its own words)."""
    if _long_number(data):
        return False, None
    try:
        return True, orjson.loads(data)
    except orjson.JSONDecodeError:
        return False, None


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads``, by orjson where it reads the same (:func:`read_fast`)."""
    data = bytes(raw) if isinstance(raw, memoryview) else raw
    if isinstance(data, str):
        data = data.encode()
    fast, document = read_fast(bytes(data))
    return document if fast else json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON; what orjson refuses (a non-string key, an integer past
    64 bits) is written by ``json.dumps``."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, separators=(",", ":")).encode()


__all__ = ["dumps", "loads", "read_fast"]
