"""Signed checkpoints of the ledger's Merkle tree.

The format is C2SP ``tlog-checkpoint`` (https://c2sp.org/tlog-checkpoint)
carried in a C2SP ``signed-note`` (https://c2sp.org/signed-note), so that
tools written for Certificate Transparency-style logs can read ours::

    quartermaster.example/ledger      <- origin: names the log
    1000000                           <- tree size, decimal
    3q2+7w...=                        <- root hash, standard base64
                                      <- blank line ends the note text
    — quartermaster.example/ledger AbCd...   <- "— name base64(key id || signature)"

An Ed25519 signature covers the note text (every line up to and including
the root line's newline). The key id is the first four bytes of
``SHA-256(name || 0x0A || 0x01 || public key)``; a verifier key is written
``name+hex(key id)+base64(0x01 || public key)``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from service.ledger.merkle import HASH_SIZE, verify_consistency

DEFAULT_ORIGIN: Final = "quartermaster.dev/ledger"
ED25519: Final = b"\x01"
_DASH: Final = "\u2014 "
_MAX_SIGNATURES: Final = 100


class CheckpointError(ValueError):
    """A note that is malformed, unsigned by the expected key, or inconsistent."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.origin or "\n" in self.origin:
            raise CheckpointError("the origin is one non-empty line")
        if self.size < 0:
            raise CheckpointError("the tree size is not negative")
        if len(self.root_hash) != HASH_SIZE:
            raise CheckpointError("the root hash is 32 bytes")
        if any(not line or "\n" in line for line in self.extensions):
            raise CheckpointError("extension lines are non-empty single lines")

    def text(self) -> str:
        """The note text that is signed."""
        root = base64.b64encode(self.root_hash).decode()
        lines = [self.origin, str(self.size), root, *self.extensions]
        return "".join(f"{line}\n" for line in lines)


def parse_checkpoint_text(text: str) -> Checkpoint:
    if not text.endswith("\n"):
        raise CheckpointError("the checkpoint text ends with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointError("a checkpoint has an origin, a size and a root hash")
    origin, size, root, *extensions = lines
    if not size.isascii() or not size.isdigit() or (size != "0" and size.startswith("0")):
        raise CheckpointError(f"bad tree size {size!r}")
    try:
        root_hash = base64.b64decode(root, validate=True)
    except binascii.Error as exc:
        raise CheckpointError("the root hash is not base64") from exc
    return Checkpoint(origin, int(size), root_hash, tuple(extensions))


def _key_id(name: str, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + ED25519 + public_key).digest()[:4]


def _check_name(name: str) -> None:
    if not name or any(c.isspace() for c in name) or "+" in name:
        raise CheckpointError(f"bad key name {name!r}: non-empty, no spaces, no '+'")


class NoteSigner:
    """Signs notes with an Ed25519 key under a key name (usually the origin)."""

    def __init__(self, name: str, key: Ed25519PrivateKey) -> None:
        _check_name(name)
        self.name = name
        self._key = key
        self.public_key = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = _key_id(name, self.public_key)

    @classmethod
    def from_seed(cls, name: str, seed_b64: str) -> NoteSigner:
        """``QM_LEDGER_SIGNING_KEY``: the 32-byte Ed25519 private key, base64."""
        try:
            seed = base64.b64decode(seed_b64, validate=True)
        except binascii.Error as exc:
            raise CheckpointError("the signing key is not base64") from exc
        if len(seed) != 32:
            raise CheckpointError("the signing key is 32 bytes of Ed25519 private key")
        return cls(name, Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def generate(cls, name: str) -> tuple[NoteSigner, str]:
        """A fresh key and its seed in base64, for ``QM_LEDGER_SIGNING_KEY``."""
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        key = Ed25519PrivateKey.generate()
        seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return cls(name, key), base64.b64encode(seed).decode()

    @property
    def verifier_key(self) -> str:
        """The ``name+keyid+key`` string auditors keep to verify offline."""
        encoded = base64.b64encode(ED25519 + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{encoded}"

    def verifier(self) -> NoteVerifier:
        return NoteVerifier.from_key(self.verifier_key)

    def signature_line(self, text: str) -> str:
        signature = self._key.sign(text.encode())
        return f"{_DASH}{self.name} {base64.b64encode(self.key_id + signature).decode()}\n"


@dataclass(frozen=True, slots=True)
class NoteVerifier:
    name: str
    key_id: bytes
    public_key: Ed25519PublicKey

    @classmethod
    def from_key(cls, vkey: str) -> NoteVerifier:
        parts = vkey.strip().split("+", 2)  # the base64 key may contain "+"
        if len(parts) != 3:
            raise CheckpointError("a verifier key reads name+keyid+base64key")
        name, hex_id, encoded = parts
        _check_name(name)
        try:
            key_id, raw = bytes.fromhex(hex_id), base64.b64decode(encoded, validate=True)
        except (ValueError, binascii.Error) as exc:
            raise CheckpointError("bad verifier key encoding") from exc
        if len(key_id) != 4 or len(raw) != 33 or raw[:1] != ED25519:
            raise CheckpointError("only Ed25519 verifier keys are supported")
        if _key_id(name, raw[1:]) != key_id:
            raise CheckpointError("the verifier key's id does not match its key")
        return cls(name, key_id, Ed25519PublicKey.from_public_bytes(raw[1:]))

    def accepts(self, text: str, name: str, blob: bytes) -> bool:
        if name != self.name or blob[:4] != self.key_id or len(blob) != 4 + 64:
            return False
        try:
            self.public_key.verify(blob[4:], text.encode())
        except InvalidSignature:
            return False
        return True


def sign_checkpoint(checkpoint: Checkpoint, signers: Sequence[NoteSigner]) -> str:
    """The signed note: checkpoint text, a blank line, one line per signer."""
    if not signers:
        raise CheckpointError("a checkpoint needs at least one signature")
    text = checkpoint.text()
    return text + "\n" + "".join(s.signature_line(text) for s in signers)


def open_checkpoint(note: str, verifier: NoteVerifier) -> Checkpoint:
    """Parse a signed note and return its checkpoint if ``verifier``'s key
    signed it; signatures by other keys are ignored (signed-note §Verifying)."""
    text, separator, signatures = note.rpartition("\n\n")
    if not separator or not signatures.endswith("\n"):
        raise CheckpointError("a signed note is text, a blank line, then signature lines")
    text += "\n"
    lines = signatures[:-1].split("\n")
    if len(lines) > _MAX_SIGNATURES:
        raise CheckpointError("too many signatures")
    verified = False
    for line in lines:
        name, blob = _signature_parts(line)
        verified = verified or verifier.accepts(text, name, blob)
    if not verified:
        raise CheckpointError(f"no valid signature by {verifier.name}")
    return parse_checkpoint_text(text)


def _signature_parts(line: str) -> tuple[str, bytes]:
    if not line.startswith(_DASH):
        raise CheckpointError(f"bad signature line {line!r}")
    name, space, encoded = line[len(_DASH) :].partition(" ")
    if not space or not name:
        raise CheckpointError(f"bad signature line {line!r}")
    try:
        blob = base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise CheckpointError("a signature is not base64") from exc
    if len(blob) < 5:
        raise CheckpointError("a signature is a key id and at least one byte")
    return name, blob


def check_consistency(older: Checkpoint, newer: Checkpoint, proof: Sequence[bytes]) -> None:
    """Raise unless ``newer`` extends ``older`` (same log, the older tree a
    prefix of the newer) according to an RFC 6962 consistency proof."""
    if older.origin != newer.origin:
        raise CheckpointError(f"checkpoints of two logs: {older.origin!r}, {newer.origin!r}")
    if older.size > newer.size:
        raise CheckpointError(f"the older checkpoint is larger ({older.size} > {newer.size})")
    if not verify_consistency(older.size, newer.size, older.root_hash, newer.root_hash, proof):
        raise CheckpointError(
            f"the tree of size {newer.size} does not extend the one of size {older.size}"
        )
