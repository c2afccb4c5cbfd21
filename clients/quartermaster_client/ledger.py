"""Verifying a ledger export without the server: the hash chain, the Merkle
tree and, given the ledger's verifier key, a signed checkpoint.

An NDJSON export line is ``{"entry": DOCUMENT, "entry_hash": HEX}``, where
DOCUMENT is exactly what the service hashed: ``entry_hash`` is
``SHA-256(JCS(DOCUMENT))`` (RFC 8785), DOCUMENT carries ``seq`` and the
previous entry's hash as ``prev_hash``, and the same JCS bytes are the
entry's RFC 6962 Merkle leaf. A checkpoint is a C2SP signed note (origin,
tree size, base64 root hash) signed with Ed25519 under a key written
``name+hex(key id)+base64(0x01 || public key)``; a whole export opens with
the latest one as ``{"checkpoint": NOTE}``. Written from those specs
(docs/ledger.md), not from the service's code, so that an auditor's check is
independent of what it checks; the tests compare the two.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from quartermaster_client.errors import QuartermasterError

GENESIS = "0" * 64
_DASH = "\u2014 "


# -- RFC 8785 (JCS) ----------------------------------------------------------------------


def _number(value: float) -> str:
    """ECMAScript Number::toString (RFC 8785 §3.2.2.3)."""
    if not math.isfinite(value):
        raise ValueError("JSON has no NaN or Infinity")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that round-trip, as ECMAScript does.
    digits_tuple = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digits_tuple.digits)).rstrip("0") or "0"
    exponent = int(digits_tuple.exponent)
    k = len(digits)
    n = exponent + len(digits_tuple.digits)  # the decimal point sits after n digits
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text


def _encode(value: Any, out: list[str]) -> None:
    if value is None or isinstance(value, bool):
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        # Keys in UTF-16 code-unit order (RFC 8785 §3.2.3).
        for index, key in enumerate(sorted(value, key=lambda k: k.encode("utf-16-be"))):
            if index:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")


def canonical_json(value: Any) -> bytes:
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")


# -- RFC 6962 Merkle tree ----------------------------------------------------------------


class MerkleRoot:
    """The root of a growing tree, from the roots of its perfect subtrees."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[bytes] = []

    def append(self, leaf: bytes) -> None:
        digest, carry = hashlib.sha256(b"\x00" + leaf).digest(), self.size
        while carry & 1:
            digest = hashlib.sha256(b"\x01" + self._stack.pop() + digest).digest()
            carry >>= 1
        self._stack.append(digest)
        self.size += 1

    def root(self) -> bytes:
        if not self._stack:
            return hashlib.sha256(b"").digest()
        digest = self._stack[-1]
        for left in reversed(self._stack[:-1]):
            digest = hashlib.sha256(b"\x01" + left + digest).digest()
        return digest


# -- checkpoints -------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root_hash: bytes
    text: str
    signatures: list[tuple[str, bytes]]


def parse_checkpoint(note: str) -> Checkpoint:
    text, separator, signed = note.rpartition("\n\n")
    if not separator:
        raise ValueError("a signed note is text, a blank line, then signature lines")
    lines = text.split("\n")
    if len(lines) < 3 or not lines[1].isdigit():
        raise ValueError("a checkpoint has an origin, a tree size and a root hash")
    try:
        root = base64.b64decode(lines[2], validate=True)
    except binascii.Error as error:
        raise ValueError("the root hash is not base64") from error
    signatures = []
    for line in signed.strip("\n").split("\n"):
        if not line.startswith(_DASH):
            raise ValueError(f"bad signature line {line!r}")
        name, _, blob = line[len(_DASH) :].partition(" ")
        signatures.append((name, base64.b64decode(blob)))
    return Checkpoint(lines[0], int(lines[1]), root, text + "\n", signatures)


def signature_valid(checkpoint: Checkpoint, verifier_key: str) -> bool:
    """Whether the key signed the note (needs the ``cryptography`` package:
    ``pip install quartermaster-client[verify]``)."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as error:
        raise QuartermasterError(
            "checking a signature needs the cryptography package: "
            "pip install 'quartermaster-client[verify]'"
        ) from error

    name, key_id_hex, encoded = verifier_key.strip().split("+", 2)
    raw = base64.b64decode(encoded, validate=True)
    if raw[:1] != b"\x01" or len(raw) != 33:
        raise ValueError("only Ed25519 verifier keys are supported")
    key_id = bytes.fromhex(key_id_hex)
    if hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4] != key_id:
        raise ValueError("the verifier key's id does not match its key")
    public = Ed25519PublicKey.from_public_bytes(raw[1:])
    for signer, blob in checkpoint.signatures:
        if signer != name or blob[:4] != key_id or len(blob) != 68:
            continue
        try:
            public.verify(blob[4:], checkpoint.text.encode())
        except InvalidSignature:
            continue
        return True
    return False


# -- verification ------------------------------------------------------------------------


@dataclass
class Report:
    """What was checked: every entry's hash and link (``breaks`` lists what
    failed), and, when there was a checkpoint, the root at its size and, with
    a key, its signature (None: not checked)."""

    entries: int = 0
    head_hash: str = GENESIS
    root_hash: bytes = b""
    breaks: list[tuple[int, str]] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    checkpoint_from: str | None = None
    """``given`` (by the caller) or ``export`` (the export's first line)"""
    checkpoint_matches: bool | None = None
    signature: bool | None = None

    @property
    def ok(self) -> bool:
        """Nothing that was checked failed."""
        return (
            not self.breaks and self.checkpoint_matches is not False and self.signature is not False
        )

    @property
    def verified(self) -> bool:
        """Nothing failed, and a checkpoint whose signature the key accepted
        covers the entries up to its size."""
        return self.ok and self.checkpoint_matches is True and self.signature is True

    @property
    def unsigned(self) -> int:
        """Entries after the checkpoint: chain-checked, but signed by no one yet."""
        return self.entries - (self.checkpoint.size if self.checkpoint else 0)


def export_checkpoint(line: str | bytes) -> str | None:
    """The signed note of an export's opening ``{"checkpoint": NOTE}`` line,
    or None for any other line."""
    try:
        found = json.loads(line)
    except ValueError:
        return None
    if isinstance(found, dict) and set(found) == {"checkpoint"}:
        note = found["checkpoint"]
        return note if isinstance(note, str) else None
    return None


def verify_export(
    lines: Iterable[str | bytes],
    checkpoint_note: str | None = None,
    verifier_key: str | None = None,
) -> Report:
    """Check every line of an NDJSON export: its hash, its link to the line
    before, gap-free ``seq`` from 1; then the Merkle root at the checkpoint's
    size against the checkpoint, and, given ``verifier_key``, the checkpoint's
    signature. The checkpoint is ``checkpoint_note`` or else the one a whole
    export opens with."""
    report = Report()
    tree = MerkleRoot()
    first = True
    for raw in lines:
        if not raw.strip():
            continue
        if first:
            first = False
            embedded = export_checkpoint(raw)
            note = checkpoint_note or embedded
            if note is not None:
                report.checkpoint = parse_checkpoint(note)
                report.checkpoint_from = "given" if checkpoint_note else "export"
                if report.checkpoint.size == 0:
                    report.checkpoint_matches = tree.root() == report.checkpoint.root_hash
            if embedded is not None:
                continue
        _check_line(raw, report, tree)
    report.root_hash = tree.root()
    checkpoint = report.checkpoint
    if checkpoint is not None:
        if report.checkpoint_matches is None:
            report.checkpoint_matches = False  # the export is shorter than the checkpoint
            report.breaks.append((checkpoint.size, "the export ends before the checkpoint"))
        if verifier_key:
            report.signature = signature_valid(checkpoint, verifier_key)
    return report


def _check_line(raw: str | bytes, report: Report, tree: MerkleRoot) -> None:
    position = report.entries + 1
    report.entries += 1
    try:
        line = json.loads(raw)
        document, claimed = line["entry"], str(line["entry_hash"])
        seq = int(document.get("seq", 0))
        leaf = canonical_json(document)
    except (ValueError, TypeError, KeyError, AttributeError):
        # The root cannot match now; the break says why.
        report.breaks.append((position, "not an entry line"))
        report.head_hash = ""
        tree.append(b"")
        return
    if seq != position:
        report.breaks.append((seq, f"expected seq {position}: missing or reordered"))
    if document.get("prev_hash") != report.head_hash:
        report.breaks.append((seq, "prev_hash does not match the entry before"))
    if hashlib.sha256(leaf).hexdigest() != claimed:
        report.breaks.append((seq, "the entry's hash does not match its content"))
    report.head_hash = claimed
    tree.append(leaf)
    checkpoint = report.checkpoint
    if checkpoint is not None and tree.size == checkpoint.size:
        report.checkpoint_matches = tree.root() == checkpoint.root_hash


__all__ = [
    "Report",
    "canonical_json",
    "export_checkpoint",
    "parse_checkpoint",
    "signature_valid",
    "verify_export",
]
