"""RFC 6962 Merkle trees over ledger entries: tree heads, proofs, verifiers.

A leaf is the RFC 8785 bytes of one entry (:func:`service.ledger.chain.entry_bytes`),
hashed as ``SHA-256(0x00 || leaf)``; an interior node is
``SHA-256(0x01 || left || right)``; the tree of ``n`` leaves splits at the
largest power of two below ``n`` (RFC 6962 §2.1, restated in RFC 9162 §2.1).

Two structures:

* :class:`CompactRange` keeps only the roots of the perfect subtrees that make
  up ``[0, n)`` (at most ⌈log2 n⌉ + 1 hashes): appending is amortised O(1),
  the root O(log n). Enough to verify a whole log in constant memory.
* :class:`MerkleTree` also keeps every perfect subtree's hash, level by level
  (32 bytes each, about 64 bytes per leaf in all), so that the root of any
  earlier size and any inclusion or consistency proof take O(log n) hashes.
  Every subtree RFC 6962's recursion visits is perfect and aligned, or is the
  right edge of a smaller tree, which is a chain of perfect ones.

Verifiers follow RFC 9162 §2.1.3.2 and §2.1.4.2 and never trust a size or a
proof length they were given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

HASH_SIZE: Final = 32
_sha256: Final = hashlib.sha256
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
_LEAF: Final = b"\x00"
_NODE: Final = b"\x01"


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(_LEAF + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two strictly below ``n`` (``n`` ≥ 2)."""
    return 1 << ((n - 1).bit_length() - 1)


class CompactRange:
    """The right-hand frontier of a growing tree: one hash per set bit of its size."""

    __slots__ = ("_size", "_stack")

    def __init__(self) -> None:
        self._size = 0
        self._stack: list[bytes] = []

    @property
    def size(self) -> int:
        return self._size

    def append(self, leaf: bytes) -> None:
        """Add a leaf by its *leaf hash*."""
        digest, carry, stack = leaf, self._size, self._stack
        while carry & 1:
            # node_hash, inlined: this runs once per leaf on average.
            digest = _sha256(_NODE + stack.pop() + digest).digest()
            carry >>= 1
        stack.append(digest)
        self._size += 1

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        digest = self._stack[-1]
        for left in reversed(self._stack[:-1]):
            digest = node_hash(left, digest)
        return digest


class MerkleTree:
    """An append-only tree that keeps every perfect subtree's hash."""

    __slots__ = ("_levels", "_size")

    def __init__(self, leaves: Iterable[bytes] = ()) -> None:
        self._size = 0
        self._levels: list[bytearray] = [bytearray()]
        for leaf in leaves:
            self.append(leaf)

    @property
    def size(self) -> int:
        return self._size

    def append(self, leaf: bytes) -> None:
        """Add a leaf by its *leaf hash*; O(log n), amortised O(1)."""
        if len(leaf) != HASH_SIZE:
            raise ValueError("a leaf is added by its 32-byte leaf hash")
        levels, index, digest = self._levels, self._size, leaf
        levels[0] += digest
        level = 0
        while index & 1:
            left = bytes(levels[level][(index - 1) * HASH_SIZE : index * HASH_SIZE])
            digest = node_hash(left, digest)
            level, index = level + 1, index >> 1
            if level == len(levels):
                levels.append(bytearray())
            levels[level] += digest
        self._size += 1

    def leaf(self, index: int) -> bytes:
        self._check_size(index + 1)
        return self._perfect(0, index)

    def root(self, size: int | None = None) -> bytes:
        """The tree head of the first ``size`` leaves (default: all)."""
        size = self._size if size is None else size
        self._check_size(size)
        return self._range(0, size) if size else EMPTY_ROOT

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """RFC 6962 ``PATH(index, D[0:size])``, deepest sibling first."""
        size = self._size if size is None else size
        self._check_size(size)
        if not 0 <= index < size:
            raise IndexError(f"leaf {index} is not in a tree of size {size}")
        proof: list[bytes] = []
        lo, hi = 0, size
        while hi - lo > 1:
            k = split_point(hi - lo)
            if index < lo + k:
                proof.append(self._range(lo + k, hi))
                hi = lo + k
            else:
                proof.append(self._range(lo, lo + k))
                lo += k
        proof.reverse()
        return proof

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """RFC 6962 ``PROOF(old_size, D[0:new_size])``; empty when there is
        nothing to prove (an empty old tree, or equal sizes)."""
        new_size = self._size if new_size is None else new_size
        self._check_size(new_size)
        if not 0 <= old_size <= new_size:
            raise IndexError(f"no consistency proof from size {old_size} to {new_size}")
        if old_size in (0, new_size):
            return []
        proof: list[bytes] = []
        m, lo, hi, complete = old_size, 0, new_size, True
        while m != hi:
            k = split_point(hi - lo)
            if m - lo <= k:
                proof.append(self._range(lo + k, hi))
                hi = lo + k
            else:
                proof.append(self._range(lo, lo + k))
                lo, complete = lo + k, False
        if not complete:
            proof.append(self._range(lo, hi))
        proof.reverse()
        return proof

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self._size:
            raise IndexError(f"the tree has {self._size} leaves, not {size}")

    def _perfect(self, level: int, index: int) -> bytes:
        start = index * HASH_SIZE
        return bytes(self._levels[level][start : start + HASH_SIZE])

    def _range(self, lo: int, hi: int) -> bytes:
        """``MTH(D[lo:hi])`` for a range RFC 6962's recursion can reach: a
        perfect aligned subtree is read, anything else is its right edge."""
        width = hi - lo
        if width & (width - 1) == 0 and lo % width == 0:
            return self._perfect(width.bit_length() - 1, lo // width)
        k = split_point(width)
        return node_hash(self._range(lo, lo + k), self._range(lo + k, hi))


def root_of(leaves: Iterable[bytes]) -> bytes:
    """The tree head over leaf *hashes*, in constant memory."""
    frontier = CompactRange()
    for leaf in leaves:
        frontier.append(leaf)
    return frontier.root()


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 §2.1.3.2: is the leaf *hash* ``leaf`` at ``index`` in the tree
    of ``size`` leaves whose head is ``root``?"""
    if not 0 <= index < size:
        return False
    fn, sn, digest = index, size - 1, leaf
    for sibling in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            digest = node_hash(sibling, digest)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            digest = node_hash(digest, sibling)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and digest == root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2: is the tree of ``old_size`` with head ``old_root`` a
    prefix of the tree of ``new_size`` with head ``new_root``?"""
    if not 0 <= old_size <= new_size:
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof and old_root == EMPTY_ROOT
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for node in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(node, fr), node_hash(node, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, node)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old_root and sr == new_root
