"""Offline verification of an NDJSON export: every mutation of the signed
ledger is found, in every position tried; an honest ledger always passes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.ledger.chain import LedgerEntry, NewLedgerEntry, seal
from service.ledger.checkpoint import NoteSigner
from service.ledger.export import (
    checkpoint_of,
    export_line,
    export_ndjson,
    read_ndjson,
    records_of,
)
from service.ledger.memory import InMemoryLedger
from service.ledger.proofs import LedgerTree, entry_is_included
from service.ledger.verify import VerifyReport, verify_export, verify_ledger

T0 = datetime(2026, 11, 29, tzinfo=UTC)
ORIGIN = "qm.test/ledger"
N = 12
OLDER = 5
KINDS = ["workload.submitted", "workload.admitted", "workload.finished", "quota.changed"]


def new_entry(i: int, tag: str = "") -> NewLedgerEntry:
    body = {"workload": f"team-a/w{i}{tag}", "gpus": 8 * (i % 4), "note": "é ü \u2028"}
    return NewLedgerEntry(uuid.UUID(int=i + 1), KINDS[i % 4], body, T0 + timedelta(seconds=i))


def honest(n: int = N) -> list[LedgerEntry]:
    ledger = InMemoryLedger()
    ledger.append([new_entry(i) for i in range(n)])
    return ledger.entries


def reseal(items: Sequence[NewLedgerEntry]) -> list[LedgerEntry]:
    """What an attacker who can rewrite the database and recompute hashes makes."""
    ledger = InMemoryLedger()
    ledger.append(list(items))
    return ledger.entries


def unsealed(entries: Sequence[LedgerEntry]) -> list[NewLedgerEntry]:
    return [NewLedgerEntry(e.entry_id, e.kind, dict(e.body), e.recorded_at) for e in entries]


@pytest.fixture(scope="module")
def signer() -> NoteSigner:
    return NoteSigner.generate(ORIGIN)[0]


def note_for(entries: Sequence[LedgerEntry], signer: NoteSigner, size: int | None = None) -> str:
    tree = LedgerTree(ORIGIN)
    tree.extend(entries)
    return tree.signed_checkpoint(signer, size)


def verify_lines(
    lines: Sequence[bytes], note: str, signer: NoteSigner, older: Sequence[str] = ()
) -> VerifyReport:
    """Both ways of verifying an export — every line parsed (verify_ledger), or
    only what must be (verify_export, what the CLI runs) — must agree."""
    report = verify_ledger(read_ndjson(lines), note, signer.verifier(), older)
    fast = verify_export(lines, note, signer.verifier(), older)
    assert fast.ok == report.ok, (fast.problems, report.problems)
    assert fast.entries == report.entries
    assert fast.root_hash == report.root_hash or not report.ok
    return report


@pytest.fixture(scope="module")
def published(signer: NoteSigner) -> tuple[list[bytes], str, str]:
    entries = honest()
    lines = list(export_ndjson(entries))
    return lines, note_for(entries, signer), note_for(entries, signer, OLDER)


def test_an_honest_export_verifies(
    signer: NoteSigner, published: tuple[list[bytes], str, str]
) -> None:
    lines, note, older = published
    report = verify_lines(lines, note, signer, [older])
    assert report.ok, report.problems
    assert report.entries == N and report.unsigned_tail == 0 and report.older_checked == 1
    assert report.head_hash == honest()[-1].entry_hash


def test_entries_after_the_checkpoint_are_counted_unsigned(signer: NoteSigner) -> None:
    entries = honest()
    report = verify_lines(list(export_ndjson(entries)), note_for(entries, signer, 9), signer)
    assert report.ok and report.unsigned_tail == N - 9


def test_the_empty_ledger_verifies_against_an_empty_checkpoint(signer: NoteSigner) -> None:
    assert verify_lines([], note_for([], signer), signer).ok


def test_every_single_byte_flip_is_found(
    signer: NoteSigner, published: tuple[list[bytes], str, str]
) -> None:
    lines, note, older = published
    tried = 0
    for row, line in enumerate(lines):
        for position in range(len(line) - 1):  # the newline itself only separates
            for mask in (0x01, 0x20):
                mutated = bytearray(line)
                mutated[position] ^= mask
                tampered = [*lines[:row], bytes(mutated), *lines[row + 1 :]]
                report = verify_lines(tampered, note, signer, [older])
                assert not report.ok, (row, position, mask)
                tried += 1
    assert tried == 2 * sum(len(line) - 1 for line in lines)


@pytest.mark.parametrize("position", range(N))
def test_a_deleted_entry_is_found(
    signer: NoteSigner, published: tuple[list[bytes], str, str], position: int
) -> None:
    lines, note, older = published
    assert not verify_lines(lines[:position] + lines[position + 1 :], note, signer, [older]).ok


@pytest.mark.parametrize("position", range(N))
def test_an_inserted_well_formed_entry_is_found(
    signer: NoteSigner, published: tuple[list[bytes], str, str], position: int
) -> None:
    lines, note, older = published
    entries = honest()
    prev = entries[position - 1].entry_hash if position else bytes(32)
    forged = seal(position + 1, NewLedgerEntry(uuid.uuid4(), "quota.changed", {}, T0), prev)
    tampered = [*lines[:position], export_line(forged), *lines[position:]]
    assert not verify_lines(tampered, note, signer, [older]).ok


@pytest.mark.parametrize("position", range(N))
def test_an_insertion_with_the_whole_chain_recomputed_is_found(
    signer: NoteSigner, published: tuple[list[bytes], str, str], position: int
) -> None:
    _, note, _ = published
    items = unsealed(honest())
    items.insert(position, NewLedgerEntry(uuid.uuid4(), "quota.changed", {"forged": 1}, T0))
    rewritten = list(export_ndjson(reseal(items)))
    report = verify_lines(rewritten, note, signer)
    assert not report.ok
    assert all("Merkle root" in p.reason for p in report.problems)


def test_an_entry_appended_after_the_checkpoint_is_unsigned_and_refused_when_strict(
    signer: NoteSigner, published: tuple[list[bytes], str, str]
) -> None:
    """No signature covers what came after the newest checkpoint: it is
    reported, and ``strict`` (the CLI's --strict) refuses it."""
    lines, note, older = published
    forged = seal(N + 1, new_entry(99), honest()[-1].entry_hash)
    extended = [*lines, export_line(forged)]
    lenient = verify_lines(extended, note, signer, [older])
    assert lenient.ok and lenient.unsigned_tail == 1
    strict = verify_ledger(read_ndjson(extended), note, signer.verifier(), [older], strict=True)
    assert not strict.ok


@pytest.mark.parametrize("position", range(N - 1))
def test_swapped_neighbours_are_found(
    signer: NoteSigner, published: tuple[list[bytes], str, str], position: int
) -> None:
    lines, note, older = published
    tampered = list(lines)
    tampered[position], tampered[position + 1] = tampered[position + 1], tampered[position]
    assert not verify_lines(tampered, note, signer, [older]).ok


@pytest.mark.parametrize("source", range(N))
def test_an_entry_moved_anywhere_is_found_even_with_the_chain_recomputed(
    signer: NoteSigner, published: tuple[list[bytes], str, str], source: int
) -> None:
    lines, note, older = published
    for target in range(N):
        if target == source:
            continue
        moved = list(lines)
        moved.insert(target, moved.pop(source))
        assert not verify_lines(moved, note, signer, [older]).ok, (source, target)
        items = unsealed(honest())
        items.insert(target, items.pop(source))
        assert not verify_lines(list(export_ndjson(reseal(items))), note, signer).ok


@pytest.mark.parametrize("keep", range(N))
def test_a_cut_off_tail_is_found(
    signer: NoteSigner, published: tuple[list[bytes], str, str], keep: int
) -> None:
    lines, note, older = published
    assert not verify_lines(lines[:keep], note, signer, [older]).ok


@pytest.mark.parametrize("position", range(N))
def test_a_body_rewritten_and_resealed_is_found(
    signer: NoteSigner, published: tuple[list[bytes], str, str], position: int
) -> None:
    _, note, _ = published
    items = unsealed(honest())
    body = dict(items[position].body)
    body["gpus"] = body["gpus"] + 1
    items[position] = NewLedgerEntry(
        items[position].entry_id, items[position].kind, body, items[position].recorded_at
    )
    assert not verify_lines(list(export_ndjson(reseal(items))), note, signer).ok


@pytest.mark.parametrize("fork_at", range(1, N + 1))
def test_a_fork_signed_after_a_published_checkpoint_is_found(
    signer: NoteSigner, fork_at: int
) -> None:
    """The operator rewrites history from ``fork_at`` on, extends it, and signs
    it with the real key. Anyone holding an earlier checkpoint whose tree
    includes ``fork_at`` sees that the new log does not extend it."""
    entries = honest()
    published = [note_for(entries, signer, size) for size in (4, 9, N)]
    items = unsealed(entries)[: fork_at - 1]
    items += [new_entry(i, tag="-fork") for i in range(fork_at - 1, N + 4)]
    forked = reseal(items)
    forked_note = note_for(forked, signer)
    lines = list(export_ndjson(forked))
    assert verify_lines(lines, forked_note, signer).ok, "the fork is well-formed by itself"
    report = verify_lines(lines, forked_note, signer, published)
    assert not report.ok
    holders = [size for size in (4, 9, N) if size >= fork_at]
    assert len(report.problems) == len(holders)


def test_an_honest_extension_is_consistent_with_every_older_checkpoint(
    signer: NoteSigner,
) -> None:
    entries = honest()
    published = [note_for(entries, signer, size) for size in (0, 1, 4, 9, N)]
    extended = reseal([*unsealed(entries), *[new_entry(i) for i in range(N, N + 4)]])
    report = verify_lines(
        list(export_ndjson(extended)), note_for(extended, signer), signer, published
    )
    assert report.ok, report.problems
    assert report.older_checked == 5


def test_a_checkpoint_signed_by_another_key_is_refused(
    signer: NoteSigner, published: tuple[list[bytes], str, str]
) -> None:
    lines, _, _ = published
    other = NoteSigner.generate(ORIGIN)[0]
    report = verify_lines(lines, note_for(honest(), other), signer)
    assert not report.ok
    assert report.checkpoint is None


def test_an_older_checkpoint_of_another_log_is_refused(
    signer: NoteSigner, published: tuple[list[bytes], str, str]
) -> None:
    lines, note, _ = published
    stranger = NoteSigner.generate("other.example/log")[0]
    tree = LedgerTree("other.example/log")
    tree.extend(honest())
    report = verify_ledger(
        read_ndjson(lines), note, signer.verifier(), [tree.signed_checkpoint(stranger, 3)]
    )
    assert not report.ok


def test_unreadable_lines_are_reported_with_their_position(
    signer: NoteSigner, published: tuple[list[bytes], str, str]
) -> None:
    lines, note, _ = published
    tampered = [*lines[:3], b"{not json\n", *lines[4:]]
    report = verify_lines(tampered, note, signer)
    assert not report.ok and report.problems[0].seq == 4


def test_an_export_that_opens_with_its_checkpoint_verifies_as_one_without(
    signer: NoteSigner, published: tuple[list[bytes], str, str]
) -> None:
    """A whole export opens with the latest signed note; readers skip that
    line, and anywhere else it is not an entry."""
    lines, note, older = published
    opened = list(export_ndjson(honest(), note))
    assert checkpoint_of(opened[0]) == note and opened[1:] == lines
    assert [checkpoint_of(line) for line in lines] == [None] * N
    report = verify_lines(opened, note, signer, [older])
    assert report.ok and report.entries == N, report.problems
    moved = verify_lines([*opened[1:4], opened[0], *opened[4:]], note, signer)
    assert not moved.ok and moved.problems[0].seq == 4


def test_verifying_ledger_entries_directly(signer: NoteSigner) -> None:
    entries = honest()
    report = verify_ledger(records_of(entries), note_for(entries, signer), signer.verifier())
    assert report.ok


def test_inclusion_of_every_entry_in_a_signed_checkpoint(signer: NoteSigner) -> None:
    entries = honest()
    tree = LedgerTree(ORIGIN)
    tree.extend(entries)
    for size in (1, 5, N):
        checkpoint = tree.checkpoint(size)
        for entry in entries[:size]:
            proof = tree.inclusion_proof(entry.seq, size)
            assert entry_is_included(entry, proof, checkpoint)
            other = entries[entry.seq % size]
            assert other.seq == entry.seq or not entry_is_included(other, proof, checkpoint)


def test_the_tree_refuses_entries_that_do_not_continue_the_chain() -> None:
    entries = honest()
    tree = LedgerTree(ORIGIN)
    tree.extend(entries[:3])
    with pytest.raises(ValueError):
        tree.extend([entries[4]])
    with pytest.raises(ValueError):
        tree.extend([seal(4, new_entry(99), entries[1].entry_hash)])
    tree.extend([seal(4, new_entry(99), entries[2].entry_hash)])
    assert tree.size == 4


def test_an_export_line_is_the_rfc8785_form_of_entry_and_hash() -> None:
    import rfc8785

    from service.ledger.export import record_of

    for entry in honest(4):
        record = record_of(entry)
        expected: dict[str, Any] = {
            "entry": dict(record.document),
            "entry_hash": entry.entry_hash.hex(),
        }
        assert export_line(entry) == rfc8785.dumps(expected) + b"\n"


def test_a_reformatted_export_still_verifies(signer: NoteSigner) -> None:
    import json

    entries = honest()
    spaced = [
        json.dumps(json.loads(line), indent=None, separators=(", ", ": ")).encode() + b"\r\n"
        for line in export_ndjson(entries)
    ]
    report = verify_lines(spaced, note_for(entries, signer), signer)
    assert report.ok, report.problems


def test_the_tree_from_records_equals_the_tree_from_entries() -> None:
    entries = honest()
    from_entries, from_records, from_lines = (LedgerTree(ORIGIN) for _ in range(3))
    from_entries.extend(entries)
    from_records.extend_records(records_of(entries))
    from_lines.extend_records(
        r for r in read_ndjson(export_ndjson(entries)) if not isinstance(r, Exception)
    )
    assert from_entries.checkpoint() == from_records.checkpoint() == from_lines.checkpoint()
    tampered = list(records_of(entries))
    tampered[3] = type(tampered[3])(
        {**tampered[3].document, "kind": "forged"}, tampered[3].entry_hash
    )
    with pytest.raises(ValueError):
        LedgerTree(ORIGIN).extend_records(tampered)
    with pytest.raises(ValueError):
        LedgerTree(ORIGIN).extend_records(list(records_of(entries))[1:])


def test_the_tree_refuses_an_entry_whose_content_does_not_match_its_hash() -> None:
    import dataclasses

    entries = honest()
    tree = LedgerTree(ORIGIN)
    tree.extend(entries[:2])
    forged = dataclasses.replace(entries[2], body={"forged": True})
    with pytest.raises(ValueError):
        tree.extend([forged])
    assert tree.size == 2
