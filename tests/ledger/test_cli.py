"""``quartermaster ledger …`` end to end: keygen, export and checkpoint from
a live Postgres ledger, then offline verification of files alone."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from service.app.uow import SqlUnitOfWork
from service.config import get_settings
from service.ledger import NewLedgerEntry
from service.ledger.cli import app
from tests.ledger.tampering import superuser, tamper

__all__ = ["superuser"]  # a fixture

T0 = datetime(2026, 11, 29, tzinfo=UTC)
runner = CliRunner()


def fill(engine: sa.Engine, start: int, n: int) -> None:
    with SqlUnitOfWork(engine) as uow:
        uow.record(
            [
                NewLedgerEntry(
                    uuid.uuid4(), "workload.admitted", {"i": i}, T0 + timedelta(minutes=i)
                )
                for i in range(start, start + n)
            ]
        )
        uow.commit()


def clear_checkpoints(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        conn.exec_driver_sql("DELETE FROM ledger_checkpoints")


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: sa.Engine) -> Iterator[Path]:
    clear_checkpoints(engine)
    public = tmp_path / "ledger.pub"
    result = runner.invoke(app, ["keygen", "--public-key", str(public), "--origin", "qm.test/l"])
    assert result.exit_code == 0, result.output
    seed = result.output.strip().removeprefix("QM_LEDGER_SIGNING_KEY=")
    monkeypatch.setenv("QM_LEDGER_SIGNING_KEY", seed)
    get_settings.cache_clear()
    yield public
    get_settings.cache_clear()
    clear_checkpoints(engine)


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_export_checkpoint_and_verify_offline(
    engine: sa.Engine, database_url: str, keys: Path, tmp_path: Path
) -> None:
    db = ["--database-url", database_url]
    fill(engine, 0, 7)
    invoke("checkpoint", "--out", str(tmp_path / "cp7"), "--origin", "qm.test/l", *db)
    fill(engine, 7, 6)
    printed = invoke("checkpoint", "--out", str(tmp_path / "cp13"), "--origin", "qm.test/l", *db)
    assert printed == (tmp_path / "cp13").read_text() and printed.startswith("qm.test/l\n13\n")
    invoke("export", "--out", str(tmp_path / "ledger.ndjson"), *db)
    assert len((tmp_path / "ledger.ndjson").read_bytes().splitlines()) == 13

    common = ["--checkpoint", str(tmp_path / "cp13"), "--public-key", str(keys)]
    older = ["--older", str(tmp_path / "cp7")]
    out = invoke("verify", "--export", str(tmp_path / "ledger.ndjson"), *common, *older)
    assert out.startswith("OK: 13 entries, checkpoint size 13, 1 older")
    out = invoke("verify", "--live", *db, *common, *older)
    assert out.startswith("OK: 13 entries")

    lines = (tmp_path / "ledger.ndjson").read_bytes().splitlines(keepends=True)
    (tmp_path / "cut.ndjson").write_bytes(b"".join(lines[:3] + lines[4:]))
    result = runner.invoke(app, ["verify", "--export", str(tmp_path / "cut.ndjson"), *common])
    assert result.exit_code == 1
    assert "NOT VERIFIED" in result.output and "FAIL entry 4" in result.output


def test_tampering_in_the_database_fails_live_verification(
    superuser: sa.Engine, database_url: str, keys: Path, tmp_path: Path
) -> None:
    db = ["--database-url", database_url]
    fill(superuser, 0, 5)
    invoke("checkpoint", "--out", str(tmp_path / "cp"), "--origin", "qm.test/l", *db)
    tamper(superuser, "UPDATE ledger_entries SET body = '{\"i\": 99}' WHERE seq = 2", guard="drop")
    result = runner.invoke(
        app,
        ["verify", "--live", *db, "--checkpoint", str(tmp_path / "cp"), "--public-key", str(keys)],
    )
    assert result.exit_code == 1 and "entry 2: entry hash" in result.output
    assert "ck_ledger_entries_entry_bytes" in result.output
    result = runner.invoke(app, ["checkpoint", "--origin", "qm.test/l", *db])
    assert result.exit_code == 1 and "NOT SIGNED" in result.output


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pub").write_text("not a key\n")
    (tmp_path / "cp").write_text("x\n")
    result = runner.invoke(
        app,
        ["verify", "--checkpoint", str(tmp_path / "cp"), "--public-key", str(tmp_path / "pub")],
    )
    assert result.exit_code == 2
    result = runner.invoke(
        app,
        [
            "verify",
            "--export",
            str(tmp_path / "missing"),
            "--checkpoint",
            str(tmp_path / "cp"),
            "--public-key",
            str(tmp_path / "pub"),
        ],
    )
    assert result.exit_code == 2 and "bad public key" in result.output


def test_usage_from_an_export_file(tmp_path: Path) -> None:
    from service.ledger.entries import WorkloadAdmitted, WorkloadFinished, new_entry
    from service.ledger.export import export_ndjson
    from service.ledger.memory import InMemoryLedger

    queues = {"namespace": "team-a", "workload": "w", "local_queue": "lq", "cluster_queue": "cq"}
    admitted = WorkloadAdmitted(
        **queues,
        cluster="c1",
        flavors={"nvidia.com/gpu": "h100"},
        island=None,
        reserved={"h100": {"nvidia.com/gpu": 8}},
        borrowed={},
        reason="fits",
    )
    finished = WorkloadFinished(
        **queues,
        cluster="c1",
        outcome="succeeded",
        started_at=T0,
        finished_at=T0,
        consumed={},
        gpu_seconds=0,
        cpu_seconds=0,
        memory_gib_seconds=0,
    )
    ledger = InMemoryLedger()
    entries = ledger.append(
        [
            new_entry(admitted, uuid.uuid4(), T0),
            new_entry(finished, uuid.uuid4(), T0 + timedelta(minutes=90)),
        ]
    )
    path = tmp_path / "ledger.ndjson"
    path.write_bytes(b"".join(export_ndjson(entries)))
    out = invoke("usage", "--export", str(path), "--granularity", "hour", "--by", "flavor")
    assert out.splitlines() == [
        "period\tflavor\tresource\thours\tran",
        "2026-11-29T00:00:00+00:00\th100\tnvidia.com/gpu\t8.000000\t0.000000",
        "2026-11-29T01:00:00+00:00\th100\tnvidia.com/gpu\t4.000000\t0.000000",
    ]
    result = runner.invoke(app, ["usage", "--export", str(path), "--by", "team"])
    assert result.exit_code == 2 and "unknown dimensions" in result.output
