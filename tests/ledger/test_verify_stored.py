"""Verifying rows as storage keeps them (``verify_stored``, what ``verify
--live`` runs): the same mutations as tests/ledger/test_verify.py, applied to
the stored bytes and columns instead of an export, are found in every
position tried — and ``verify_ledger`` over the same ledger agrees."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence

import pytest

from service.ledger.canonical import canonical_json
from service.ledger.chain import LedgerEntry, NewLedgerEntry, seal_with_bytes
from service.ledger.checkpoint import NoteSigner
from service.ledger.export import records_of
from service.ledger.verify import StoredRow, VerifyReport, verify_ledger, verify_stored
from tests.ledger.test_verify import (
    OLDER,
    ORIGIN,
    T0,
    N,
    honest,
    new_entry,
    note_for,
    reseal,
    unsealed,
)


def stored(entries: Sequence[LedgerEntry]) -> list[StoredRow]:
    rows = []
    for entry in entries:
        item = NewLedgerEntry(entry.entry_id, entry.kind, entry.body, entry.recorded_at)
        resealed, data = seal_with_bytes(entry.seq, item, entry.prev_hash)
        assert resealed == entry
        rows.append((entry.seq, entry.prev_hash, entry.entry_hash, data))
    return rows


@pytest.fixture(scope="module")
def signer() -> NoteSigner:
    return NoteSigner.generate(ORIGIN)[0]


@pytest.fixture(scope="module")
def published(signer: NoteSigner) -> tuple[list[StoredRow], str, str]:
    entries = honest()
    return stored(entries), note_for(entries, signer), note_for(entries, signer, OLDER)


def verify(
    rows: Sequence[StoredRow], note: str, signer: NoteSigner, older: Sequence[str] = ()
) -> VerifyReport:
    return verify_stored(rows, note, signer.verifier(), older)


def test_honest_rows_verify_like_the_export(
    signer: NoteSigner, published: tuple[list[StoredRow], str, str]
) -> None:
    rows, note, older = published
    report = verify(rows, note, signer, [older])
    assert report.ok, report.problems
    assert report.entries == N and report.unsigned_tail == 0 and report.older_checked == 1
    entries = honest()
    same = verify_ledger(records_of(entries), note, signer.verifier(), [older])
    assert (report.root_hash, report.head_hash) == (same.root_hash, same.head_hash)
    assert verify(stored([]), note_for([], signer), signer).ok


def test_every_single_byte_flip_in_any_field_is_found(
    signer: NoteSigner, published: tuple[list[StoredRow], str, str]
) -> None:
    rows, note, older = published
    tried = 0
    for row, (seq, prev, stated, data) in enumerate(rows):
        for field, value in enumerate((prev, stated, data), start=1):
            for position in range(len(value)):
                for mask in (0x01, 0x20):
                    flipped = bytearray(value)
                    flipped[position] ^= mask
                    mutated: list[bytes | int] = [seq, prev, stated, data]
                    mutated[field] = bytes(flipped)
                    tampered = [*rows[:row], tuple(mutated), *rows[row + 1 :]]
                    report = verify(tampered, note, signer, [older])  # type: ignore[arg-type]
                    assert not report.ok, (row, field, position, mask)
                    tried += 1
        for wrong in (seq - 1, seq + 1, -seq):
            tampered = [*rows[:row], (wrong, prev, stated, data), *rows[row + 1 :]]
            assert not verify(tampered, note, signer, [older]).ok
    assert tried > 2 * N * 300


@pytest.mark.parametrize("position", range(N))
def test_deleted_inserted_and_swapped_rows_are_found(
    signer: NoteSigner, published: tuple[list[StoredRow], str, str], position: int
) -> None:
    rows, note, older = published
    assert not verify(rows[:position] + rows[position + 1 :], note, signer, [older]).ok
    prev = rows[position - 1][2] if position else bytes(32)
    forged, data = seal_with_bytes(
        position + 1, NewLedgerEntry(uuid.uuid4(), "quota.changed", {}, T0), prev
    )
    inserted = [*rows[:position], (forged.seq, prev, forged.entry_hash, data), *rows[position:]]
    assert not verify(inserted, note, signer, [older]).ok
    if position < N - 1:
        swapped = list(rows)
        swapped[position], swapped[position + 1] = swapped[position + 1], swapped[position]
        assert not verify(swapped, note, signer, [older]).ok
    assert not verify(rows[:position], note, signer, [older]).ok, "a cut-off tail"


@pytest.mark.parametrize("position", range(N))
def test_rewrites_with_every_hash_recomputed_are_found(
    signer: NoteSigner, published: tuple[list[StoredRow], str, str], position: int
) -> None:
    """An attacker who reseals the chain: only the signed roots can tell."""
    _, note, older = published
    items = unsealed(honest())
    body = {**items[position].body, "gpus": items[position].body["gpus"] + 1}
    items[position] = NewLedgerEntry(
        items[position].entry_id, items[position].kind, body, items[position].recorded_at
    )
    report = verify(stored(reseal(items)), note, signer, [older])
    assert not report.ok
    assert all("Merkle root" in p.reason for p in report.problems)
    moved = unsealed(honest())
    moved.insert((position + 5) % N, moved.pop(position))
    assert not verify(stored(reseal(moved)), note, signer, [older]).ok


@pytest.mark.parametrize("fork_at", range(1, N + 1))
def test_a_fork_signed_after_a_published_checkpoint_is_found(
    signer: NoteSigner, fork_at: int
) -> None:
    entries = honest()
    published = [note_for(entries, signer, size) for size in (4, 9, N)]
    items = unsealed(entries)[: fork_at - 1]
    items += [new_entry(i, tag="-fork") for i in range(fork_at - 1, N + 4)]
    forked = reseal(items)
    forked_note = note_for(forked, signer)
    assert verify(stored(forked), forked_note, signer).ok, "the fork is well-formed by itself"
    report = verify(stored(forked), forked_note, signer, published)
    assert not report.ok
    assert len(report.problems) == len([size for size in (4, 9, N) if size >= fork_at])


def test_bytes_after_the_checkpoint_must_be_the_canonical_entry(
    signer: NoteSigner, published: tuple[list[StoredRow], str, str]
) -> None:
    """No root vouches for the tail, so its bytes are parsed there: JSON that
    hashes right but is not RFC 8785, or describes another place in the chain,
    is refused; an honest tail is only counted as unsigned."""
    rows, note, older = published
    stated = rows[-1][2]
    honest_tail = [*rows, _sealed_row(N + 1, stated)]
    report = verify(honest_tail, note, signer, [older])
    assert report.ok and report.unsigned_tail == 1
    strict = verify_stored(honest_tail, note, signer.verifier(), [older], strict=True)
    assert not strict.ok

    document = json.loads(_sealed_row(N + 1, stated)[3])
    spaced = json.dumps(document, separators=(", ", ": "), sort_keys=True).encode()
    not_canonical = "stored bytes are not the RFC 8785 form of an entry"
    elsewhere = "stored bytes do not describe this entry"
    for bad, reason in (
        (spaced, not_canonical),
        (b"[1,2]", not_canonical),
        (b"\xff{", not_canonical),
        (canonical_json({**document, "seq": N + 7}), elsewhere),
        (canonical_json({**document, "prev_hash": "00" * 32}), elsewhere),
        (canonical_json({**document, "v": 2}), elsewhere),
        (canonical_json({**document, "extra": 1}), elsewhere),
    ):
        tail = [*rows, (N + 1, stated, hashlib.sha256(bad).digest(), bad)]
        report = verify(tail, note, signer, [older])
        assert [(p.seq, p.reason) for p in report.problems] == [(N + 1, reason)], bad


def _sealed_row(seq: int, prev: bytes) -> StoredRow:
    entry, data = seal_with_bytes(seq, new_entry(seq + 100), prev)
    return seq, prev, entry.entry_hash, data
