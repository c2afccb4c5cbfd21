"""RFC 8785 (JCS) canonical JSON, with a fast path for the documents we hash.

The ``rfc8785`` package is the reference and is what any outside verifier
would use, but it is pure Python: too slow alone for verifying a large ledger
within the budget bench/ledger.py checks.

For documents made only of objects with ASCII keys, arrays, strings, ``true``,
``false``, ``null``, integers within ±(2**53 - 1) and non-integral floats
within 1e-4 ≤ |x| < 1e16, the standard library's C encoder with sorted keys,
no whitespace and ``ensure_ascii=False`` writes exactly the RFC 8785 bytes
(integral floats within ±(2**53 - 1) too, once written as the ints they equal):

* key order: for ASCII keys, code-point order (Python's sort) equals the
  UTF-16 code-unit order RFC 8785 §3.2.3 asks for;
* strings: both escape ``"`` and ``\\``, use ``\\b \\f \\n \\r \\t`` and
  lower-case ``\\u00xx`` for the other control characters, and write
  everything else as UTF-8 (RFC 8785 §3.2.2.2; ``json.encoder.ESCAPE_DCT``);
* integers in the I-JSON range print the same digits;
* such floats: ``repr`` and ECMAScript's Number::toString (RFC 8785
  §3.2.2.3) both print the shortest digits that round-trip, positionally.

Anything else — a very large or small float, a non-ASCII key,
a big integer, a non-JSON type — goes to
``rfc8785``, which also raises for what JCS cannot represent. The equivalence
is checked property-wise in ``tests/ledger/test_canonical.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import rfc8785

_INT_LIMIT: Final = 2**53 - 1
_FLOAT_LOW: Final = 1e-4  # below, repr switches to exponent notation (ECMAScript at 1e-7)
_FLOAT_HIGH: Final = 1e16  # from here on, repr writes exponents (ECMAScript from 1e21)
_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


class _Slow:
    """Marks a value the C encoder cannot write canonically."""


_SLOW: Final = _Slow()


def _fast(value: Any) -> Any:
    """``value`` as the C encoder writes canonically (itself, or a copy with
    integral floats as ints), or ``_SLOW``."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        return value if -_INT_LIMIT <= value <= _INT_LIMIT else _SLOW
    if kind is float:
        if value.is_integer():
            # ECMAScript writes an integral number without a fraction ("2",
            # where repr writes "2.0"): within ±(2**53 - 1) its digits are
            # the int's (-0.0 included: "0"). GPU-seconds of a run timed to
            # the second are such numbers.
            return int(value) if -_INT_LIMIT <= value <= _INT_LIMIT else _SLOW
        # repr and ECMAScript agree on positional, shortest round-trip digits
        # here; NaN and inf fail both.
        return value if _FLOAT_LOW <= abs(value) < _FLOAT_HIGH else _SLOW
    if kind is dict:
        if not all(type(key) is str and key.isascii() for key in value):
            return _SLOW
        return _fast_items(value, value.items(), dict)
    if kind is list:
        return _fast_items(value, enumerate(value), list)
    return _SLOW


def _fast_items(value: Any, items: Iterable[tuple[Any, Any]], kind: Callable[[Any], Any]) -> Any:
    """A dict or list whose items all pass ``_fast``: itself, or a copy (made
    by ``kind``) with the items that changed."""
    copy = None
    for at, item in items:
        fast = _fast(item)
        if fast is _SLOW:
            return _SLOW
        if fast is not item:
            if copy is None:
                copy = kind(value)
            copy[at] = fast
    return value if copy is None else copy


def canonical_json(document: Mapping[str, Any]) -> bytes:
    """The RFC 8785 serialisation of ``document`` (a JSON object)."""
    fast = _fast(document) if type(document) is dict else _SLOW
    if fast is not _SLOW:
        try:
            return _ENCODER.encode(fast).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: let rfc8785 raise its own error
    return rfc8785.dumps(dict(document))
