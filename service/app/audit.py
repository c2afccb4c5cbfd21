"""Auditors' questions: entries, exports, checkpoints, proofs, usage.

Read-only over the ledger tables; the Merkle tree is kept per process and
caught up incrementally from the stored entries before each proof.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Engine

from service.app.auth import Principal, Role, require
from service.app.errors import AppError, Invalid, NotFound
from service.ledger.accounting import UsageRollup
from service.ledger.chain import LedgerEntry
from service.ledger.checkpoint import DEFAULT_ORIGIN, CheckpointError, NoteSigner
from service.ledger.export import export_csv, export_ndjson
from service.ledger.postgres import PostgresCheckpointStore, PostgresLedgerReader
from service.ledger.proofs import LedgerTree, publish_checkpoint
from service.ledger.query import LedgerQuery

AUDITORS = frozenset({Role.AUDITOR, Role.ADMIN})
PUBLISHERS = frozenset({Role.ADMIN})
GROUPS = ("namespace", "local_queue", "cluster_queue", "cluster", "flavor")


class NotConfigured(AppError):
    status, kind, title = 503, "not-configured", "Not configured"


class ForkRefused(AppError):
    status, kind, title = 409, "ledger-fork", "The ledger does not extend its checkpoints"


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def entry_json(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "id": str(entry.entry_id),
        "kind": entry.kind,
        "recordedAt": entry.recorded_at.isoformat(),
        "body": dict(entry.body),
        "prevHash": entry.prev_hash.hex(),
        "hash": entry.entry_hash.hex(),
    }


class AuditService:
    def __init__(self, engine: Engine, signing_key: str | None) -> None:
        self._reader = PostgresLedgerReader(engine)
        self._checkpoints = PostgresCheckpointStore(engine)
        self._signing_key = signing_key
        self._tree = LedgerTree(DEFAULT_ORIGIN)
        self._lock = threading.Lock()

    def _catch_up(self) -> int:
        """The tree as the ledger is now. A ledger the tree does not extend
        (rewritten, or emptied as tests do) is read again from the start:
        proofs describe the stored ledger, and ``publish`` still refuses to
        sign anything that does not extend the published checkpoints."""
        try:
            return self._tree.catch_up(self._reader)
        except ValueError:
            self._tree = LedgerTree(DEFAULT_ORIGIN)
        try:
            return self._tree.catch_up(self._reader)
        except ValueError as error:
            raise ForkRefused(f"the stored ledger does not verify: {error}") from error

    def entries(self, principal: Principal, query: LedgerQuery) -> dict[str, Any]:
        require(principal, AUDITORS)
        found = self._reader.query(query)
        items = [entry_json(e) for e in found]
        body: dict[str, Any] = {"items": items}
        if len(found) == query.limit:
            body["next"] = found[-1].seq
        return body

    def export(
        self, principal: Principal, fmt: Literal["ndjson", "csv"], query: LedgerQuery | None
    ) -> Iterator[bytes]:
        """A stream that never holds the whole result: the reader pages
        through the table, the writer turns each entry into its line."""
        require(principal, AUDITORS)
        entries: Iterator[Any] = self._reader.records() if query is None else self._paged(query)
        if fmt == "ndjson":  # a whole export opens with its checkpoint (see export.py)
            latest = self._checkpoints.latest() if query is None else None
            return export_ndjson(entries, latest[1] if latest else None)
        return (line.encode() for line in export_csv(entries))

    def _paged(self, query: LedgerQuery) -> Iterator[LedgerEntry]:
        after = query.after_seq
        while True:
            page = self._reader.query(_replace(query, after_seq=after, limit=1000))
            yield from page
            if len(page) < 1000:
                return
            after = page[-1].seq

    def latest_checkpoint(self, principal: Principal) -> str:
        require(principal, AUDITORS)
        latest = self._checkpoints.latest()
        if latest is None:
            raise NotFound("no checkpoint has been published yet")
        return latest[1]

    def checkpoints(
        self, principal: Principal, after_size: int = -1, limit: int = 100
    ) -> list[str]:
        """Published signed notes in order of tree size, after ``after_size``."""
        require(principal, AUDITORS)
        return self._checkpoints.notes(after_size, limit)

    def verifier_key(self, principal: Principal) -> str | None:
        """The verifier key (``name+id+key``) of the key this service signs
        with, for an auditor to compare with the one they keep; None without one."""
        require(principal, AUDITORS)
        try:
            return NoteSigner.from_seed(DEFAULT_ORIGIN, self._signing_key or "").verifier_key
        except CheckpointError:
            return None

    def publish(self, principal: Principal) -> str:
        """Sign a checkpoint of the whole ledger now (also done periodically)."""
        require(principal, PUBLISHERS)
        if not self._signing_key:
            raise NotConfigured("QM_LEDGER_SIGNING_KEY is not set; nothing can be signed")
        try:
            signer = NoteSigner.from_seed(DEFAULT_ORIGIN, self._signing_key)
        except CheckpointError as error:
            raise NotConfigured(f"QM_LEDGER_SIGNING_KEY is unusable: {error}") from error
        with self._lock:
            try:
                self._catch_up()
                return publish_checkpoint(self._tree, self._reader, signer, self._checkpoints)
            except CheckpointError as error:
                raise ForkRefused(str(error)) from error

    def inclusion(self, principal: Principal, seq: int, size: int | None) -> dict[str, Any]:
        require(principal, AUDITORS)
        with self._lock:
            current = self._catch_up()
            tree_size = size or current
            if not 1 <= seq <= tree_size <= current:
                raise Invalid(
                    f"need 1 <= seq <= size <= {current}",
                    [("seq", f"{seq}"), ("size", f"{tree_size}")],
                )
            proof = self._tree.inclusion_proof(seq, tree_size)
            root = self._tree.checkpoint(tree_size).root_hash
        return {
            "seq": proof.seq,
            "treeSize": proof.tree_size,
            "rootHash": _b64(root),
            "hashes": [_b64(h) for h in proof.hashes],
        }

    def consistency(self, principal: Principal, old: int, new: int | None) -> dict[str, Any]:
        require(principal, AUDITORS)
        with self._lock:
            current = self._catch_up()
            new_size = new or current
            if not 1 <= old <= new_size <= current:
                raise Invalid(
                    f"need 1 <= from <= to <= {current}",
                    [("from", f"{old}"), ("to", f"{new_size}")],
                )
            proof = self._tree.consistency_proof(old, new_size)
            old_root = self._tree.checkpoint(old).root_hash
            new_root = self._tree.checkpoint(new_size).root_hash
        return {
            "oldSize": proof.old_size,
            "newSize": proof.new_size,
            "oldRootHash": _b64(old_root),
            "newRootHash": _b64(new_root),
            "hashes": [_b64(h) for h in proof.hashes],
        }

    def usage(
        self,
        principal: Principal,
        granularity: Literal["hour", "day", "month"],
        by: Sequence[str],
        as_of: datetime | None,
    ) -> list[dict[str, Any]]:
        """Resource-hours per period and group, computed from the ledger alone:
        ``hours`` (also ``held``) what the admissions held, ``ran`` what their
        pods ran by the members' timestamps (docs/billing.md)."""
        require(principal, AUDITORS)
        unknown = [g for g in by if g not in GROUPS]
        if unknown:
            raise Invalid(
                "unknown grouping", [("by", f"{g} is not one of {GROUPS}") for g in unknown]
            )
        rollup = UsageRollup()
        rollup.apply_all(self._reader.entries())
        return [
            {
                "period": row.period.isoformat(),
                **dict(row.group),
                "resource": row.resource,
                "hours": row.hours,
                "held": row.held,
                "ran": row.ran,
            }
            for row in rollup.report(granularity, by or ("namespace",), as_of)
        ]


def _replace(query: LedgerQuery, **changes: Any) -> LedgerQuery:
    from dataclasses import replace

    return replace(query, **changes)
