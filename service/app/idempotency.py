"""Idempotency-Key records (Stripe's and the IETF draft's semantics).

The first request with a key claims it (a row with no response yet); the
same key and body later gets the stored response byte for byte; the same key
with another body is refused (422); the same key while the first request is
still in flight is refused (409). Keys are scoped per principal and kept for
``ttl`` seconds. Responses of 5xx are not kept, so that a retry can succeed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, select, update
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


@dataclass(frozen=True)
class Response:
    """A response to keep for its key."""

    principal: str
    key: str
    status_code: int
    headers: list[tuple[str, str]]
    body: bytes


#: How long a claim without a response counts as in flight (longer than any
#: request takes, a bulk submission included).
IN_FLIGHT_LEASE = timedelta(seconds=60)


def request_hash(method: str, path: str, query: str, body: bytes) -> bytes:
    digest = request_digest(method, path, query)
    digest.update(body)
    return digest.digest()


def request_digest(method: str, path: str, query: str) -> hashlib._Hash:
    """The request's hash before its body, which is added as it is read."""
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query.encode()):
        digest.update(len(part).to_bytes(4, "big") + part)
    return digest


class IdempotencyStore:
    def __init__(self, engine: Engine, ttl_seconds: int) -> None:
        self._engine = engine
        self._ttl = timedelta(seconds=ttl_seconds)
        self._claims = 0

    def claim(self, principal: str, key: str, fingerprint: bytes) -> Outcome:
        return self.claim_many([(principal, key, fingerprint)])[0]

    def claim_many(self, claims: Sequence[tuple[str, str, bytes]]) -> list[Outcome]:
        """Claim ``(principal, key, fingerprint)``s in one transaction (one
        WAL flush, one thread hop for the requests that arrived together);
        each answered as if claimed alone, in order: a key twice in the batch
        is claimed by its first request and met by the second."""
        now = datetime.now(UTC)
        with self._engine.begin() as conn:
            before, self._claims = self._claims, self._claims + len(claims)
            if before // 1000 != self._claims // 1000:
                conn.execute(
                    delete(idempotency_keys).where(idempotency_keys.c.created_at < now - self._ttl)
                )
            fresh = {
                (str(principal), str(key))
                for principal, key in conn.execute(
                    insert(idempotency_keys)
                    .values(
                        [
                            {"principal": p, "key": k, "request_hash": f, "created_at": now}
                            for p, k, f in claims
                        ]
                    )
                    .on_conflict_do_nothing()
                    .returning(idempotency_keys.c.principal, idempotency_keys.c.key)
                )
            }
            outcomes: list[Outcome] = []
            for principal, key, fingerprint in claims:
                if (principal, key) in fresh:
                    fresh.discard((principal, key))  # a second request with it meets it
                    outcomes.append(Claimed())
                else:
                    outcomes.append(self._claim_taken(conn, principal, key, fingerprint, now))
            return outcomes

    def _claim_taken(
        self, conn: Connection, principal: str, key: str, fingerprint: bytes, now: datetime
    ) -> Outcome:
        """The answer for a key that has a row already."""
        where = (idempotency_keys.c.principal == principal, idempotency_keys.c.key == key)
        row = conn.execute(select(idempotency_keys).where(*where).with_for_update()).first()
        if row is None:  # deleted since the insert: claim it now
            inserted = conn.execute(
                insert(idempotency_keys)
                .values(principal=principal, key=key, request_hash=fingerprint, created_at=now)
                .on_conflict_do_nothing()
                .returning(idempotency_keys.c.key)
            ).first()
            if inserted is not None:
                return Claimed()
            return self._claim_taken(conn, principal, key, fingerprint, now)
        if row.created_at < now - self._ttl:
            conn.execute(
                update(idempotency_keys)
                .where(*where)
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
            conn.execute(update(idempotency_keys).where(*where).values(created_at=now))
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
        self.finish_many([Response(principal, key, status_code, headers, body)])

    def finish_many(self, responses: Sequence[Response]) -> list[None]:
        """Store responses (a 5xx releases its key instead) in one transaction."""
        with self._engine.begin() as conn:
            for r in responses:
                where = (
                    idempotency_keys.c.principal == r.principal,
                    idempotency_keys.c.key == r.key,
                )
                if r.status_code >= 500:
                    conn.execute(delete(idempotency_keys).where(*where))
                else:
                    conn.execute(
                        update(idempotency_keys)
                        .where(*where)
                        .values(
                            status_code=r.status_code,
                            headers=[list(h) for h in r.headers],
                            body=r.body,
                        )
                    )
        return [None] * len(responses)

    def release(self, principal: str, key: str) -> None:
        with self._engine.begin() as conn:
            conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.principal == principal, idempotency_keys.c.key == key
                )
            )
