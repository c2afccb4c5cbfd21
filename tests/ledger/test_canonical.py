"""The fast canonical JSON writes exactly what the rfc8785 package writes."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ledger.canonical import canonical_json
from service.ledger.chain import NewLedgerEntry, canonical_body, entry_document, prepare

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
        # Integral floats: the fast path writes them as the ints they equal.
        {"a": 2.0, "b": -0.0, "c": 9007199254740991.0, "d": -9007199254740991.0},
        {"e": 9007199254740992.0, "f": [1.0, {"x": 3.0, "y": "s"}], "g": 1e20},
        {"consumed": {"h100": {"cpu": 2000.0, "nvidia.com/gpu": 2.0}}, "gpu_seconds": 2.5},
    ],
)
def test_edge_cases(document: dict[str, Any]) -> None:
    assert canonical_json(document) == rfc8785.dumps(document)


def test_integral_floats_are_written_without_touching_the_document() -> None:
    document = {"a": [1.0, {"b": 2.0}], "c": 0.5}
    assert canonical_json(document) == b'{"a":[1,{"b":2}],"c":0.5}'
    assert document == {"a": [1.0, {"b": 2.0}], "c": 0.5}
    assert type(document["a"][0]) is float and type(document["a"][1]["b"]) is float  # type: ignore[index]


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


# Sealing splices the tip's hash and the sequence number into a document
# canonicalised beforehand (service/ledger/chain.PreparedEntry): the bytes
# must be what rfc8785 makes of the whole document, whatever the body holds
# (including text that looks like the fields spliced in).
tricky_bodies = st.one_of(
    documents,
    st.just({"prev_hash": "p" * 64, "seq": 0, "x": '"prev_hash":"' + "p" * 64 + '"'}),
    st.just({"nested": {"prev_hash": "p" * 64, "v": 1, "seq": 0}}),
)


@settings(max_examples=300, deadline=None)
@given(
    body=tricky_bodies,
    seq=st.integers(1, 10**12),
    prev=st.binary(min_size=32, max_size=32),
    kind=st.text(min_size=1, max_size=12),
)
def test_a_prepared_entry_seals_to_the_canonical_bytes(
    body: dict[str, Any], seq: int, prev: bytes, kind: str
) -> None:
    item = NewLedgerEntry(uuid.UUID(int=seq), kind, body, datetime(2026, 11, 30, tzinfo=UTC))
    try:
        clean = NewLedgerEntry(item.entry_id, kind, canonical_body(body), item.recorded_at)
        expected = rfc8785.dumps(entry_document(seq, clean, prev))
    except (ValueError, rfc8785.CanonicalizationError):
        with pytest.raises((ValueError, rfc8785.CanonicalizationError)):
            prepare(item)
        return
    entry, data = prepare(item).seal(seq, prev)
    assert data == expected
    assert entry.entry_hash == hashlib.sha256(expected).digest()
    assert (entry.seq, entry.prev_hash, entry.body) == (seq, prev, clean.body)
