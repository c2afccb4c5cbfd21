"""Who is calling, and what their role lets them do.

Roles never imply one another (DESIGN.md): each permission names the roles
that hold it. Bearer tokens are stored as SHA-256 of the secret; OIDC JWTs,
where configured, are verified against the issuer's JWKS and a claim maps
them to roles.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID, uuid4

import jwt
from sqlalchemy import Engine, select, text

from service.app.errors import AlreadyExists, Forbidden, Invalid, NotFound, Unauthorized
from service.app.uow import SqlUnitOfWork
from service.eventstore.port import EventMetadata, NewEvent
from service.projections.resources import token_row, upsert_tokens
from service.projections.schema import api_tokens


class Role(StrEnum):
    SUBMITTER = "submitter"
    QUEUE_ADMIN = "queue-admin"
    CLUSTER_ADMIN = "cluster-admin"
    SECURITY_ADMIN = "security-admin"
    """Relaxes a ClusterQueue's security floor, and changes nothing else."""
    AUDITOR = "auditor"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[Role]
    namespaces: frozenset[str] = field(default_factory=frozenset)
    """Namespaces a submitter may act in; ``*`` means all."""

    @property
    def key(self) -> str:
        """What idempotency keys and rate limits are scoped by."""
        return self.name

    def has(self, allowed: frozenset[Role]) -> bool:
        return bool(self.roles & allowed)

    def in_namespace(self, namespace: str) -> bool:
        """Whether a namespaced permission applies in ``namespace``: every
        role but submitter acts fleet-wide; a submitter only in its own."""
        if self.roles - {Role.SUBMITTER}:
            return True
        return "*" in self.namespaces or namespace in self.namespaces


def require(principal: Principal, allowed: frozenset[Role], namespace: str | None = None) -> None:
    if not principal.has(allowed):
        wanted = ", ".join(sorted(allowed))
        raise Forbidden(f"{principal.name} lacks a role for this ({wanted})")
    if namespace is not None and not principal.in_namespace(namespace):
        raise Forbidden(f"{principal.name} may not act in namespace {namespace}")


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class IssuedToken:
    id: UUID
    name: str
    role: Role
    namespaces: list[str]
    token: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class OidcConfig:
    issuer: str
    audience: str
    jwks_url: str
    roles_claim: str = "groups"
    namespaces_claim: str = "namespaces"


def _claim_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.replace(",", " ").split()
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


class OidcVerifier:
    """Verifies an OIDC ID or access token (a JWT) against the issuer's JWKS
    (cached by PyJWT's client, refetched on an unknown key id), and maps a
    claim to roles: every value that names a role grants it."""

    ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA")

    def __init__(self, config: OidcConfig) -> None:
        self._config = config
        self._keys = jwt.PyJWKClient(config.jwks_url, cache_keys=True, lifespan=600)

    def verify(self, token: str) -> Principal:
        try:
            key = self._keys.get_signing_key_from_jwt(token)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=list(self.ALGORITHMS),
                audience=self._config.audience,
                issuer=self._config.issuer,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except (jwt.PyJWTError, jwt.PyJWKClientError) as error:
            raise Unauthorized(f"the OIDC token was refused: {error}") from None
        known = {role.value for role in Role}
        roles = frozenset(
            Role(v) for v in _claim_list(claims.get(self._config.roles_claim)) if v in known
        )
        namespaces = frozenset(_claim_list(claims.get(self._config.namespaces_claim)))
        return Principal(f"oidc:{claims['sub']}", roles, namespaces)


def new_secret() -> str:
    """A bearer token's secret."""
    return "qm_" + secrets.token_urlsafe(32)


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("ey")


class TokenService:
    def __init__(
        self,
        engine: Engine,
        unit_of_work: Any,
        bootstrap_token: str | None = None,
        oidc: OidcConfig | None = None,
    ) -> None:
        self._engine = engine
        self._uow = unit_of_work
        self._bootstrap = bootstrap_token
        self._oidc = OidcVerifier(oidc) if oidc else None
        # token hash -> (principal, valid until): spares the database a
        # lookup per request. A revocation takes effect at once in this
        # process and within CACHE_SECONDS in the others (and ends their
        # event streams, which check their token as often).
        self._cache: dict[bytes, tuple[Principal, float]] = {}

    CACHE_SECONDS = 1.0
    #: A token's life when its issuer names none, and the longest it may have.
    DEFAULT_TTL = timedelta(days=90)
    MAX_TTL = timedelta(days=366)

    def cached(self, token: str) -> Principal | None:
        """The principal without I/O, when that needs none (the bootstrap
        token, or a recently seen bearer token); else None."""
        if self._bootstrap and hmac.compare_digest(token.encode(), self._bootstrap.encode()):
            return Principal("bootstrap", frozenset({Role.ADMIN}), frozenset({"*"}))
        hit = self._cache.get(hash_token(token))
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        return None

    def authenticate(self, token: str) -> Principal:
        known = self.cached(token)
        if known is not None:
            return known
        if self._oidc is not None and looks_like_jwt(token):
            return self._oidc.verify(token)
        with self._engine.connect() as conn:
            row = conn.execute(
                select(
                    api_tokens.c.name,
                    api_tokens.c.role,
                    api_tokens.c.namespaces,
                    api_tokens.c.expires_at,
                ).where(
                    api_tokens.c.token_hash == hash_token(token), api_tokens.c.revoked.is_(False)
                )
            ).first()
        now = datetime.now(UTC)
        if row is None:
            raise Unauthorized("unknown or revoked bearer token")
        if row.expires_at is not None and row.expires_at <= now:
            raise Unauthorized(f"the bearer token expired at {row.expires_at.isoformat()}")
        principal = Principal(
            f"token:{row.name}", frozenset({Role(row.role)}), frozenset(row.namespaces)
        )
        ttl = self.CACHE_SECONDS
        if row.expires_at is not None:
            ttl = min(ttl, (row.expires_at - now).total_seconds())
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[hash_token(token)] = (principal, time.monotonic() + ttl)
        return principal

    def issue(
        self,
        actor: str,
        name: str,
        role: Role,
        namespaces: Sequence[str],
        request_id: str | None,
        expires_in: timedelta | None = None,
        secret: str | None = None,
    ) -> IssuedToken:
        """A new token; its name is never reused (the audit trail names a
        token's holder by it), and it expires (``DEFAULT_TTL`` unless given).
        ``secret`` (``new_secret()``) when the caller must know it should the
        commit's answer be lost: only its hash is stored."""
        if role is Role.SUBMITTER and not namespaces:
            raise Invalid(
                "a submitter token needs namespaces", [("namespaces", "at least one namespace")]
            )
        life = expires_in if expires_in is not None else self.DEFAULT_TTL
        if not timedelta(0) < life <= self.MAX_TTL:
            raise Invalid(
                f"a token lives at most {self.MAX_TTL.days} days",
                [("expiresInSeconds", f"must be within 1 and {self.MAX_TTL.total_seconds():.0f}")],
            )
        now = datetime.now(UTC)
        issued = IssuedToken(
            uuid4(),
            name,
            role,
            list(namespaces),
            secret or new_secret(),
            now,
            now + life,
        )
        data = {
            "id": str(issued.id),
            "name": name,
            "role": role.value,
            "namespaces": list(namespaces),
            "token_hash": hash_token(issued.token).hex(),
            "created_at": now.isoformat(),
            "expires_at": issued.expires_at.isoformat(),
        }
        self._write(actor, request_id, issued.id, "TokenIssued", data, 0, unique_name=name)
        return issued

    def revoke(self, actor: str, token_id: UUID, request_id: str | None) -> None:
        with self._engine.connect() as conn:
            row = conn.execute(select(api_tokens).where(api_tokens.c.id == token_id)).first()
        if row is None:
            raise NotFound(f"token {token_id} not found")
        data = {
            "id": str(row.id),
            "name": row.name,
            "role": row.role,
            "namespaces": list(row.namespaces),
            "token_hash": bytes(row.token_hash).hex(),
            "created_at": row.created_at.isoformat(),
            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
            "revoked": True,
        }
        self._write(actor, request_id, token_id, "TokenRevoked", data, -1)
        self._cache = {k: v for k, v in self._cache.items() if k != bytes(row.token_hash)}

    def list(self) -> list[dict[str, Any]]:
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(
                    api_tokens.c.id,
                    api_tokens.c.name,
                    api_tokens.c.role,
                    api_tokens.c.namespaces,
                    api_tokens.c.created_at,
                    api_tokens.c.expires_at,
                    api_tokens.c.revoked,
                ).order_by(api_tokens.c.created_at)
            ).all()
        return [
            {
                "id": str(r.id),
                "name": r.name,
                "role": r.role,
                "namespaces": list(r.namespaces),
                "createdAt": r.created_at.isoformat(),
                "expiresAt": r.expires_at.isoformat() if r.expires_at else None,
                "revoked": r.revoked,
            }
            for r in rows
        ]

    def _write(
        self,
        actor: str,
        request_id: str | None,
        token_id: UUID,
        event_type: str,
        data: dict[str, Any],
        expected: int,
        unique_name: str | None = None,
    ) -> None:
        meta = EventMetadata(actor=actor, occurred_at=datetime.now(UTC), request_id=request_id)
        uow: SqlUnitOfWork
        with self._uow() as uow:
            if unique_name is not None:
                # Two issues of one name at once: the lock orders them, so
                # the second sees the first's row.
                conn = uow.connection
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                    {"key": f"qm-token-name:{unique_name}"},
                )
                taken = conn.execute(
                    select(api_tokens.c.id).where(api_tokens.c.name == unique_name).limit(1)
                ).first()
                if taken is not None:
                    raise AlreadyExists(
                        f"a token named {unique_name} was issued before: names are never reused",
                        [("name", "already used by another token")],
                    )
            uow.events.append(
                f"token-{token_id}", expected, [NewEvent(uuid4(), event_type, data, meta)]
            )
            upsert_tokens(uow.connection, [token_row(data)])
            uow.commit()
