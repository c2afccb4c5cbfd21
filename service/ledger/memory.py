"""In-memory ledger: the fake for unit tests and the simulator."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from uuid import UUID

from service.ledger.chain import (
    GENESIS_HASH,
    LedgerEntry,
    NewLedgerEntry,
    Verification,
    entry_bytes,
    seal,
    verify_chain,
)
from service.ledger.export import ExportRecord, records_of
from service.ledger.verify import StoredRow


class InMemoryLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[LedgerEntry] = []
        self._by_id: dict[UUID, LedgerEntry] = {}

    def append(self, entries: Sequence[NewLedgerEntry]) -> list[LedgerEntry]:
        with self._lock:
            return [self._append_one(item) for item in entries]

    def _append_one(self, item: NewLedgerEntry) -> LedgerEntry:
        known = self._by_id.get(item.entry_id)
        if known is not None:
            return known
        seq, tip = self._tip()
        entry = seal(seq + 1, item, tip)
        self.entries.append(entry)
        self._by_id[entry.entry_id] = entry
        return entry

    def _tip(self) -> tuple[int, bytes]:
        return (len(self.entries), self.entries[-1].entry_hash if self.entries else GENESIS_HASH)

    def head(self) -> tuple[int, bytes]:
        with self._lock:
            return self._tip()

    def records(self, after_seq: int = 0, batch: int = 5000) -> Iterator[ExportRecord]:
        """As :meth:`PostgresLedgerReader.records`."""
        with self._lock:
            entries = self.entries[after_seq:]
        return records_of(entries)

    def stored(self, after_seq: int = 0) -> Iterator[StoredRow]:
        """As :meth:`PostgresLedgerReader.stored`: a source for ``LedgerTree.catch_up``."""
        with self._lock:
            entries = self.entries[after_seq:]
        for entry in entries:
            yield entry.seq, entry.prev_hash, entry.entry_hash, entry_bytes(entry)

    def verify(self) -> Verification:
        with self._lock:
            entries, head = list(self.entries), self._tip()
        return verify_chain(entries, head=head)
