"""Merkle tree heads and proofs against a deliberately naive RFC 6962 written
here from the RFC's recursive definitions (§2.1, §2.1.1, §2.1.2), sharing no
code with service.ledger.merkle."""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ledger.merkle import (
    EMPTY_ROOT,
    CompactRange,
    MerkleTree,
    leaf_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)

# --- the reference: RFC 6962 as written ------------------------------------------------


def ref_mth(data: list[bytes]) -> bytes:
    n = len(data)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + data[0]).digest()
    k = ref_k(n)
    return hashlib.sha256(b"\x01" + ref_mth(data[:k]) + ref_mth(data[k:])).digest()


def ref_k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_path(m: int, data: list[bytes]) -> list[bytes]:
    n = len(data)
    if n == 1:
        return []
    k = ref_k(n)
    if m < k:
        return [*ref_path(m, data[:k]), ref_mth(data[k:])]
    return [*ref_path(m - k, data[k:]), ref_mth(data[:k])]


def ref_subproof(m: int, data: list[bytes], complete: bool) -> list[bytes]:
    n = len(data)
    if m == n:
        return [] if complete else [ref_mth(data)]
    k = ref_k(n)
    if m <= k:
        return [*ref_subproof(m, data[:k], complete), ref_mth(data[k:])]
    return [*ref_subproof(m - k, data[k:], False), ref_mth(data[:k])]


def ref_proof(m: int, data: list[bytes]) -> list[bytes]:
    return ref_subproof(m, data, True)


# --- sizes worth trying: 1, powers of two and their neighbours, and a few others ------

POW2_SIZES = sorted({s for p in range(7) for s in (2**p - 1, 2**p, 2**p + 1) if s >= 1})
SIZES = sorted({*POW2_SIZES, 6, 7, 10, 11, 13, 21, 37, 100})


def data_of(n: int) -> list[bytes]:
    return [f"entry {i}".encode() * (i % 3 + 1) for i in range(n)]


def tree_of(data: list[bytes]) -> MerkleTree:
    return MerkleTree(leaf_hash(d) for d in data)


def ceil_log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def flip(digest: bytes) -> bytes:
    return bytes([digest[0] ^ 1]) + digest[1:]


def test_empty_tree_has_the_hash_of_nothing() -> None:
    assert MerkleTree().root() == EMPTY_ROOT == ref_mth([]) == CompactRange().root()


@pytest.mark.parametrize("n", SIZES)
def test_every_prefix_root_matches_the_reference(n: int) -> None:
    data = data_of(n)
    tree, frontier = tree_of(data), CompactRange()
    for size in range(1, n + 1):
        frontier.append(leaf_hash(data[size - 1]))
        expected = ref_mth(data[:size])
        assert tree.root(size) == expected
        assert frontier.root() == expected
    assert root_of(leaf_hash(d) for d in data) == tree.root()


@pytest.mark.parametrize("n", SIZES)
def test_inclusion_proofs_match_the_reference_and_verify(n: int) -> None:
    data = data_of(n)
    tree = tree_of(data)
    for size in {1, n // 2 or 1, n - 1 or 1, n}:
        root = ref_mth(data[:size])
        for index in range(size):
            proof = tree.inclusion_proof(index, size)
            assert proof == ref_path(index, data[:size])
            assert len(proof) <= ceil_log2(size)
            assert verify_inclusion(leaf_hash(data[index]), index, size, proof, root)


@pytest.mark.parametrize("n", SIZES)
def test_consistency_proofs_match_the_reference_and_verify(n: int) -> None:
    data = data_of(n)
    tree = tree_of(data)
    new_root = ref_mth(data)
    for m in range(1, n + 1):
        proof = tree.consistency_proof(m, n)
        expected = ref_proof(m, data) if m < n else []
        assert proof == expected
        # RFC 6962 consistency proofs need one hash more than the issue's
        # ⌈log2 n⌉ in some cases (m=3, n=4 needs h(0..1), h(2), h(3)).
        assert len(proof) <= ceil_log2(n) + 1
        assert verify_consistency(m, n, ref_mth(data[:m]), new_root, proof)


def test_consistency_bound_is_tight_at_three_of_four() -> None:
    data = data_of(4)
    assert len(tree_of(data).consistency_proof(3, 4)) == 3
    assert ref_proof(3, data) == [ref_mth(data[2:3]), ref_mth(data[3:4]), ref_mth(data[0:2])]


def test_the_true_consistency_bound_for_every_size_up_to_300() -> None:
    """What docs/ledger.md states: an RFC 6962 consistency proof from m to n
    has at most ⌈log2 n⌉ + 1 hashes, every n ≥ 4 has an m that needs them all
    (m = 3 is one), and when m is a power of two ⌈log2 n⌉ suffice (the old
    root is a node of the new tree, which the verifier already holds)."""
    data = data_of(300)
    tree = tree_of(data)
    for n in range(2, 301):
        lengths = {m: len(tree.consistency_proof(m, n)) for m in range(1, n)}
        assert max(lengths.values()) <= ceil_log2(n) + 1
        if n >= 4:
            assert lengths[3] == ceil_log2(n) + 1, n
        for m, length in lengths.items():
            if m & (m - 1) == 0:
                assert length <= ceil_log2(n), (m, n)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 16, 17])
def test_tampered_inclusion_proofs_are_refused(n: int) -> None:
    data = data_of(n)
    tree = tree_of(data)
    root = tree.root()
    for index in range(n):
        proof = tree.inclusion_proof(index, n)
        leaf = leaf_hash(data[index])
        assert not verify_inclusion(flip(leaf), index, n, proof, root)
        assert not verify_inclusion(leaf, index, n, proof, flip(root))
        assert not verify_inclusion(leaf, index, n, [*proof, root], root)
        assert not verify_inclusion(leaf, n, n, proof, root)
        for position in range(len(proof)):
            broken = list(proof)
            broken[position] = flip(broken[position])
            assert not verify_inclusion(leaf, index, n, broken, root)
        if proof:
            assert not verify_inclusion(leaf, index, n, proof[:-1], root)
        if n > 1:
            other = (index + 1) % n
            assert not verify_inclusion(leaf, other, n, proof, root)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 9, 16, 17, 31])
def test_tampered_consistency_proofs_are_refused(n: int) -> None:
    data = data_of(n)
    tree = tree_of(data)
    new_root = tree.root()
    for m in range(1, n):
        old_root = tree.root(m)
        proof = tree.consistency_proof(m, n)
        assert not verify_consistency(m, n, flip(old_root), new_root, proof)
        assert not verify_consistency(m, n, old_root, flip(new_root), proof)
        assert not verify_consistency(m, n, old_root, new_root, [])
        assert not verify_consistency(m, n, old_root, new_root, proof[:-1])
        assert not verify_consistency(m, n, old_root, new_root, [*proof, new_root])
        for position in range(len(proof)):
            broken = list(proof)
            broken[position] = flip(broken[position])
            assert not verify_consistency(m, n, old_root, new_root, broken)


def test_a_forked_tree_is_not_consistent_with_the_old_head() -> None:
    data = data_of(20)
    forked = [*data[:9], b"forged", *data[10:]]
    old_root = ref_mth(data[:12])
    proof = tree_of(forked).consistency_proof(12, 20)
    assert not verify_consistency(12, 20, old_root, ref_mth(forked), proof)


def test_trivial_consistency_cases() -> None:
    root = ref_mth(data_of(5))
    assert verify_consistency(5, 5, root, root, [])
    assert not verify_consistency(5, 5, root, flip(root), [])
    assert not verify_consistency(5, 5, root, root, [root])
    assert verify_consistency(0, 5, EMPTY_ROOT, root, [])
    assert not verify_consistency(6, 5, root, root, [])


def test_out_of_range_requests_raise() -> None:
    tree = tree_of(data_of(5))
    with pytest.raises(IndexError):
        tree.root(6)
    with pytest.raises(IndexError):
        tree.inclusion_proof(5, 5)
    with pytest.raises(IndexError):
        tree.consistency_proof(4, 6)
    with pytest.raises(ValueError):
        tree.append(b"short")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.data())
def test_random_sizes_and_positions(n: int, draw: st.DataObject) -> None:
    data = data_of(n)
    tree = tree_of(data)
    size = draw.draw(st.integers(1, n))
    index = draw.draw(st.integers(0, size - 1))
    old = draw.draw(st.integers(1, size))
    assert tree.inclusion_proof(index, size) == ref_path(index, data[:size])
    assert tree.consistency_proof(old, size) == (ref_proof(old, data[:size]) if old < size else [])
    assert tree.leaf(index) == leaf_hash(data[index])


@pytest.mark.parametrize("n", [255, 256, 257, 1023, 1024, 1025])
def test_larger_powers_of_two_and_neighbours_sampled(n: int) -> None:
    data = data_of(n)
    tree = tree_of(data)
    root = ref_mth(data)
    assert tree.root() == root
    for index in [0, 1, n // 3, n // 2, n - 2, n - 1]:
        proof = tree.inclusion_proof(index)
        assert proof == ref_path(index, data)
        assert len(proof) <= ceil_log2(n)
        assert verify_inclusion(leaf_hash(data[index]), index, n, proof, root)
    for m in [1, 2, 3, n // 2, n // 2 + 1, n - 1]:
        proof = tree.consistency_proof(m)
        assert proof == ref_proof(m, data)
        assert verify_consistency(m, n, ref_mth(data[:m]), root, proof)
