"""The NDJSON export of the ledger: one entry per line, verifiable offline.

A line is the RFC 8785 serialisation of exactly what the entry's hash covers
(``v``, ``seq``, ``entry_id``, ``kind``, ``recorded_at``, ``body``,
``prev_hash``) plus ``entry_hash``, both hashes in lower-case hex. Removing
``entry_hash`` and serialising the rest again gives the Merkle leaf; its
SHA-256 is ``entry_hash``. Lines are written one at a time from an iterator,
so an export of any length streams in constant memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from service.ledger.canonical import canonical_json
from service.ledger.chain import LedgerEntry, NewLedgerEntry, entry_document


@dataclass(frozen=True, slots=True)
class ExportRecord:
    """One entry as a verifier sees it: the hashed document and the hash it claims."""

    document: Mapping[str, Any]
    entry_hash: str


class ExportFormatError(ValueError):
    pass


def record_of(entry: LedgerEntry) -> ExportRecord:
    item = NewLedgerEntry(entry.entry_id, entry.kind, entry.body, entry.recorded_at)
    return ExportRecord(entry_document(entry.seq, item, entry.prev_hash), entry.entry_hash.hex())


def export_line(entry: LedgerEntry) -> bytes:
    record = record_of(entry)
    return canonical_json({**record.document, "entry_hash": record.entry_hash}) + b"\n"


def export_ndjson(entries: Iterable[LedgerEntry]) -> Iterator[bytes]:
    for entry in entries:
        yield export_line(entry)


def records_of(entries: Iterable[LedgerEntry]) -> Iterator[ExportRecord]:
    for entry in entries:
        yield record_of(entry)


def parse_line(line: bytes | str) -> ExportRecord:
    try:
        document = json.loads(line)
    except ValueError as exc:
        raise ExportFormatError(f"not JSON: {exc}") from exc
    if type(document) is not dict:
        raise ExportFormatError("a line is one JSON object")
    stated = document.pop("entry_hash", None)
    if not isinstance(stated, str):
        raise ExportFormatError("the line has no entry_hash")
    return ExportRecord(document, stated)


def read_ndjson(lines: Iterable[bytes | str]) -> Iterator[ExportRecord | ExportFormatError]:
    """Records of an export, or the error of each line that is not one
    (yielded in place, so that the verifier can report its position)."""
    for line in lines:
        if not line.strip():
            continue
        try:
            yield parse_line(line)
        except ExportFormatError as exc:
            yield exc
