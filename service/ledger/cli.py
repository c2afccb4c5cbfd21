"""``quartermaster ledger …``: keys, checkpoints, exports and offline verification.

``verify`` needs nothing but files (an export, the checkpoints, the verifier
key) — or, with ``--live``, read access to the database — so an auditor can
run it on their own machine.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from service.ledger.chain import LedgerEntry
from service.ledger.checkpoint import DEFAULT_ORIGIN, CheckpointError, NoteSigner, NoteVerifier
from service.ledger.export import read_ndjson
from service.ledger.verify import VerifyReport, verify_export

if TYPE_CHECKING:
    from service.ledger.postgres import PostgresLedgerReader

app = typer.Typer(
    help="The audit ledger: checkpoints, exports, verification.", no_args_is_help=True
)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _database_url(url: str | None) -> str:
    if url:
        return url
    from service.config import get_settings

    configured = get_settings().database_url
    if not configured:
        raise _fail("no database: pass --database-url or set QM_DATABASE_URL")
    return configured


@contextmanager
def _live_reader(url: str) -> Iterator[PostgresLedgerReader]:
    import sqlalchemy as sa

    from service.ledger.postgres import PostgresLedgerReader

    engine = sa.create_engine(url)
    try:
        yield PostgresLedgerReader(engine)
    finally:
        engine.dispose()


def _lines(path: Path) -> Iterator[bytes]:
    if str(path) == "-":
        yield from sys.stdin.buffer
        return
    with path.open("rb") as handle:
        yield from handle


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot read the {what} {path}: {exc.strerror}") from exc


@app.command()
def verify(
    checkpoint: Annotated[Path, typer.Option(help="The newest signed checkpoint (a note).")],
    public_key: Annotated[
        Path, typer.Option(help="File with the verifier key: name+keyid+base64key.")
    ],
    export: Annotated[
        Path | None, typer.Option(help="NDJSON export to verify ('-' reads stdin).")
    ] = None,
    live: Annotated[
        bool, typer.Option(help="Verify the live ledger in the database instead.")
    ] = False,
    database_url: Annotated[
        str | None, typer.Option(help="With --live; default QM_DATABASE_URL.")
    ] = None,
    older: Annotated[
        list[Path] | None, typer.Option(help="Earlier checkpoints the ledger must extend.")
    ] = None,
    strict: Annotated[
        bool, typer.Option(help="Fail on entries that no checkpoint covers yet.")
    ] = False,
) -> None:
    """Check every hash, the chain, the signatures and consistency with older
    checkpoints. Exit 0 when the ledger verifies, 1 when it does not."""
    if (export is None) == (not live):
        raise _fail("give exactly one of --export FILE or --live")
    try:
        verifier = NoteVerifier.from_key(_read(public_key, "public key"))
    except CheckpointError as exc:
        raise _fail(f"bad public key: {exc}") from exc
    note = _read(checkpoint, "checkpoint")
    older_notes = [_read(p, "older checkpoint") for p in older or []]
    if export is not None:
        report = verify_export(_lines(export), note, verifier, older_notes, strict=strict)
    else:
        with _live_reader(_database_url(database_url)) as reader:
            report = reader.verify_live(note, verifier, older_notes, strict=strict)
    _print(report)
    if not report.ok:
        raise typer.Exit(1)


def _print(report: VerifyReport) -> None:
    for problem in report.problems:
        typer.echo(f"FAIL {problem}")
    if report.problems_dropped:
        typer.echo(f"FAIL … and {report.problems_dropped} more problems")
    size = report.checkpoint.size if report.checkpoint else "?"
    verdict = "OK" if report.ok else "NOT VERIFIED"
    typer.echo(
        f"{verdict}: {report.entries} entries, checkpoint size {size}, "
        f"{report.older_checked} older checkpoints, {report.unsigned_tail} unsigned at the tail, "
        f"head {report.head_hash.hex()}"
    )


@app.command()
def usage(
    export: Annotated[
        Path | None, typer.Option(help="Account from an NDJSON export ('-' reads stdin).")
    ] = None,
    live: Annotated[bool, typer.Option(help="Account from the live ledger.")] = False,
    database_url: Annotated[
        str | None, typer.Option(help="With --live; default QM_DATABASE_URL.")
    ] = None,
    granularity: Annotated[str, typer.Option(help="hour, day or month.")] = "day",
    by: Annotated[
        list[str] | None,
        typer.Option(help="Group by: namespace, local_queue, cluster_queue, cluster, flavor."),
    ] = None,
    as_of: Annotated[
        datetime | None, typer.Option(help="Charge running workloads up to this time (UTC).")
    ] = None,
) -> None:
    """Resource-hours (GPU-hours, core-hours, GiB-hours) per period and group,
    from the ledger alone; tab-separated, a header first. ``hours``: what the
    admissions held (what quota and fair sharing count); ``ran``: what their
    pods ran, by the members' own timestamps (docs/billing.md)."""
    from service.ledger.accounting import Granularity, UsageRollup

    if (export is None) == (not live):
        raise _fail("give exactly one of --export FILE or --live")
    if granularity not in ("hour", "day", "month"):
        raise _fail("--granularity is hour, day or month")
    rollup = UsageRollup()
    try:
        if export is not None:
            rollup.apply_all(_entries_of_export(export))
        else:
            import sqlalchemy as sa

            from service.ledger.postgres import PostgresLedgerReader

            engine = sa.create_engine(_database_url(database_url))
            try:
                rollup.apply_all(PostgresLedgerReader(engine).entries())
            finally:
                engine.dispose()
        moment = as_of.replace(tzinfo=as_of.tzinfo or UTC) if as_of else None
        rows = rollup.report(cast("Granularity", granularity), by or ["namespace"], moment)
    except (ValueError, KeyError) as exc:
        raise _fail(f"cannot account: {exc}") from exc
    dimensions = by or ["namespace"]
    typer.echo("\t".join(["period", *dimensions, "resource", "hours", "ran"]))
    for row in rows:
        group = [value for _, value in row.group]
        figures = [f"{row.hours:.6f}", f"{row.ran:.6f}"]
        typer.echo("\t".join([row.period.isoformat(), *group, row.resource, *figures]))


def _entries_of_export(path: Path) -> Iterator[LedgerEntry]:
    from service.ledger.export import ExportFormatError, entry_of

    for record in read_ndjson(_lines(path)):
        if isinstance(record, ExportFormatError):
            raise record
        yield entry_of(record)


@app.command()
def keygen(
    public_key: Annotated[Path, typer.Option(help="Where to write the verifier key.")],
    origin: Annotated[str, typer.Option(help="Key name: the log's origin line.")] = DEFAULT_ORIGIN,
) -> None:
    """Make a signing key: prints the QM_LEDGER_SIGNING_KEY value, writes the
    verifier key that auditors keep."""
    signer, seed = NoteSigner.generate(origin)
    public_key.write_text(signer.verifier_key + "\n", encoding="utf-8")
    typer.echo(f"QM_LEDGER_SIGNING_KEY={seed}")


@app.command("export")
def export_command(
    out: Annotated[Path, typer.Option(help="NDJSON file to write ('-' for stdout).")],
    database_url: Annotated[str | None, typer.Option(help="Default QM_DATABASE_URL.")] = None,
) -> None:
    """Stream the live ledger to NDJSON in constant memory."""
    import sqlalchemy as sa

    from service.ledger.export import export_ndjson
    from service.ledger.postgres import PostgresLedgerReader

    engine = sa.create_engine(_database_url(database_url))
    try:
        entries = PostgresLedgerReader(engine).records()
        if str(out) == "-":
            sys.stdout.buffer.writelines(export_ndjson(entries))
        else:
            with out.open("wb") as handle:
                handle.writelines(export_ndjson(entries))
    finally:
        engine.dispose()


@app.command()
def checkpoint(
    out: Annotated[
        Path | None, typer.Option(help="Also write the signed checkpoint to this file.")
    ] = None,
    origin: Annotated[str, typer.Option(help="The log's origin line.")] = DEFAULT_ORIGIN,
    database_url: Annotated[str | None, typer.Option(help="Default QM_DATABASE_URL.")] = None,
) -> None:
    """Publish a checkpoint of the live ledger, signed with QM_LEDGER_SIGNING_KEY
    (nothing new since the last one: the last one). Refuses to sign a ledger
    that does not extend the checkpoints already published."""
    import sqlalchemy as sa

    from service.config import get_settings
    from service.ledger.postgres import PostgresCheckpointStore, PostgresLedgerReader
    from service.ledger.proofs import LedgerTree, publish_checkpoint

    seed = get_settings().ledger_signing_key
    if not seed:
        raise _fail("QM_LEDGER_SIGNING_KEY is not set (see `quartermaster ledger keygen`)")
    try:
        signer = NoteSigner.from_seed(origin, seed)
    except CheckpointError as exc:
        raise _fail(f"bad QM_LEDGER_SIGNING_KEY: {exc}") from exc
    engine = sa.create_engine(_database_url(database_url))
    try:
        tree = LedgerTree(origin)
        reader, store = PostgresLedgerReader(engine), PostgresCheckpointStore(engine)
        note = publish_checkpoint(tree, reader, signer, store)
    except (CheckpointError, ValueError) as exc:
        raise _fail(f"NOT SIGNED: {exc}", code=1) from exc
    finally:
        engine.dispose()
    if out is not None:
        out.write_text(note, encoding="utf-8")
    typer.echo(note, nl=False)
