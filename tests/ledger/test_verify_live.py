"""``verify --live`` on Postgres: the stored bytes are hashed as they are, the
columns are held to them by migration 0007's constraint, and every edit a
superuser can make — to the bytes, to the columns, with the constraint kept,
dropped or hidden — is found."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from service.app.uow import SqlUnitOfWork
from service.ledger import NewLedgerEntry
from service.ledger.chain import LedgerEntry, entry_bytes, seal
from service.ledger.checkpoint import NoteSigner
from service.ledger.postgres import PostgresLedgerReader
from service.ledger.proofs import LedgerTree
from service.ledger.schema import ENTRY_MATCHES_CALL, ENTRY_MATCHES_CONSTRAINT
from service.ledger.verify import VerifyReport, verify_ledger
from tests.ledger.tampering import Guard, replace_function, superuser, tamper

__all__ = ["superuser"]  # a fixture

T0 = datetime(2026, 11, 29, tzinfo=UTC)
ORIGIN = "qm.test/ledger"
N = 9
OLDER = 4
FLIP = (
    "UPDATE ledger_entries SET entry_bytes = set_byte(entry_bytes, {position}, "
    "get_byte(entry_bytes, {position}) # {mask}) WHERE seq = {seq}"
)


@pytest.fixture(scope="module")
def signer() -> NoteSigner:
    return NoteSigner.generate(ORIGIN)[0]


def item(i: int, tag: str = "") -> NewLedgerEntry:
    body = {
        "workload": f"w{i}{tag}",
        "gpus": 8 * i,
        "gpu_seconds": 1234.5 + i / 8,
        "note": 'é ü \u2028 "quoted" \\ back',
        "flavors": {"nvidia.com/gpu": "h100"},
    }
    return NewLedgerEntry(
        uuid.UUID(int=i + 1), "workload.admitted", body, T0 + timedelta(minutes=i)
    )


def record(engine: sa.Engine, items: Sequence[NewLedgerEntry]) -> None:
    with SqlUnitOfWork(engine) as uow:
        uow.record(items)
        uow.commit()


def rewrite_history(engine: sa.Engine, items: Sequence[NewLedgerEntry]) -> None:
    """Everything rewritten and sealed again through the writer: every row
    describes itself, every hash and link is right — only roots can tell."""
    tamper(
        engine,
        "DELETE FROM ledger_entries",
        "UPDATE ledger_head SET seq = 0, entry_hash = decode(repeat('00', 32), 'hex')",
    )
    record(engine, items)


def unsealed(entries: Sequence[LedgerEntry]) -> list[NewLedgerEntry]:
    return [NewLedgerEntry(e.entry_id, e.kind, dict(e.body), e.recorded_at) for e in entries]


def notes(engine: sa.Engine, signer: NoteSigner, *sizes: int) -> list[str]:
    tree = LedgerTree(ORIGIN)
    tree.catch_up(PostgresLedgerReader(engine))
    return [tree.signed_checkpoint(signer, size) for size in sizes]


def verify(
    engine: sa.Engine, signer: NoteSigner, note: str, older: Sequence[str], strict: bool = False
) -> VerifyReport:
    return PostgresLedgerReader(engine).verify_live(note, signer.verifier(), older, strict=strict)


@pytest.fixture
def published(superuser: sa.Engine, signer: NoteSigner) -> tuple[sa.Engine, str, str]:
    record(superuser, [item(i) for i in range(N)])
    note, older = notes(superuser, signer, N, OLDER)
    return superuser, note, older


def test_the_stored_bytes_are_what_was_hashed(
    published: tuple[sa.Engine, str, str], signer: NoteSigner
) -> None:
    engine, note, older = published
    reader = PostgresLedgerReader(engine)
    entries = list(reader.entries())
    rows = list(reader.stored())
    assert [row[0] for row in rows] == list(range(1, N + 1))
    assert [row[3] for row in rows] == [entry_bytes(e) for e in entries]
    assert [row[1:3] for row in rows] == [(e.prev_hash, e.entry_hash) for e in entries]
    assert list(reader.stored(after_seq=N - 2)) == rows[-2:]
    assert reader.entry_bytes_guard() is None
    report = verify(engine, signer, note, [older])
    assert report.ok, report.problems
    assert report.entries == N and report.older_checked == 1
    slow = verify_ledger(reader.records(), note, signer.verifier(), [older])
    assert (report.root_hash, report.head_hash) == (slow.root_hash, slow.head_hash)


def test_the_empty_ledger_verifies(superuser: sa.Engine, signer: NoteSigner) -> None:
    assert verify(superuser, signer, notes(superuser, signer, 0)[0], []).ok


@pytest.mark.parametrize("seq", [1, 5, N])
def test_a_flipped_byte_of_the_stored_bytes_is_found(
    published: tuple[sa.Engine, str, str], signer: NoteSigner, seq: int
) -> None:
    """The constraint refuses such an edit (the bytes would no longer describe
    the columns); an attacker drops it and hides that by adding it back NOT
    VALID. The missing guard is reported, and the entry named."""
    engine, note, older = published
    length = len(next(PostgresLedgerReader(engine).stored(after_seq=seq - 1))[3])
    with pytest.raises(sa.exc.IntegrityError, match=ENTRY_MATCHES_CONSTRAINT):
        tamper(engine, FLIP.format(position=length // 2, mask=1, seq=seq))
    for position in (0, 1, length // 3, length // 2, length - 2, length - 1):
        for mask in (1, 32):
            flip = FLIP.format(position=position, mask=mask, seq=seq)
            tamper(engine, flip, guard="hide")
            report = verify(engine, signer, note, [older])
            assert not report.ok
            assert any("not validated" in p.reason for p in report.problems)
            assert any(p.seq == seq for p in report.problems), (position, mask)
            tamper(engine, flip, guard="drop")  # flipped back: honest again
            tamper(engine, f"ALTER TABLE ledger_entries ADD CONSTRAINT "
                   f"{ENTRY_MATCHES_CONSTRAINT} CHECK ({ENTRY_MATCHES_CALL})")  # fmt: skip
            assert verify(engine, signer, note, [older]).ok


@pytest.mark.parametrize("guard", ["drop", "hide"])
@pytest.mark.parametrize("seq", [1, 5, N])
def test_a_column_changed_behind_the_bytes_is_found(
    published: tuple[sa.Engine, str, str], signer: NoteSigner, seq: int, guard: Guard
) -> None:
    engine, note, older = published
    change = (
        f"UPDATE ledger_entries SET body = jsonb_set(body, '{{gpus}}', '999') WHERE seq = {seq}"
    )
    with pytest.raises(sa.exc.IntegrityError, match=ENTRY_MATCHES_CONSTRAINT):
        tamper(engine, change)
    tamper(engine, change, guard=guard)
    report = verify(engine, signer, note, [older])
    assert not report.ok
    assert (seq, "entry hash does not match its content") in [
        (p.seq, p.reason) for p in report.problems
    ]
    assert not PostgresLedgerReader(engine).verify().ok


@pytest.mark.parametrize("seq", [1, 5, N])
def test_bytes_and_columns_rewritten_together_are_found(
    published: tuple[sa.Engine, str, str], signer: NoteSigner, seq: int
) -> None:
    """The constraint holds — the row describes itself — but not its hash."""
    engine, note, older = published
    original = next(PostgresLedgerReader(engine).entries(after_seq=seq - 1))
    item = NewLedgerEntry(
        original.entry_id, original.kind, {**original.body, "gpus": 999}, original.recorded_at
    )
    forged = seal(seq, item, original.prev_hash)
    body = json.dumps(forged.body).replace("'", "''")
    tamper(
        engine,
        f"UPDATE ledger_entries SET body = '{body}', "
        f"entry_bytes = '\\x{entry_bytes(forged).hex()}' WHERE seq = {seq}",
    )
    assert PostgresLedgerReader(engine).entry_bytes_guard() is None
    report = verify(engine, signer, note, [older])
    assert (seq, "entry hash does not match its content") == (
        report.problems[0].seq,
        report.problems[0].reason,
    )


@pytest.mark.parametrize("seq", [1, 5, N])
def test_a_deleted_row_is_found(
    published: tuple[sa.Engine, str, str], signer: NoteSigner, seq: int
) -> None:
    engine, note, older = published
    tamper(engine, f"DELETE FROM ledger_entries WHERE seq = {seq}")
    assert PostgresLedgerReader(engine).entry_bytes_guard() is None
    assert not verify(engine, signer, note, [older]).ok


def test_reordered_rows_are_found(
    published: tuple[sa.Engine, str, str], signer: NoteSigner
) -> None:
    engine, note, older = published
    entries = list(PostgresLedgerReader(engine).entries())
    swap = (
        "UPDATE ledger_entries SET seq = CASE seq WHEN 3 THEN -4 WHEN 4 THEN -3 END "
        "WHERE seq IN (3, 4)",
        "UPDATE ledger_entries SET seq = -seq WHERE seq < 0",
    )
    with pytest.raises(sa.exc.IntegrityError, match=ENTRY_MATCHES_CONSTRAINT):
        tamper(engine, *swap)
    tamper(engine, *swap, guard="hide")
    assert not verify(engine, signer, note, [older]).ok
    items = unsealed(entries)
    items[3], items[4] = items[4], items[3]
    rewrite_history(engine, items)
    tamper(engine, f"ALTER TABLE ledger_entries VALIDATE CONSTRAINT {ENTRY_MATCHES_CONSTRAINT}")
    assert PostgresLedgerReader(engine).entry_bytes_guard() is None
    report = verify(engine, signer, note, [older])
    assert not report.ok and all("Merkle root" in p.reason for p in report.problems)


@pytest.mark.parametrize("position", [0, 4, N - 1])
def test_an_inserted_row_is_found(
    published: tuple[sa.Engine, str, str], signer: NoteSigner, position: int
) -> None:
    engine, note, older = published
    items = unsealed(PostgresLedgerReader(engine).entries())
    items.insert(position, NewLedgerEntry(uuid.uuid4(), "quota.changed", {"forged": 1}, T0))
    rewrite_history(engine, items)
    assert not verify(engine, signer, note, [older]).ok


def test_an_appended_row_is_unsigned_until_a_checkpoint_covers_it(
    published: tuple[sa.Engine, str, str], signer: NoteSigner
) -> None:
    engine, note, older = published
    record(engine, [item(N)])
    lenient = verify(engine, signer, note, [older])
    assert lenient.ok and lenient.unsigned_tail == 1
    assert not verify(engine, signer, note, [older], strict=True).ok


@pytest.mark.parametrize("fork_at", [1, OLDER, OLDER + 1, N])
def test_a_fork_signed_after_a_published_checkpoint_is_found(
    published: tuple[sa.Engine, str, str], signer: NoteSigner, fork_at: int
) -> None:
    engine, note, older = published
    items = unsealed(PostgresLedgerReader(engine).entries())[: fork_at - 1]
    items += [item(i, tag="-fork") for i in range(fork_at - 1, N + 3)]
    rewrite_history(engine, items)
    (forked_note,) = notes(engine, signer, N + 2)
    assert verify(engine, signer, forked_note, []).ok, "well-formed by itself"
    report = verify(engine, signer, forked_note, [older, note])
    assert not report.ok
    assert len(report.problems) == (2 if fork_at <= OLDER else 1)


@pytest.mark.parametrize(
    "change",
    [
        f"ALTER TABLE ledger_entries DROP CONSTRAINT {ENTRY_MATCHES_CONSTRAINT}",
        f"ALTER TABLE ledger_entries DROP CONSTRAINT {ENTRY_MATCHES_CONSTRAINT}; "
        f"ALTER TABLE ledger_entries ADD CONSTRAINT {ENTRY_MATCHES_CONSTRAINT} "
        "CHECK (length(entry_bytes) > 0)",
        f"ALTER TABLE ledger_entries DROP CONSTRAINT {ENTRY_MATCHES_CONSTRAINT}; "
        f"ALTER TABLE ledger_entries ADD CONSTRAINT {ENTRY_MATCHES_CONSTRAINT} "
        f"CHECK ({ENTRY_MATCHES_CALL}) NOT VALID",
        "function",
    ],
)
def test_without_its_guard_the_live_ledger_does_not_verify(
    published: tuple[sa.Engine, str, str], signer: NoteSigner, change: str
) -> None:
    """Even with every row intact: the fast path's premise is gone, so the
    columns are verified the slow way and the missing guard is a failure."""
    engine, note, older = published
    if change == "function":
        replace_function(engine, "\nBEGIN\n    RETURN true;\nEND\n")
    else:
        tamper(engine, change)
    problem = PostgresLedgerReader(engine).entry_bytes_guard()
    assert problem is not None
    report = verify(engine, signer, note, [older])
    assert [str(p) for p in report.problems] == [problem]
