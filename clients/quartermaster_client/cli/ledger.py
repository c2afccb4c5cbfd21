"""``qmctl ledger …``: query, export and verify the audit ledger; its checkpoints."""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from quartermaster_client.cli.render import table, to_json, to_yaml
from quartermaster_client.cli.shared import EXIT_LEDGER_BROKEN, STATE, examples, handled
from quartermaster_client.ledger import Report, verify_export

commands = typer.Typer(
    help="The audit ledger: query, export and verify entries; signed checkpoints.",
    no_args_is_help=True,
)


def _filters(
    namespace: str | None,
    cluster_queue: str | None,
    local_queue: str | None,
    cluster: str | None,
    workload: str | None,
    actor: str | None,
    flavor: str | None,
    kind: list[str] | None,
    since: str | None,
    until: str | None,
) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "cluster_queue": cluster_queue,
        "local_queue": local_queue,
        "cluster": cluster,
        "workload": workload,
        "actor": actor,
        "flavor": flavor,
        "kind": kind or None,
        "since": since,
        "until": until,
    }


LNamespace = Annotated[str | None, typer.Option("-n", "--namespace", help="Namespace.")]
LClusterQueue = Annotated[str | None, typer.Option("--cluster-queue", help="ClusterQueue.")]
LLocalQueue = Annotated[str | None, typer.Option("--local-queue", help="LocalQueue.")]
LCluster = Annotated[str | None, typer.Option("--cluster", help="Member cluster.")]
LWorkload = Annotated[str | None, typer.Option("--workload", help="Workload name.")]
LActor = Annotated[str | None, typer.Option("--actor", help="Who acted.")]
LFlavor = Annotated[str | None, typer.Option("--flavor", help="ResourceFlavor.")]
LKind = Annotated[
    list[str] | None, typer.Option("--kind", help="Entry kind, e.g. workload.admitted; repeatable.")
]
LSince = Annotated[str | None, typer.Option("--since", help="From (ISO 8601 time).")]
LUntil = Annotated[str | None, typer.Option("--until", help="Until (ISO 8601 time).")]


def _subject(body: dict[str, Any]) -> str:
    name = body.get("workload") or body.get("name") or "-"
    kind = body.get("object_kind") or ("Workload" if body.get("workload") else "")
    where = f"{body['namespace']}/{name}" if body.get("namespace") else str(name)
    return f"{kind}/{where}" if kind else where


@commands.command(
    "query",
    epilog=examples(
        "qmctl ledger query -n team-a --kind workload.admitted",
        "qmctl ledger query --cluster-queue team-a --since 2026-01-01T00:00:00Z -o json",
    ),
)
@handled
def ledger_query(
    namespace: LNamespace = None,
    cluster_queue: LClusterQueue = None,
    local_queue: LLocalQueue = None,
    cluster: LCluster = None,
    workload: LWorkload = None,
    actor: LActor = None,
    flavor: LFlavor = None,
    kind: LKind = None,
    since: LSince = None,
    until: LUntil = None,
    after: Annotated[int | None, typer.Option("--after", help="Entries after this seq.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many.")] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="table, json or yaml.")] = "table",
) -> None:
    """Ledger entries matching the filters, oldest first (auditors)."""
    filters = _filters(
        namespace, cluster_queue, local_queue, cluster, workload, actor, flavor, kind, since, until
    )
    with STATE.client() as client:
        found = []
        for entry in client.ledger_entries(after, **filters):
            found.append(entry)
            if limit is not None and len(found) >= limit:
                break
    if output in ("json", "yaml"):
        data = [e.to_dict() for e in found]
        typer.echo(to_json(data) if output == "json" else to_yaml({"items": data}))
        return
    rows = [
        [
            str(e.seq),
            e.recorded_at[:19].replace("T", " "),
            e.kind,
            _subject(e.body),
            str(e.body.get("actor", "-")),
        ]
        for e in found
    ]
    typer.echo(table(["SEQ", "TIME", "KIND", "OBJECT", "ACTOR"], rows))


@commands.command(
    "export",
    epilog=examples(
        "qmctl ledger export > ledger.ndjson        # then: quartermaster ledger verify",
        "qmctl ledger export --format csv --filtered -n team-a --file team-a.csv",
    ),
)
@handled
def ledger_export(
    format: Annotated[str, typer.Option("--format", help="ndjson or csv.")] = "ndjson",
    file: Annotated[Path | None, typer.Option("--file", help="Write here, not stdout.")] = None,
    filtered: Annotated[
        bool, typer.Option("--filtered", help="Only the entries matching the filters.")
    ] = False,
    namespace: LNamespace = None,
    cluster_queue: LClusterQueue = None,
    local_queue: LLocalQueue = None,
    cluster: LCluster = None,
    workload: LWorkload = None,
    actor: LActor = None,
    flavor: LFlavor = None,
    kind: LKind = None,
    since: LSince = None,
    until: LUntil = None,
) -> None:
    """Export the ledger, streamed, as NDJSON (verifiable offline) or CSV."""
    filters = _filters(
        namespace, cluster_queue, local_queue, cluster, workload, actor, flavor, kind, since, until
    )
    with STATE.client() as client:
        chunks = client.ledger_export(format, filtered, **filters)
        if file is None:
            for chunk in chunks:
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return
        with file.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
    typer.echo(f"wrote {file}", err=True)


@commands.command(
    "checkpoint",
    epilog=examples("qmctl ledger checkpoint", "qmctl ledger checkpoint --publish   # admin"),
)
@handled
def ledger_checkpoint(
    publish: Annotated[bool, typer.Option("--publish", help="Sign one now (admin).")] = False,
) -> None:
    """The latest signed checkpoint of the ledger (tree size and root hash)."""
    with STATE.client() as client:
        note = client.publish_checkpoint() if publish else client.latest_checkpoint()
    typer.echo(note.rstrip("\n"))


@commands.command(
    "verify",
    epilog=examples(
        "qmctl ledger verify --key $LEDGER_KEY        # the live ledger and its latest checkpoint",
        "qmctl ledger verify -f ledger.ndjson --key $LEDGER_KEY   # offline: the file alone",
        "qmctl ledger verify -f ledger.ndjson --checkpoint cp.txt --key $LEDGER_KEY",
        "",
        "Exit codes: 0 verified (without --key: nothing found broken, no signature checked), "
        "8 the ledger does not verify, or a key was given and no checkpoint, 1 any other error.",
    ),
)
@handled
def ledger_verify(
    file: Annotated[
        str | None, typer.Option("-f", "--file", help="NDJSON export, or - (default: the server).")
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="Signed checkpoint note (default: the export's)."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", envvar="QMCTL_LEDGER_KEY", help="Verifier key name+id+key."),
    ] = None,
) -> None:
    """Check the ledger: every hash, every link, the Merkle root against a signed checkpoint.

    A whole export opens with the latest checkpoint; with --key its signature
    is checked, and only then does verify say "verified"."""
    note = checkpoint.read_text() if checkpoint else None
    if file is not None:
        if file == "-":
            report = verify_export(sys.stdin, note, key)
        else:
            with Path(file).open() as lines:
                report = verify_export(lines, note, key)
    else:
        with STATE.client() as client:
            report = verify_export(_lines_of(client.ledger_export()), note, key)
    typer.echo(
        f"{report.entries} entries; head {report.head_hash[:16]}…; "
        f"root {base64.b64encode(report.root_hash).decode()}"
    )
    for seq, reason in report.breaks[:20]:
        typer.echo(f"  seq {seq}: {reason}", err=True)
    for line in _checked(report):
        typer.echo(line)
    if not report.ok:
        typer.echo("the ledger does NOT verify", err=True)
        raise typer.Exit(EXIT_LEDGER_BROKEN)
    if report.verified:
        typer.echo("verified")
    elif key is not None:
        typer.echo("NOT verified: no signed checkpoint to check the key against", err=True)
        raise typer.Exit(EXIT_LEDGER_BROKEN)
    else:
        typer.echo("not verified: hashes and links intact, no signature checked (give --key)")


def _checked(report: Report) -> list[str]:
    """What was and was not checked, a line each."""
    breaks = len(report.breaks)
    problems = f"BROKEN ({breaks} problem{'s' if breaks > 1 else ''})"
    chain = [f"chain: every hash and link checked: {problems if breaks else 'intact'}"]
    cp = report.checkpoint
    if cp is None:
        return [
            *chain,
            "checkpoint: none (the export carries none; publish one with "
            "qmctl ledger checkpoint --publish, or give --checkpoint)",
            "signature: not checked (no checkpoint)",
        ]
    where = "--checkpoint" if report.checkpoint_from == "given" else "the export"
    verdict = "matches" if report.checkpoint_matches else "DOES NOT MATCH"
    lines = [*chain, f"checkpoint: {cp.origin} size {cp.size} (from {where}): root {verdict}"]
    if report.signature is None:
        lines.append("signature: not checked (give --key)")
    else:
        lines.append(f"signature: {'valid' if report.signature else 'INVALID for the key given'}")
    if report.unsigned > 0:
        lines.append(
            f"unsigned: {report.unsigned} {'entry' if report.unsigned == 1 else 'entries'} "
            "after the checkpoint "
            "(hashes and links checked, no signature covers them yet)"
        )
    return lines


def _lines_of(chunks: Iterator[bytes]) -> Iterator[bytes]:
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from complete
    if buffer:
        yield buffer
