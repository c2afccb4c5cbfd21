"""The console's session: the bearer token a person signed in with, sealed
in an HttpOnly, SameSite=Strict cookie that only this service can open.

The cookie is Fernet (AES-128-CBC and HMAC-SHA256, with its issue time)
under a key derived from ``QM_SECRET_KEY`` by HKDF: a reader of the browser's
cookies sees ciphertext, a forger needs the key, and an old cookie expires.
The token inside is authenticated on every request exactly as a bearer token
is (``service.api.deps.current_principal``), so a revoked token ends every
session made with it. The session also carries its CSRF token (synchronizer
pattern): pages embed it and every state-changing request must send it back.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: The session cookie, scoped to the console's paths.
COOKIE = "qm_console"
#: The sign-in form's CSRF cookie (double submit: no session exists yet).
SIGNIN_COOKIE = "qm_console_signin"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
_INFO = b"quartermaster console session v1"


@dataclass(frozen=True)
class Session:
    token: str
    csrf: str


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def same_secret(a: str | None, b: str | None) -> bool:
    """Constant-time comparison of two CSRF tokens (neither may be empty)."""
    return bool(a) and bool(b) and hmac.compare_digest(str(a).encode(), str(b).encode())


class SessionCodec:
    def __init__(self, secret_key: str, max_age_seconds: int) -> None:
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(
            secret_key.encode()
        )
        self._fernet = Fernet(base64.urlsafe_b64encode(derived))
        self.max_age = max_age_seconds

    def seal(self, session: Session) -> str:
        payload = json.dumps({"t": session.token, "c": session.csrf}).encode()
        return self._fernet.encrypt(payload).decode()

    def open(self, sealed: str | None) -> Session | None:
        """The session in a cookie, or None if absent, forged or expired."""
        if not sealed:
            return None
        try:
            payload = json.loads(self._fernet.decrypt(sealed.encode(), ttl=self.max_age))
            return Session(str(payload["t"]), str(payload["c"]))
        except (InvalidToken, ValueError, KeyError, TypeError):
            return None


def _loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cookie_is_secure(scheme: str, client: str | None, host: str, insecure_localhost: bool) -> bool:
    """Whether to mark a cookie ``Secure``: always, but for a plain-HTTP
    request from and to loopback when ``insecure_localhost`` says so."""
    if not insecure_localhost or scheme != "http":
        return True
    server = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return not (client is not None and _loopback(client) and _loopback(server))


def set_cookie_header(name: str, value: str, path: str, max_age: int, secure: bool) -> str:
    """A ``Set-Cookie`` value: HttpOnly, SameSite=Strict, Secure unless told."""
    parts = [f"{name}={value}", f"Path={path}", f"Max-Age={max_age}", "HttpOnly"]
    parts.append("SameSite=Strict")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)
