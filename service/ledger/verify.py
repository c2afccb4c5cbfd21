"""Offline verification of a ledger against signed checkpoints.

What is checked, in one pass and constant memory:

1. every entry's hash, recomputed from its content (RFC 8785, SHA-256) — or
   from the entry's bytes as they stand in an export line, which are then
   the very bytes parsed for the checks below and hashed into the tree;
2. the chain: ``seq`` counts up from 1 without a gap, and every ``prev_hash``
   is the hash of the entry before (the first one's is all zeros);
3. the newest checkpoint's Ed25519 signature, and that the Merkle tree head of
   the first ``size`` entries — leaves recomputed from content, never taken
   from the stated hashes — is the signed root: nothing in the signed prefix
   was altered, removed, inserted, reordered or cut off;
4. every older checkpoint: its signature, its log, and that its root is the
   head of the same entries at its size. Having every entry, this is the
   strongest consistency check there is; it catches a log that was rewritten
   and signed again after an older checkpoint was published (a fork).

Entries after the newest checkpoint are chain-checked but no signature covers
them yet: anyone could append there. The report counts them as
``unsigned_tail``; with ``strict`` they are a failure.

:func:`verify_ledger` takes entries as documents (an export, or rows read back
and serialised again); :func:`verify_stored` takes rows as storage keeps them —
``seq``, ``prev_hash``, ``entry_hash`` and the very bytes that were hashed —
and checks the same things without parsing or serialising any JSON in the
signed prefix, which is what lets a million live entries verify in seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from service.ledger.canonical import canonical_json
from service.ledger.chain import CHAIN_VERSION, GENESIS_HASH
from service.ledger.checkpoint import Checkpoint, CheckpointError, NoteVerifier, open_checkpoint
from service.ledger.export import (
    ExportFormatError,
    ExportRecord,
    entry_lines,
    parse_line,
    verbatim_parts,
)
from service.ledger.merkle import CompactRange, leaf_hash

MAX_PROBLEMS = 1000

#: One stored entry: ``seq``, ``prev_hash``, ``entry_hash``, and the RFC 8785
#: bytes that ``entry_hash`` hashes (the Merkle leaf).
StoredRow = tuple[int, bytes, bytes, bytes]
_DOCUMENT_KEYS: Final = frozenset(
    ("v", "seq", "entry_id", "kind", "recorded_at", "body", "prev_hash")
)


@dataclass(frozen=True, slots=True)
class Problem:
    seq: int | None
    reason: str

    def __str__(self) -> str:
        return f"entry {self.seq}: {self.reason}" if self.seq is not None else self.reason


@dataclass(slots=True)
class VerifyReport:
    entries: int = 0
    checkpoint: Checkpoint | None = None
    root_hash: bytes = b""
    head_hash: bytes = GENESIS_HASH
    older_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    problems_dropped: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and self.checkpoint is not None

    @property
    def unsigned_tail(self) -> int:
        return self.entries - self.checkpoint.size if self.checkpoint else self.entries

    def add(self, seq: int | None, reason: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(seq, reason))
        else:
            self.problems_dropped += 1


def verify_ledger(
    records: Iterable[ExportRecord | ExportFormatError],
    checkpoint_note: str,
    verifier: NoteVerifier,
    older_notes: Sequence[str] = (),
    *,
    strict: bool = False,
) -> VerifyReport:
    """Verify ``records`` (in export order) against the newest signed
    checkpoint and any older ones; see the module docstring. ``strict``
    refuses entries that no checkpoint covers yet."""
    report = VerifyReport()
    newest = _open(checkpoint_note, verifier, report, "checkpoint")
    report.checkpoint = newest
    roots = _expected_roots(newest, older_notes, verifier, report)
    frontier, previous, count = CompactRange(), GENESIS_HASH.hex(), 0
    for record in records:
        count += 1
        if isinstance(record, ExportFormatError):
            report.add(count, f"unreadable line: {record}")
            data, previous = b"", ""
        else:
            data = _check_entry(record, count, previous, report)
            # Link to the *stated* hash: a changed entry is then reported once,
            # by its own hash, instead of again by its successor's link.
            previous = record.entry_hash
        frontier.append(leaf_hash(data))
        for expected in roots.get(count, ()):
            _check_root(frontier.root(), expected, report)
    head = bytes.fromhex(previous) if _is_hash(previous) else b""
    _finish(report, frontier, count, head, roots, strict)
    return report


def verify_export(
    lines: Iterable[bytes],
    checkpoint_note: str,
    verifier: NoteVerifier,
    older_notes: Sequence[str] = (),
    *,
    strict: bool = False,
) -> VerifyReport:
    """:func:`verify_ledger` over the lines of an NDJSON export, parsing only
    what needs parsing.

    Within the newest checkpoint's size, a line in the layout that
    ``export_line`` writes is not parsed: its bytes are hashed as they stand
    and its ``seq`` and ``prev_hash`` read from their end, where RFC 8785 puts
    them — bytes whose Merkle head is the signed root are the signed RFC 8785
    form, so that reading is exact, and bytes that are not fail the root
    anyway. Every other line, and every line after the checkpoint, is parsed
    as :func:`~service.ledger.export.read_ndjson` does. The checkpoint line
    a whole export opens with is skipped: ``checkpoint_note`` is the one checked."""
    probe = VerifyReport()
    newest = _open(checkpoint_note, verifier, probe, "checkpoint")
    signed = newest.size if newest is not None else 0
    records = _export_records(lines, signed)
    return verify_ledger(records, checkpoint_note, verifier, older_notes, strict=strict)


# The end of an entry's RFC 8785 bytes: its last top-level fields, in key
# order. The last `,"prev_hash":"` is the top-level one: in a JSON string
# every quote is escaped, so the sequence cannot stand inside one.
_LINK: Final = b',"prev_hash":"'
_ENTRY_END: Final = re.compile(
    rb',"prev_hash":"([0-9a-f]{64})","recorded_at":"[^"\\]*","seq":([1-9][0-9]{0,15}),"v":1\}'
)


def _export_records(
    lines: Iterable[bytes], signed: int
) -> Iterator[ExportRecord | ExportFormatError]:
    position = 0
    for line in entry_lines(lines):
        position += 1
        if position <= signed and (parts := verbatim_parts(line)) is not None:
            data, stated = parts
            end = _ENTRY_END.fullmatch(data, max(data.rfind(_LINK), 0))
            if end is not None and data[:1] == b"{":
                link = {"seq": int(end[2]), "prev_hash": end[1].decode()}
                yield ExportRecord(link, stated, data)
                continue
        try:
            yield parse_line(line)
        except ExportFormatError as exc:
            yield exc


def verify_stored(
    rows: Iterable[StoredRow],
    checkpoint_note: str,
    verifier: NoteVerifier,
    older_notes: Sequence[str] = (),
    *,
    strict: bool = False,
) -> VerifyReport:
    """:func:`verify_ledger` over rows as stored (in ``seq`` order): every
    stored hash against the stored bytes, the chain, and the Merkle heads of
    those bytes against the signed roots.

    The bytes are hashed as they are. In the signed prefix that suffices: the
    signer hashed the RFC 8785 form, so bytes whose head equals the signed root
    are that form. Entries after the newest checkpoint have no such witness, so
    there the bytes are also parsed and must be canonical and carry the row's
    ``seq`` and ``prev_hash``. That the other columns match the bytes is the
    storage's to show (see ``PostgresLedgerReader.verify_live``)."""
    report = VerifyReport()
    newest = _open(checkpoint_note, verifier, report, "checkpoint")
    report.checkpoint = newest
    roots = _expected_roots(newest, older_notes, verifier, report)
    signed = newest.size if newest is not None else 0
    frontier, previous, count = CompactRange(), GENESIS_HASH, 0
    append, sha256, leaf_prefix = frontier.append, hashlib.sha256, hashlib.sha256(b"\x00")
    for seq, prev_hash, entry_hash, data in rows:
        count += 1
        if seq != count:
            report.add(count, f"expected seq {count}, found {seq}")
        if prev_hash != previous:
            report.add(count, "prev_hash does not match the entry before")
        if sha256(data).digest() != entry_hash:
            report.add(count, "entry hash does not match its content")
        elif count > signed and (problem := stored_bytes_problem(data, seq, prev_hash)):
            report.add(count, problem)
        leaf = leaf_prefix.copy()  # leaf_hash(data), without copying data
        leaf.update(data)
        append(leaf.digest())
        if count in roots:
            for expected in roots[count]:
                _check_root(frontier.root(), expected, report)
        previous = entry_hash  # the stated hash, as verify_ledger links
    _finish(report, frontier, count, previous, roots, strict)
    return report


def stored_bytes_problem(data: bytes, seq: int, prev_hash: bytes) -> str | None:
    """For bytes that no signature covers yet: are they the RFC 8785 form of an
    entry, at this row's place in the chain? The problem, or None."""
    try:
        document = json.loads(data)
        canonical = type(document) is dict and canonical_json(document) == data
    except ValueError:
        canonical = False
    if not canonical:
        return "stored bytes are not the RFC 8785 form of an entry"
    if (
        set(document) != _DOCUMENT_KEYS
        or document["v"] != CHAIN_VERSION
        or document["seq"] != seq
        or document["prev_hash"] != prev_hash.hex()
    ):
        return "stored bytes do not describe this entry"
    return None


def _finish(
    report: VerifyReport,
    frontier: CompactRange,
    count: int,
    head: bytes,
    roots: dict[int, list[tuple[bytes, str]]],
    strict: bool,
) -> None:
    report.entries, report.head_hash, report.root_hash = count, head, frontier.root()
    newest = report.checkpoint
    if strict and newest is not None and count > newest.size:
        report.add(None, f"{count - newest.size} entries after the checkpoint are not signed")
    for size, labels in roots.items():
        if size > count:
            for _, label in labels:
                report.add(None, f"{label} covers {size} entries but the ledger has {count}")
        elif size == 0:
            for expected in labels:
                _check_root(CompactRange().root(), expected, report)


def _open(note: str, verifier: NoteVerifier, report: VerifyReport, label: str) -> Checkpoint | None:
    try:
        return open_checkpoint(note, verifier)
    except CheckpointError as exc:
        report.add(None, f"{label}: {exc}")
        return None


def _expected_roots(
    newest: Checkpoint | None,
    older_notes: Sequence[str],
    verifier: NoteVerifier,
    report: VerifyReport,
) -> dict[int, list[tuple[bytes, str]]]:
    """Tree size → the (root, label) pairs that the head at that size must equal."""
    roots: dict[int, list[tuple[bytes, str]]] = {}
    if newest is not None:
        roots.setdefault(newest.size, []).append((newest.root_hash, "the checkpoint"))
    for i, note in enumerate(older_notes, start=1):
        label = f"older checkpoint #{i}"
        older = _open(note, verifier, report, label)
        if older is None:
            continue
        report.older_checked += 1
        label = f"{label} (size {older.size})"
        if newest is not None and older.origin != newest.origin:
            report.add(None, f"{label} is of another log: {older.origin!r}")
        if newest is not None and older.size > newest.size:
            report.add(None, f"{label} is larger than the newest checkpoint ({newest.size})")
        roots.setdefault(older.size, []).append((older.root_hash, label))
    return roots


def _is_hash(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _check_entry(record: ExportRecord, position: int, previous: str, report: VerifyReport) -> bytes:
    """The entry's leaf bytes, after checking its place in the chain and its hash.

    An entry that cannot be canonicalised gets an empty leaf: the root then
    cannot match and the problem is already reported."""
    document = record.document
    if document.get("seq") != position:
        report.add(position, f"expected seq {position}, found {document.get('seq')!r}")
    if document.get("prev_hash") != previous:
        report.add(position, "prev_hash does not match the entry before")
    data = record.data
    if data is not None and hashlib.sha256(data).hexdigest() == record.entry_hash:
        return data
    try:
        # No verbatim bytes, or they do not hash right (perhaps only spaced
        # differently): hash the canonical form of what was parsed.
        data = canonical_json(document)
    except ValueError as exc:
        report.add(position, f"content cannot be canonicalised: {exc}")
        return b""
    if hashlib.sha256(data).hexdigest() != record.entry_hash:
        report.add(position, "entry hash does not match its content")
    return data


def _check_root(actual: bytes, expected: tuple[bytes, str], report: VerifyReport) -> None:
    root, label = expected
    if actual != root:
        report.add(None, f"the Merkle root of the ledger does not match {label}")
