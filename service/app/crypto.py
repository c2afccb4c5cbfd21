"""Member-cluster credentials at rest: Fernet (AES-128-CBC + HMAC-SHA256)
under a key derived from ``QM_SECRET_KEY`` with HKDF-SHA256."""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


class SecretBox:
    def __init__(self, secret_key: str) -> None:
        key = HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=None,
            info=b"quartermaster cluster credentials",
        ).derive(secret_key.encode())
        self._fernet = Fernet(base64.urlsafe_b64encode(key))

    def seal(self, plaintext: bytes) -> bytes:
        return self._fernet.encrypt(plaintext)

    def open(self, sealed: bytes) -> bytes:
        try:
            return self._fernet.decrypt(sealed)
        except InvalidToken as error:
            raise ValueError("credentials cannot be decrypted with this QM_SECRET_KEY") from error
