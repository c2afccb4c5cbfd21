"""Member-cluster credentials at rest: Fernet (AES-128-CBC + HMAC-SHA256)
under a key derived from ``QM_SECRET_KEY`` with HKDF-SHA256.

What is sealed names the key that sealed it, so that rotating
``QM_SECRET_KEY`` is unambiguous: ``qm1.<key id>.<Fernet token>``, the key
id a second HKDF output of the same secret (it says which key, and nothing
of it). A process opens what any of its keys sealed — ``QM_SECRET_KEY`` and
``QM_SECRET_KEY_PREVIOUS`` — and seals with the first only;
``quartermaster secrets rotate`` re-seals what the previous key sealed
(service/app/rotation.py). A bare Fernet token, sealed before the key id
was written, is opened by whichever key's HMAC verifies it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["FORMAT", "SecretBox"]

#: The sealed format's version tag.
FORMAT = b"qm1"
_SEPARATOR = b"."


def _derive(secret_key: str, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(
        secret_key.encode()
    )


@dataclass(frozen=True)
class _Key:
    id: str
    fernet: Fernet

    @classmethod
    def of(cls, secret_key: str) -> _Key:
        key = _derive(secret_key, b"quartermaster cluster credentials", 32)
        key_id = _derive(secret_key, b"quartermaster cluster credentials key id", 8).hex()
        return cls(key_id, Fernet(base64.urlsafe_b64encode(key)))


class SecretBox:
    """Seals under ``secret_key``; opens what it or any of ``previous`` sealed."""

    def __init__(self, secret_key: str, previous: str | Iterable[str] | None = None) -> None:
        self._current = _Key.of(secret_key)
        others = [previous] if isinstance(previous, str) else list(previous or ())
        self._keys = {self._current.id: self._current}
        for other in others:
            if other:
                key = _Key.of(other)
                self._keys.setdefault(key.id, key)

    @property
    def key_id(self) -> str:
        """The id of the key this box seals with."""
        return self._current.id

    def seal(self, plaintext: bytes) -> bytes:
        token = self._current.fernet.encrypt(plaintext)
        return _SEPARATOR.join((FORMAT, self._current.id.encode(), token))

    def open(self, sealed: bytes) -> bytes:
        key_id, token = _parts(sealed)
        keys = self._keys.values() if key_id is None else [self._keys.get(key_id)]
        for key in keys:
            if key is None:
                break
            try:
                return key.fernet.decrypt(token)
            except InvalidToken:
                continue
        raise ValueError(
            "credentials cannot be decrypted with this QM_SECRET_KEY"
            + (f" (sealed under key id {key_id})" if key_id else "")
            + ": during a rotation, give the old key as QM_SECRET_KEY_PREVIOUS"
        )

    def sealed_under(self, sealed: bytes) -> str | None:
        """The id of the key that sealed ``sealed`` (``None``: a bare token
        from before key ids, whichever key that was)."""
        return _parts(sealed)[0]

    def is_current(self, sealed: bytes) -> bool:
        """Sealed by this box's own key, in the current format."""
        return self.sealed_under(sealed) == self._current.id

    def reseal(self, sealed: bytes) -> bytes:
        """``sealed`` opened and sealed again under the current key."""
        return self.seal(self.open(sealed))


def _parts(sealed: bytes) -> tuple[str | None, bytes]:
    """(key id, Fernet token) of a sealed value; a bare token has no key id
    (a Fernet token is URL-safe base64: it never holds the separator)."""
    head, dot, rest = sealed.partition(_SEPARATOR)
    if not dot or head != FORMAT:
        return None, sealed
    key_id, dot, token = rest.partition(_SEPARATOR)
    if not dot:
        raise ValueError("sealed credentials are malformed (no key id)")
    return key_id.decode("ascii", "replace"), token
