"""Idempotency-Key records (Stripe's and the IETF draft's semantics).

The first request with a key claims it (a row with no response yet); the
same key and body later gets the stored response byte for byte; the same key
with another body is refused (422); the same key while the first request is
still in flight is refused (409). Keys are scoped per principal and kept for
``ttl`` seconds. Responses of 5xx are not kept, so that a retry can succeed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.dialects.postgresql import insert

from service.projections.schema import idempotency_keys


@dataclass(frozen=True)
class Claimed:
    """This request owns the key: run it, then ``finish``."""


@dataclass(frozen=True)
class Replay:
    status_code: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class Mismatch:
    """The key was used with another request."""


@dataclass(frozen=True)
class InFlight:
    """The first request with this key has not finished."""


Outcome = Claimed | Replay | Mismatch | InFlight

#: How long a claim without a response counts as in flight (longer than any
#: request takes, a bulk submission included).
IN_FLIGHT_LEASE = timedelta(seconds=60)


def request_hash(method: str, path: str, query: str, body: bytes) -> bytes:
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query.encode()):
        digest.update(len(part).to_bytes(4, "big") + part)
    digest.update(body)
    return digest.digest()


class IdempotencyStore:
    def __init__(self, engine: Engine, ttl_seconds: int) -> None:
        self._engine = engine
        self._ttl = timedelta(seconds=ttl_seconds)
        self._claims = 0

    def claim(self, principal: str, key: str, fingerprint: bytes) -> Outcome:
        now = datetime.now(UTC)
        with self._engine.begin() as conn:
            self._claims += 1
            if self._claims % 1000 == 0:
                conn.execute(
                    delete(idempotency_keys).where(idempotency_keys.c.created_at < now - self._ttl)
                )
            inserted = conn.execute(
                insert(idempotency_keys)
                .values(principal=principal, key=key, request_hash=fingerprint, created_at=now)
                .on_conflict_do_nothing()
                .returning(idempotency_keys.c.key)
            ).first()
            if inserted is not None:
                return Claimed()
            row = conn.execute(
                select(idempotency_keys)
                .where(idempotency_keys.c.principal == principal, idempotency_keys.c.key == key)
                .with_for_update()
            ).first()
            if row is None:  # deleted between the two statements: try once more
                return self.claim(principal, key, fingerprint)
            if row.created_at < now - self._ttl:
                conn.execute(
                    update(idempotency_keys)
                    .where(idempotency_keys.c.principal == principal, idempotency_keys.c.key == key)
                    .values(
                        request_hash=fingerprint,
                        created_at=now,
                        status_code=None,
                        headers=None,
                        body=None,
                    )
                )
                return Claimed()
            if bytes(row.request_hash) != fingerprint:
                return Mismatch()
            if row.status_code is None:
                if row.created_at >= now - IN_FLIGHT_LEASE:
                    return InFlight()
                # Its request never finished: the process died, or the database
                # went away before the response could be stored or the claim
                # released. Run it again rather than answer 409 for the whole ttl
                # (what it committed, if anything, answers the retry itself).
                conn.execute(
                    update(idempotency_keys)
                    .where(idempotency_keys.c.principal == principal, idempotency_keys.c.key == key)
                    .values(created_at=now)
                )
                return Claimed()
            headers: Any = row.headers or []
            return Replay(row.status_code, [(str(k), str(v)) for k, v in headers], bytes(row.body))

    def finish(
        self,
        principal: str,
        key: str,
        status_code: int,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        where = (idempotency_keys.c.principal == principal, idempotency_keys.c.key == key)
        with self._engine.begin() as conn:
            if status_code >= 500:
                conn.execute(delete(idempotency_keys).where(*where))
            else:
                conn.execute(
                    update(idempotency_keys)
                    .where(*where)
                    .values(status_code=status_code, headers=[list(h) for h in headers], body=body)
                )

    def release(self, principal: str, key: str) -> None:
        with self._engine.begin() as conn:
            conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.principal == principal, idempotency_keys.c.key == key
                )
            )
