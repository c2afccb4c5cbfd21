"""The hash chain, pure: every kind of tampering breaks verification."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from service.ledger import GENESIS_HASH, NewLedgerEntry, verify_chain
from service.ledger.chain import LedgerEntry, seal
from service.ledger.memory import InMemoryLedger

T0 = datetime(2026, 11, 29, tzinfo=UTC)


def chain(n: int) -> list[LedgerEntry]:
    ledger = InMemoryLedger()
    ledger.append(
        [
            NewLedgerEntry(
                uuid.UUID(int=i + 1), "admitted", {"i": i, "gpus": 8}, T0 + timedelta(seconds=i)
            )
            for i in range(n)
        ]
    )
    return ledger.entries


def head_of(entries: list[LedgerEntry]) -> tuple[int, bytes]:
    return entries[-1].seq, entries[-1].entry_hash


def test_an_untouched_chain_verifies() -> None:
    entries = chain(10)
    result = verify_chain(entries, head=head_of(entries))
    assert result.ok and result.entries == 10
    assert entries[0].prev_hash == GENESIS_HASH


def test_empty_chain_verifies_against_genesis_head() -> None:
    assert verify_chain([], head=(0, GENESIS_HASH)).ok


@pytest.mark.parametrize("position", range(6))
def test_altered_body_is_found(position: int) -> None:
    entries = chain(6)
    head = head_of(entries)
    entries[position] = dataclasses.replace(entries[position], body={"i": position, "gpus": 9})
    result = verify_chain(entries, head=head)
    assert not result.ok
    assert result.breaks[0].seq == position + 1


@pytest.mark.parametrize("position", range(6))
def test_removed_entry_is_found(position: int) -> None:
    entries = chain(6)
    head = head_of(entries)
    del entries[position]
    assert not verify_chain(entries, head=head).ok


@pytest.mark.parametrize("position", range(5))
def test_swapped_neighbours_are_found(position: int) -> None:
    entries = chain(6)
    head = head_of(entries)
    entries[position], entries[position + 1] = entries[position + 1], entries[position]
    assert not verify_chain(entries, head=head).ok


@pytest.mark.parametrize("position", range(7))
def test_inserted_entry_is_found_even_if_well_formed(position: int) -> None:
    entries = chain(6)
    head = head_of(entries)
    prev = entries[position - 1].entry_hash if position else GENESIS_HASH
    forged = seal(
        position + 1, NewLedgerEntry(uuid.uuid4(), "admitted", {"forged": True}, T0), prev
    )
    entries.insert(position, forged)
    assert not verify_chain(entries, head=head).ok


def test_truncated_tail_is_found_only_against_the_head() -> None:
    entries = chain(6)
    head = head_of(entries)
    assert verify_chain(entries[:-1]).ok, "without a head a shorter chain is valid"
    assert not verify_chain(entries[:-1], head=head).ok


def test_recomputed_chain_with_a_new_tail_does_not_match_the_head() -> None:
    entries = chain(6)
    head = head_of(entries)
    rewritten = entries[:3]
    for i in range(3, 6):
        rewritten.append(
            seal(
                i + 1,
                NewLedgerEntry(uuid.uuid4(), "admitted", {"i": -i}, T0),
                rewritten[-1].entry_hash,
            )
        )
    assert not verify_chain(rewritten, head=head).ok


def test_reappending_an_entry_id_is_a_noop() -> None:
    ledger = InMemoryLedger()
    entry = NewLedgerEntry(uuid.uuid4(), "quota-changed", {"before": 1, "after": 2}, T0)
    first = ledger.append([entry])
    again = ledger.append([entry])
    assert first == again and len(ledger.entries) == 1


def test_floats_hash_as_they_read_back() -> None:
    entry = seal(
        1,
        NewLedgerEntry(uuid.uuid4(), "finished", {"gpu_seconds": 1.0, "share": 0.1}, T0),
        GENESIS_HASH,
    )
    assert verify_chain([entry]).ok
    assert entry.body == {"gpu_seconds": 1.0, "share": 0.1}


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError):
        seal(1, NewLedgerEntry(uuid.uuid4(), "finished", {"x": float("nan")}, T0), GENESIS_HASH)
