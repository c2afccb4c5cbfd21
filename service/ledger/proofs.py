"""The Merkle tree of the ledger: checkpoints and proofs by ``seq``.

This is what the auditor endpoints and the checkpoint task use. It lives in
memory (about 64 bytes per entry) and is filled from the ledger reader at
start-up and then by every append; :meth:`LedgerTree.extend` refuses entries
that do not continue the chain, so the tree never silently diverges from it.
``seq`` is 1-based; leaf index ``i`` holds the entry of ``seq = i + 1``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from service.ledger.canonical import canonical_json
from service.ledger.chain import GENESIS_HASH, LedgerEntry, entry_bytes
from service.ledger.checkpoint import Checkpoint, NoteSigner, sign_checkpoint
from service.ledger.export import ExportRecord
from service.ledger.merkle import MerkleTree, leaf_hash, verify_inclusion


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


class LedgerTree:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self._tree = MerkleTree()
        self._tip = GENESIS_HASH

    @property
    def size(self) -> int:
        return self._tree.size

    def extend(self, entries: Iterable[LedgerEntry]) -> None:
        for entry in entries:
            if entry.seq != self.size + 1 or entry.prev_hash != self._tip:
                raise ValueError(f"entry {entry.seq} does not continue the tree at {self.size}")
            self._tree.append(leaf_of(entry))
            self._tip = entry.entry_hash

    def extend_records(self, records: Iterable[ExportRecord]) -> None:
        """:meth:`extend` from a reader's lean ``records()`` (or an export);
        the hash each record claims is checked against its content."""
        for record in records:
            document = record.document
            if document.get("seq") != self.size + 1 or document.get("prev_hash") != self._tip.hex():
                raise ValueError(f"entry {document.get('seq')} does not continue the tree")
            data = record.data or canonical_json(document)
            if hashlib.sha256(data).hexdigest() != record.entry_hash:
                raise ValueError(f"entry {self.size + 1} does not match its hash")
            self._tree.append(leaf_hash(data))
            self._tip = bytes.fromhex(record.entry_hash)

    def checkpoint(self, size: int | None = None) -> Checkpoint:
        size = self.size if size is None else size
        return Checkpoint(self.origin, size, self._tree.root(size))

    def signed_checkpoint(self, signer: NoteSigner, size: int | None = None) -> str:
        return sign_checkpoint(self.checkpoint(size), [signer])

    def inclusion_proof(self, seq: int, tree_size: int | None = None) -> InclusionProof:
        tree_size = self.size if tree_size is None else tree_size
        hashes = self._tree.inclusion_proof(seq - 1, tree_size)
        return InclusionProof(seq, tree_size, tuple(hashes))

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> ConsistencyProof:
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
