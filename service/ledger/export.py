"""The NDJSON export of the ledger: one entry per line, verifiable offline.

A line is the RFC 8785 serialisation of ``{"entry": …, "entry_hash": …}``:
``entry`` is exactly what the hash covers (``v``, ``seq``, ``entry_id``,
``kind``, ``recorded_at``, ``body``, ``prev_hash``), ``entry_hash`` its
SHA-256 in lower-case hex. Because ``"entry"`` sorts first, the bytes of
``entry`` — the Merkle leaf — stand verbatim in the line between a fixed
prefix and a fixed-length suffix: a verifier hashes them as they are and
parses exactly what it hashed, with no second serialisation. A line in any
other layout (re-indented, keys reordered) is parsed and canonicalised.
Lines are written one at a time from an iterator, so an export of any length
streams in constant memory.

A whole export (not a filtered one) opens with the latest signed checkpoint,
``{"checkpoint": NOTE}``, read before the entries, so that its tree size is at
most the number of entries that follow: the file alone then carries what an
offline verifier checks the entries against, given the verifier key. Readers
skip that first line; anywhere else it is not an entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from service.ledger.canonical import canonical_json
from service.ledger.chain import LedgerEntry, NewLedgerEntry, entry_document

_PREFIX = b'{"entry":'
_SUFFIX_START = b',"entry_hash":"'
_SUFFIX_LENGTH = len(_SUFFIX_START) + 64 + len(b'"}')
_CHECKPOINT_PREFIX = b'{"checkpoint":'


@dataclass(frozen=True, slots=True)
class ExportRecord:
    """One entry as a verifier sees it: the hashed document, the hash it
    claims, and the document's bytes when they were read verbatim."""

    document: Mapping[str, Any]
    entry_hash: str
    data: bytes | None = None


class ExportFormatError(ValueError):
    pass


def record_of(entry: LedgerEntry) -> ExportRecord:
    item = NewLedgerEntry(entry.entry_id, entry.kind, entry.body, entry.recorded_at)
    return ExportRecord(entry_document(entry.seq, item, entry.prev_hash), entry.entry_hash.hex())


def export_line(entry: LedgerEntry | ExportRecord) -> bytes:
    """``{"entry":<RFC 8785 bytes>,"entry_hash":"<hex>"}`` and a newline: the
    RFC 8785 form of that object, as the inner document is already canonical."""
    record = entry if isinstance(entry, ExportRecord) else record_of(entry)
    data = canonical_json(record.document)
    return b"".join((_PREFIX, data, _SUFFIX_START, record.entry_hash.encode(), b'"}\n'))


def export_ndjson(
    entries: Iterable[LedgerEntry | ExportRecord], checkpoint: str | None = None
) -> Iterator[bytes]:
    """Lines of an export, from entries or from a reader's ``records()``,
    after the signed ``checkpoint`` note when there is one."""
    if checkpoint is not None:
        yield canonical_json({"checkpoint": checkpoint}) + b"\n"
    for entry in entries:
        yield export_line(entry)


def checkpoint_of(line: bytes | str) -> str | None:
    """The signed note of an export's checkpoint line; None for any other line."""
    raw = line.encode() if isinstance(line, str) else line
    if not raw.lstrip().startswith(_CHECKPOINT_PREFIX):
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    if (
        type(found) is dict
        and set(found) == {"checkpoint"}
        and isinstance(found["checkpoint"], str)
    ):
        return found["checkpoint"]
    return None


def entry_lines(lines: Iterable[bytes | str]) -> Iterator[bytes | str]:
    """The lines of an export that hold entries: not blank, and not the
    checkpoint line that may open it."""
    first = True
    for line in lines:
        if not line.strip():
            continue
        if first and checkpoint_of(line) is not None:
            first = False
            continue
        first = False
        yield line


def entry_of(record: ExportRecord) -> LedgerEntry:
    """The ledger entry an export line describes (for reading an export back
    as entries, e.g. to account from it; verification works on records)."""
    document = record.document
    try:
        return LedgerEntry(
            int(document["seq"]),
            UUID(document["entry_id"]),
            str(document["kind"]),
            datetime.fromisoformat(document["recorded_at"]),
            document["body"],
            bytes.fromhex(document["prev_hash"]),
            bytes.fromhex(record.entry_hash),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportFormatError(f"not a ledger entry: {exc}") from exc


def records_of(entries: Iterable[LedgerEntry]) -> Iterator[ExportRecord]:
    for entry in entries:
        yield record_of(entry)


def verbatim_parts(line: bytes | str) -> tuple[bytes, str] | None:
    """The entry's bytes and the stated hash of a line in the layout that
    :func:`export_line` writes, unparsed; None for any other layout."""
    raw = line.encode() if isinstance(line, str) else line
    raw = raw.rstrip(b"\r\n")
    if raw.startswith(_PREFIX) and raw[-_SUFFIX_LENGTH:].startswith(_SUFFIX_START):
        stated = raw[-_SUFFIX_LENGTH + len(_SUFFIX_START) : -2]
        if raw.endswith(b'"}') and stated.isascii():
            return raw[len(_PREFIX) : -_SUFFIX_LENGTH], stated.decode()
    return None


def parse_line(line: bytes | str) -> ExportRecord:
    parts = verbatim_parts(line)
    if parts is not None:
        data, stated = parts
        try:
            document = json.loads(data)
        except ValueError:
            pass  # not this layout after all: parse the line as a whole
        else:
            if type(document) is dict:
                return ExportRecord(document, stated, data)
    raw = line.encode() if isinstance(line, str) else line
    return _parse_general(raw.rstrip(b"\r\n"))


def _parse_general(raw: bytes) -> ExportRecord:
    try:
        line = json.loads(raw)
    except ValueError as exc:
        raise ExportFormatError(f"not JSON: {exc}") from exc
    if type(line) is not dict or set(line) != {"entry", "entry_hash"}:
        raise ExportFormatError('a line is one object {"entry": …, "entry_hash": …}')
    document, stated = line["entry"], line["entry_hash"]
    if type(document) is not dict or not isinstance(stated, str):
        raise ExportFormatError("entry is an object and entry_hash a string")
    return ExportRecord(document, stated)


def read_ndjson(lines: Iterable[bytes | str]) -> Iterator[ExportRecord | ExportFormatError]:
    """Records of an export, or the error of each line that is not one
    (yielded in place, so that the verifier can report its position)."""
    for line in entry_lines(lines):
        try:
            yield parse_line(line)
        except ExportFormatError as exc:
            yield exc


CSV_COLUMNS: tuple[str, ...] = (
    "seq",
    "recorded_at",
    "kind",
    "namespace",
    "workload",
    "local_queue",
    "cluster_queue",
    "cluster",
    "actor",
    "flavors",
    "body",
    "entry_id",
    "prev_hash",
    "entry_hash",
)


def export_csv(entries: Iterable[LedgerEntry | ExportRecord]) -> Iterator[str]:
    """CSV for spreadsheets (RFC 4180, a header first): the filterable fields
    in columns, ``flavors`` the flavors reserved, released or consumed, and
    the whole ``body`` as RFC 8785 JSON. Streams row by row; verify from the
    NDJSON export, which carries exactly the hashed bytes."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")

    def flush() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writerow(CSV_COLUMNS)
    yield flush()
    for entry in entries:
        record = entry if isinstance(entry, ExportRecord) else record_of(entry)
        document = record.document
        body: Mapping[str, Any] = document["body"]
        flavors = sorted(
            {
                flavor
                for key in ("reserved", "released", "consumed")
                if isinstance(body.get(key), dict)
                for flavor in body[key]
            }
        )
        writer.writerow(
            [
                document["seq"],
                document["recorded_at"],
                document["kind"],
                *(_text(body.get(name)) for name in CSV_COLUMNS[3:9]),
                ";".join(flavors),
                canonical_json(body).decode(),
                document["entry_id"],
                document["prev_hash"],
                record.entry_hash,
            ]
        )
        yield flush()


def _text(value: Any) -> str:
    return "" if value is None else str(value)
