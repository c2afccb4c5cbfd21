"""The Merkle tree of the ledger: checkpoints and proofs by ``seq``.

This is what the auditor endpoints and the checkpoint publisher use. It lives
in memory (about 64 bytes per entry): :meth:`LedgerTree.catch_up` fills it
from the stored bytes of the entries at start-up and brings it up to date
before answering. Entries that do not continue the chain, or whose bytes do
not match their hash, are refused, so the tree never silently diverges from
the ledger.
Safe to share between threads. ``seq`` is 1-based; leaf index ``i`` holds
the entry of ``seq = i + 1``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from service.ledger.canonical import canonical_json
from service.ledger.chain import GENESIS_HASH, LedgerEntry, entry_bytes
from service.ledger.checkpoint import Checkpoint, CheckpointError, NoteSigner, sign_checkpoint
from service.ledger.export import ExportRecord
from service.ledger.merkle import MerkleTree, leaf_hash, verify_inclusion
from service.ledger.verify import StoredRow, stored_bytes_problem


def leaf_of(entry: LedgerEntry) -> bytes:
    """The entry's Merkle leaf hash, from its content (not its stated hash)."""
    return leaf_hash(entry_bytes(entry))


@dataclass(frozen=True, slots=True)
class InclusionProof:
    seq: int
    tree_size: int
    hashes: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ConsistencyProof:
    old_size: int
    new_size: int
    hashes: tuple[bytes, ...]


class LedgerSource(Protocol):
    """Where the tree reads entries from: ``PostgresLedgerReader`` or the
    in-memory fake."""

    def stored(self, after_seq: int = 0) -> Iterator[StoredRow]: ...


class LedgerTree:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self._tree = MerkleTree()
        self._tip = GENESIS_HASH
        self._lock = threading.RLock()

    @property
    def size(self) -> int:
        return self._tree.size

    def catch_up(self, source: LedgerSource, canonical_after: int = 0) -> int:
        """Add what the ledger has beyond the tree (e.g. a
        ``PostgresLedgerReader``); the new size.

        Reads the stored bytes of each entry and hashes them as they are. The
        bytes of entries after ``canonical_after`` must also be the RFC 8785
        form of an entry at their place; up to there, give the size of a
        checkpoint whose root is then compared (as ``publish_checkpoint``
        does): a root over canonical bytes vouches for the bytes below it."""
        with self._lock:
            rows = source.stored(after_seq=self.size)
            try:
                self.extend_stored(rows, canonical_after)
            finally:
                # A refused row leaves the reader mid-way: close it now, so
                # that its COPY and transaction end here, not at GC.
                close = getattr(rows, "close", None)
                if close is not None:
                    close()
            return self.size

    def extend_stored(self, rows: Iterable[StoredRow], canonical_after: int = 0) -> None:
        """:meth:`extend` from stored rows (see :meth:`catch_up`)."""
        with self._lock:
            for seq, prev_hash, entry_hash, data in rows:
                if seq != self.size + 1 or prev_hash != self._tip:
                    raise ValueError(f"entry {seq} does not continue the tree at {self.size}")
                if hashlib.sha256(data).digest() != entry_hash:
                    raise ValueError(f"entry {seq} does not match its hash")
                if seq > canonical_after and (
                    problem := stored_bytes_problem(data, seq, prev_hash)
                ):
                    raise ValueError(f"entry {seq}: {problem}")
                self._tree.append(leaf_hash(data))
                self._tip = entry_hash

    def extend(self, entries: Iterable[LedgerEntry]) -> None:
        with self._lock:
            for entry in entries:
                if entry.seq != self.size + 1 or entry.prev_hash != self._tip:
                    raise ValueError(f"entry {entry.seq} does not continue the tree at {self.size}")
                data = entry_bytes(entry)
                if hashlib.sha256(data).digest() != entry.entry_hash:
                    raise ValueError(f"entry {entry.seq} does not match its hash")
                self._tree.append(leaf_hash(data))
                self._tip = entry.entry_hash

    def extend_records(self, records: Iterable[ExportRecord]) -> None:
        """:meth:`extend` from a reader's lean ``records()`` (or an export)."""
        with self._lock:
            for record in records:
                document = record.document
                if (
                    document.get("seq") != self.size + 1
                    or document.get("prev_hash") != self._tip.hex()
                ):
                    raise ValueError(f"entry {document.get('seq')} does not continue the tree")
                data = record.data or canonical_json(document)
                if hashlib.sha256(data).hexdigest() != record.entry_hash:
                    raise ValueError(f"entry {self.size + 1} does not match its hash")
                self._tree.append(leaf_hash(data))
                self._tip = bytes.fromhex(record.entry_hash)

    def checkpoint(self, size: int | None = None) -> Checkpoint:
        with self._lock:
            size = self.size if size is None else size
            return Checkpoint(self.origin, size, self._tree.root(size))

    def signed_checkpoint(self, signer: NoteSigner, size: int | None = None) -> str:
        return sign_checkpoint(self.checkpoint(size), [signer])

    def inclusion_proof(self, seq: int, tree_size: int | None = None) -> InclusionProof:
        with self._lock:
            tree_size = self.size if tree_size is None else tree_size
            hashes = self._tree.inclusion_proof(seq - 1, tree_size)
        return InclusionProof(seq, tree_size, tuple(hashes))

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> ConsistencyProof:
        with self._lock:
            new_size = self.size if new_size is None else new_size
            hashes = self._tree.consistency_proof(old_size, new_size)
        return ConsistencyProof(old_size, new_size, tuple(hashes))


def entry_is_included(entry: LedgerEntry, proof: InclusionProof, checkpoint: Checkpoint) -> bool:
    """Does the signed tree of ``checkpoint`` hold ``entry`` at its ``seq``?"""
    return (
        proof.seq == entry.seq
        and proof.tree_size == checkpoint.size
        and verify_inclusion(
            leaf_of(entry), entry.seq - 1, checkpoint.size, proof.hashes, checkpoint.root_hash
        )
    )


class CheckpointStore(Protocol):
    def save(self, checkpoint: Checkpoint, note: str) -> str: ...

    def latest(self) -> tuple[Checkpoint, str] | None: ...


class InMemoryCheckpointStore:
    """The fake of :class:`~service.ledger.postgres.PostgresCheckpointStore`."""

    def __init__(self) -> None:
        self._by_size: dict[int, tuple[Checkpoint, str]] = {}

    def save(self, checkpoint: Checkpoint, note: str) -> str:
        return self._by_size.setdefault(checkpoint.size, (checkpoint, note))[1]

    def latest(self) -> tuple[Checkpoint, str] | None:
        return self._by_size[max(self._by_size)] if self._by_size else None

    def at(self, size: int) -> tuple[Checkpoint, str] | None:
        return self._by_size.get(size)


def publish_checkpoint(
    tree: LedgerTree, source: LedgerSource, signer: NoteSigner, store: CheckpointStore
) -> str:
    """Sign and store a checkpoint of the whole ledger — periodically or on
    demand; nothing new since the last one returns the last one.

    Never signs a fork: the tree must extend the latest published checkpoint
    (same origin, same root at its size), or ``CheckpointError`` is raised —
    if the stored ledger was rewritten, the signing key must not vouch for it.
    """
    latest = store.latest()
    size = tree.catch_up(source, canonical_after=latest[0].size if latest else 0)
    if latest is not None:
        published, note = latest
        if published.origin != tree.origin:
            raise CheckpointError(f"the store holds checkpoints of {published.origin!r}")
        if published.size > size or tree.checkpoint(published.size) != published:
            raise CheckpointError(
                f"the ledger no longer extends the checkpoint of size {published.size}"
            )
        if published.size == size:
            return note
    checkpoint = tree.checkpoint(size)
    return store.save(checkpoint, sign_checkpoint(checkpoint, [signer]))
