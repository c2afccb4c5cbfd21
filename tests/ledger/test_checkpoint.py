"""Signed checkpoints: interoperable with the Go reference (golang.org/x/mod
sumdb/note, the origin of C2SP signed-note) and refusing every forgery."""

from __future__ import annotations

import base64
import hashlib

import pytest

from service.ledger.checkpoint import (
    Checkpoint,
    CheckpointError,
    NoteSigner,
    NoteVerifier,
    check_consistency,
    open_checkpoint,
    parse_checkpoint_text,
    sign_checkpoint,
)
from service.ledger.merkle import MerkleTree, leaf_hash

# Published vectors of golang.org/x/mod/sumdb/note (note_test.go, example_test.go).
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_SIGNATURE = (
    "\u2014 PeterNeumann "
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def go_signer() -> NoteSigner:
    seed = base64.b64decode(GO_SKEY.split("+", 4)[4])[1:]
    return NoteSigner.from_seed("PeterNeumann", base64.b64encode(seed).decode())


def tree(n: int) -> MerkleTree:
    return MerkleTree(leaf_hash(f"e{i}".encode()) for i in range(n))


def checkpoint_of(t: MerkleTree, size: int, origin: str = "qm.test/ledger") -> Checkpoint:
    return Checkpoint(origin, size, t.root(size))


@pytest.fixture
def signer() -> NoteSigner:
    return NoteSigner.generate("qm.test/ledger")[0]


def test_signature_and_key_match_the_go_reference() -> None:
    signer = go_signer()
    assert signer.verifier_key == GO_VKEY
    assert signer.signature_line(GO_TEXT) == GO_SIGNATURE


def test_the_go_note_verifies_with_the_go_key() -> None:
    verifier = NoteVerifier.from_key(GO_VKEY)
    assert verifier.accepts(
        GO_TEXT, "PeterNeumann", base64.b64decode(GO_SIGNATURE.rsplit(maxsplit=1)[-1])
    )


def test_key_id_is_the_c2sp_hash() -> None:
    signer = go_signer()
    expected = hashlib.sha256(b"PeterNeumann\n\x01" + signer.public_key).digest()[:4]
    assert signer.key_id == expected == bytes.fromhex("c74f20a3")


def test_checkpoint_text_is_the_tlog_checkpoint_layout() -> None:
    root = bytes(range(32))
    text = Checkpoint("example.com/log", 42, root, ("ext line",)).text()
    assert text == f"example.com/log\n42\n{base64.b64encode(root).decode()}\next line\n"
    assert parse_checkpoint_text(text) == Checkpoint("example.com/log", 42, root, ("ext line",))


def test_sign_and_open_round_trip(signer: NoteSigner) -> None:
    cp = checkpoint_of(tree(10), 10)
    note = sign_checkpoint(cp, [signer])
    assert note.startswith(cp.text() + "\n\u2014 qm.test/ledger ")
    assert open_checkpoint(note, signer.verifier()) == cp


def test_other_signatures_are_ignored_but_one_must_be_ours(signer: NoteSigner) -> None:
    other = NoteSigner.generate("witness.example")[0]
    cp = checkpoint_of(tree(5), 5)
    both = sign_checkpoint(cp, [other, signer])
    assert open_checkpoint(both, signer.verifier()) == cp
    with pytest.raises(CheckpointError):
        open_checkpoint(sign_checkpoint(cp, [other]), signer.verifier())


def test_a_key_with_our_name_but_another_secret_is_refused(signer: NoteSigner) -> None:
    impostor = NoteSigner.generate(signer.name)[0]
    note = sign_checkpoint(checkpoint_of(tree(5), 5), [impostor])
    with pytest.raises(CheckpointError):
        open_checkpoint(note, signer.verifier())


def test_every_byte_of_the_signed_text_counts(signer: NoteSigner) -> None:
    note = sign_checkpoint(checkpoint_of(tree(7), 7), [signer])
    text_length = note.index("\n\n") + 1
    for position in range(text_length):
        if note[position] == "\n":
            continue
        mutated = note[:position] + chr(ord(note[position]) ^ 1) + note[position + 1 :]
        with pytest.raises(CheckpointError):
            open_checkpoint(mutated, signer.verifier())


@pytest.mark.parametrize(
    "note",
    [
        "",
        "origin\n1\nAAAA\n",
        "origin\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\n",
        "origin\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\n- name abc=\n",
    ],
)
def test_malformed_notes_are_refused(signer: NoteSigner, note: str) -> None:
    with pytest.raises(CheckpointError):
        open_checkpoint(note, signer.verifier())


@pytest.mark.parametrize(
    "text",
    [
        "o\n01\n" + base64.b64encode(bytes(32)).decode() + "\n",
        "o\n-1\n" + base64.b64encode(bytes(32)).decode() + "\n",
        "o\n1\n" + base64.b64encode(bytes(31)).decode() + "\n",
        "o\n1\nnot base64!\n",
        "o\n1\n" + base64.b64encode(bytes(32)).decode(),
        "o\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\n",
    ],
)
def test_malformed_checkpoint_text_is_refused(text: str) -> None:
    with pytest.raises(CheckpointError):
        parse_checkpoint_text(text)


@pytest.mark.parametrize(
    "vkey",
    [
        GO_VKEY.replace("c74f20a3", "c74f20a4"),
        GO_VKEY.replace("PeterNeumann", "Peter"),
        GO_VKEY + "+x",
        "PeterNeumann+c74f20a3+" + base64.b64encode(b"\x02" + bytes(32)).decode(),
    ],
)
def test_bad_verifier_keys_are_refused(vkey: str) -> None:
    with pytest.raises(CheckpointError):
        NoteVerifier.from_key(vkey)


def test_signing_key_must_be_32_bytes_of_base64() -> None:
    with pytest.raises(CheckpointError):
        NoteSigner.from_seed("n", base64.b64encode(bytes(31)).decode())
    with pytest.raises(CheckpointError):
        NoteSigner.from_seed("n", "***")
    with pytest.raises(CheckpointError):
        NoteSigner.from_seed("with space", base64.b64encode(bytes(32)).decode())


def test_consistency_between_checkpoints() -> None:
    t = tree(33)
    for old in (1, 2, 3, 16, 17, 32, 33):
        check_consistency(checkpoint_of(t, old), checkpoint_of(t, 33), t.consistency_proof(old))


def test_a_fork_is_inconsistent_with_the_older_checkpoint() -> None:
    honest = [leaf_hash(f"e{i}".encode()) for i in range(20)]
    forked = list(honest)
    forked[4] = leaf_hash(b"rewritten")
    older = Checkpoint("qm.test/ledger", 10, MerkleTree(honest).root(10))
    fork_tree = MerkleTree(forked)
    newer = Checkpoint("qm.test/ledger", 20, fork_tree.root())
    with pytest.raises(CheckpointError):
        check_consistency(older, newer, fork_tree.consistency_proof(10))


def test_checkpoints_of_other_logs_or_shrinking_trees_are_refused() -> None:
    t = tree(8)
    with pytest.raises(CheckpointError):
        check_consistency(checkpoint_of(t, 4), checkpoint_of(t, 8, "other"), t.consistency_proof(4))
    with pytest.raises(CheckpointError):
        check_consistency(checkpoint_of(t, 8), checkpoint_of(t, 4), [])
