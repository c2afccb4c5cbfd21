"""The ledger's hash chain: pure functions, no storage.

Every entry is hashed over its RFC 8785 canonical JSON, which includes the hash
of the entry before it. Changing, removing, inserting or reordering any entry
breaks either a recomputed hash, the ``prev_hash`` link or the contiguous
sequence; truncating the tail is caught against the head (and, once issue 6
lands, signed checkpoints).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from uuid import UUID

from service.ledger.canonical import canonical_json

GENESIS_HASH: Final = bytes(32)
CHAIN_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    seq: int
    entry_id: UUID
    kind: str
    recorded_at: datetime
    body: Mapping[str, Any]
    prev_hash: bytes
    entry_hash: bytes


@dataclass(frozen=True, slots=True)
class NewLedgerEntry:
    """An entry to append; ``entry_id`` makes appending it again a no-op."""

    entry_id: UUID
    kind: str
    body: Mapping[str, Any]
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class ChainBreak:
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class Verification:
    entries: int
    head_hash: bytes
    breaks: tuple[ChainBreak, ...]

    @property
    def ok(self) -> bool:
        return not self.breaks


def canonical_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body as it will read back from storage: JSON values only, no NaN.

    Hashing this (and storing it) rather than the caller's object means the
    verifier recomputes the same bytes from what the database returns.
    """
    loaded: dict[str, Any] = json.loads(json.dumps(body, allow_nan=False))
    return loaded


def entry_document(seq: int, item: NewLedgerEntry, prev_hash: bytes) -> dict[str, Any]:
    """What is hashed: the entry's fields and its predecessor's hash."""
    return {
        "v": CHAIN_VERSION,
        "seq": seq,
        "entry_id": str(item.entry_id),
        "kind": item.kind,
        "recorded_at": item.recorded_at.isoformat(),
        "body": dict(item.body),
        "prev_hash": prev_hash.hex(),
    }


def hash_document(document: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(canonical_json(document)).digest()


def entry_bytes(entry: LedgerEntry) -> bytes:
    """The RFC 8785 bytes of what ``entry_hash`` hashes: also the entry's
    Merkle leaf (see service/ledger/merkle.py)."""
    item = NewLedgerEntry(entry.entry_id, entry.kind, entry.body, entry.recorded_at)
    return canonical_json(entry_document(entry.seq, item, entry.prev_hash))


def in_utc(moment: datetime) -> datetime:
    """``recorded_at`` as hashed: in UTC (a naive time is taken as UTC), so that
    the ``isoformat()`` recomputed from what Postgres returns is the same."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def seal(seq: int, item: NewLedgerEntry, prev_hash: bytes) -> LedgerEntry:
    """Make the entry that follows ``prev_hash`` at position ``seq``."""
    return seal_with_bytes(seq, item, prev_hash)[0]


def seal_with_bytes(seq: int, item: NewLedgerEntry, prev_hash: bytes) -> tuple[LedgerEntry, bytes]:
    """:func:`seal`, and the RFC 8785 bytes it hashed (:func:`entry_bytes`),
    which storage keeps beside the entry."""
    return prepare(item).seal(seq, prev_hash)


# Stand-ins for the two fields known only at the tip. In the canonical
# document the keys come sorted (body, entry_id, kind, prev_hash,
# recorded_at, seq, v): ``prev_hash`` is the last field whose value can hold
# arbitrary text before it, so the stand-in's last occurrence is the field's.
_PREV_STAND_IN: Final = "p" * 64
_PREV_FIELD: Final = f'"prev_hash":"{_PREV_STAND_IN}"'.encode()


@dataclass(frozen=True, slots=True)
class PreparedEntry:
    """An entry canonicalised before its place in the chain is known: the
    costly part of sealing (the body's JSON), done before the tip is locked;
    :meth:`seal` then only splices in the tip's hash and the sequence number
    and hashes."""

    item: NewLedgerEntry
    before_prev: bytes
    after_prev: bytes
    """Up to ``"seq":`` (the document ends ``"seq":N,"v":V}``)."""
    ending: bytes

    def seal(self, seq: int, prev_hash: bytes) -> tuple[LedgerEntry, bytes]:
        data = b"".join(
            (
                self.before_prev,
                prev_hash.hex().encode(),
                self.after_prev,
                str(seq).encode(),
                self.ending,
            )
        )
        item = self.item
        entry = LedgerEntry(
            seq,
            item.entry_id,
            item.kind,
            item.recorded_at,
            item.body,
            prev_hash,
            hashlib.sha256(data).digest(),
        )
        return entry, data


def prepare(item: NewLedgerEntry) -> PreparedEntry:
    """``item`` canonicalised with stand-ins for ``prev_hash`` and ``seq``."""
    body = canonical_body(item.body)
    clean = NewLedgerEntry(item.entry_id, item.kind, body, in_utc(item.recorded_at))
    document = entry_document(0, clean, bytes(32))
    document["prev_hash"] = _PREV_STAND_IN
    data = canonical_json(document)
    at = data.rindex(_PREV_FIELD) + len(b'"prev_hash":"')
    ending = f',"v":{CHAIN_VERSION}}}'.encode()
    seq_at = len(data) - len(ending) - 1  # the stand-in seq, 0, is one digit
    if not data.endswith(b'"seq":0' + ending):
        raise AssertionError("the canonical entry document no longer ends with seq and v")
    return PreparedEntry(clean, data[:at], data[at + 64 : seq_at], ending)


def recompute(entry: LedgerEntry) -> bytes:
    item = NewLedgerEntry(entry.entry_id, entry.kind, entry.body, entry.recorded_at)
    return hash_document(entry_document(entry.seq, item, entry.prev_hash))


def verify_chain(
    entries: Iterable[LedgerEntry],
    head: tuple[int, bytes] | None = None,
) -> Verification:
    """Walk the chain from the genesis; report every break found.

    ``head`` is the (seq, hash) that the chain must end at, when known: without
    it a truncated tail looks like a shorter, valid chain.
    """
    breaks: list[ChainBreak] = []
    expected_seq, previous, count = 1, GENESIS_HASH, 0
    for entry in entries:
        count += 1
        if entry.seq != expected_seq:
            breaks.append(ChainBreak(entry.seq, f"expected seq {expected_seq}"))
        if entry.prev_hash != previous:
            breaks.append(ChainBreak(entry.seq, "prev_hash does not match the entry before"))
        if recompute(entry) != entry.entry_hash:
            breaks.append(ChainBreak(entry.seq, "entry hash does not match its content"))
        expected_seq, previous = entry.seq + 1, entry.entry_hash
    if head is not None and head != (expected_seq - 1, previous):
        breaks.append(ChainBreak(expected_seq - 1, f"chain ends before the head at seq {head[0]}"))
    return Verification(count, previous, tuple(breaks))
