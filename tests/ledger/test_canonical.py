"""The fast canonical JSON writes exactly what the rfc8785 package writes."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ledger.canonical import canonical_json

keys = st.one_of(st.text(max_size=8), st.sampled_from(["a", "B", "é", "\ue000", "😀", "_", "aa"]))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
documents = st.dictionaries(
    keys,
    st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)
        ),
        max_leaves=20,
    ),
    max_size=8,
)


def reference(document: dict[str, Any]) -> bytes | type[Exception]:
    try:
        return rfc8785.dumps(document)
    except rfc8785.CanonicalizationError:
        return rfc8785.CanonicalizationError


@settings(max_examples=400, deadline=None)
@given(documents)
def test_same_bytes_as_rfc8785(document: dict[str, Any]) -> None:
    expected = reference(document)
    if expected is rfc8785.CanonicalizationError:
        with pytest.raises(rfc8785.CanonicalizationError):
            canonical_json(document)
    else:
        assert canonical_json(document) == expected


@pytest.mark.parametrize(
    "document",
    [
        {"control": '\x00\x01\x1f\b\f\n\r\t"\\/\x7f\u2028'},
        {"\ue000": 1, "😀": 2},  # UTF-16 order differs from code-point order
        {"n": 2**53 - 1, "m": -(2**53) + 1},
        {"f": 1.0, "g": 1e21, "h": 1e-7, "i": -0.0},
        {"a": 1e-4, "b": 9.999e-5, "c": 1e16 - 2, "d": 1e16, "e": 0.1, "f": -123.456},
        {"a": 1e15 + 0.5, "b": 2.0**53, "c": 5e-324, "d": 1.7976931348623157e308},
        {"nested": [{"b": 1, "a": [True, False, None]}]},
    ],
)
def test_edge_cases(document: dict[str, Any]) -> None:
    assert canonical_json(document) == rfc8785.dumps(document)


@pytest.mark.parametrize(
    "document", [{"big": 2**53}, {"s": "\ud800"}, {"x": float("inf")}, {"t": {1, 2}}]
)
def test_what_jcs_cannot_write_is_refused(document: dict[str, Any]) -> None:
    with pytest.raises(rfc8785.CanonicalizationError):
        canonical_json(document)


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_writes_as_rfc8785_does(value: float) -> None:
    assert canonical_json({"x": value, "y": [value, -value]}) == rfc8785.dumps(
        {"x": value, "y": [value, -value]}
    )
