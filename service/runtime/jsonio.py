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
import re
from typing import Any

import orjson

#: A run of digits that may be an integer past 64 bits, which orjson reads
#: as a float (losing digits) where ``json.loads`` keeps it exact. Digits
#: inside strings match too: such a document only takes the slow path.
_LONG_NUMBER = re.compile(rb"\d{19}")


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads``: a document orjson refuses (NaN, or not JSON at all) or
    might read differently (a long number) is read, or refused with its
    words, by ``json.loads``."""
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


__all__ = ["dumps", "loads"]
