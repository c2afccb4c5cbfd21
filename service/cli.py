"""The ``quartermaster`` server command line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from service.ledger.cli import app as ledger_app

app = typer.Typer(help="Quartermaster: fleet-wide admission for GPU gangs.", no_args_is_help=True)
projections_app = typer.Typer(help="Read models built from the event log.", no_args_is_help=True)
app.add_typer(projections_app, name="projections")
app.add_typer(ledger_app, name="ledger")
secrets_app = typer.Typer(
    help="Member-cluster credentials at rest, sealed with QM_SECRET_KEY.", no_args_is_help=True
)
app.add_typer(secrets_app, name="secrets")
console = Console(stderr=True)


def _database_url() -> str:
    from service.config import get_settings

    url = get_settings().database_url
    if not url:
        console.print("[red]QM_DATABASE_URL is not set[/red]")
        raise typer.Exit(2)
    return url


@app.command()
def migrate() -> None:
    """Bring the database schema to the newest migration."""
    from service.app.migrate import upgrade

    upgrade(_database_url())
    console.print("[green]database is at the newest migration[/green]")


@app.command("wait-for-migrations")
def wait_for_migrations(
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 900.0,
    interval: Annotated[float, typer.Option(help="Seconds between looks.")] = 2.0,
) -> None:
    """Wait until the schema is at this version's newest migration, which
    `quartermaster migrate` (the migration Job) applies; exit 1 on timeout.
    The init container of every part in deploy/: a new version starts only
    on its own schema."""
    from service.app.migrate import wait_for_head

    lag = wait_for_head(_database_url(), timeout, interval, console.print)
    if lag is not None:
        console.print(f"[red]gave up after {timeout:g} s[/red]: {lag}")
        raise typer.Exit(1)
    console.print("[green]the schema is at this version's newest migration[/green]")


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Address to listen on.", envvar="QM_API_HOST")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on.", envvar="QM_API_PORT")] = 8080,
    workers: Annotated[int, typer.Option(help="API worker processes.")] = 1,
) -> None:
    """Serve the REST API (QM_DATABASE_URL must point at a migrated database)."""
    import tempfile
    from contextlib import ExitStack

    import uvicorn

    from service.api.server import HTTP_PROTOCOL

    _database_url()
    with ExitStack() as stack:
        if workers > 1:
            # Every worker process writes its samples here and /metrics sums
            # them, whichever process answers the scrape. Named after us, so
            # that the next start removes it should we be killed.
            sweep_metrics_dirs(Path(tempfile.gettempdir()))
            shared = stack.enter_context(
                tempfile.TemporaryDirectory(prefix=f"{METRICS_PREFIX}{os.getpid()}-")
            )
            os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", shared)
        uvicorn.run(
            "service.api.main:create",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            http=HTTP_PROTOCOL,  # its own 400s are problem+json too
            # X-Forwarded-For is the app's to read, from QM_TRUSTED_PROXIES
            # alone: uvicorn's default would trust it from 127.0.0.1.
            proxy_headers=False,
        )


METRICS_PREFIX = "qm-metrics-"


def sweep_metrics_dirs(parent: Path) -> list[Path]:
    """Remove the metrics directories of API processes that are gone (killed
    before they could remove their own); return them."""
    import shutil

    removed = []
    for path in parent.glob(f"{METRICS_PREFIX}*-*"):
        pid = path.name[len(METRICS_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@projections_app.command("rebuild")
def projections_rebuild(name: Annotated[str, typer.Argument(help="Projection name.")]) -> None:
    """Rebuild one projection from event position 0, atomically."""
    from service.app.bootstrap import bootstrap
    from service.config import get_settings
    from service.projections import UnknownProjection

    services = bootstrap(get_settings(), _database_url())
    try:
        with console.status(f"rebuilding {name}…"):
            result = services.projections.rebuild(name)
    except UnknownProjection:
        console.print(
            f"[red]unknown projection {name!r}[/red]; known: {services.projections.names}"
        )
        raise typer.Exit(2) from None
    finally:
        services.close()
    console.print(f"[green]{name}[/green]: {result.applied} events, at position {result.position}")


@projections_app.command("list")
def projections_list() -> None:
    """Every projection and the position it has applied up to."""
    from service.app.bootstrap import bootstrap
    from service.config import get_settings

    services = bootstrap(get_settings(), _database_url())
    try:
        for name in services.projections.names:
            typer.echo(f"{name}\t{services.projections.position(name)}")
    finally:
        services.close()


@secrets_app.command("rotate")
def secrets_rotate() -> None:
    """Seal every stored member-cluster credential again, under QM_SECRET_KEY.

    Run it once every API, worker and scheduler process has the new key as
    QM_SECRET_KEY and the old one as QM_SECRET_KEY_PREVIOUS; then drop
    QM_SECRET_KEY_PREVIOUS. One event per Cluster, through the usual write
    path; running it again changes nothing. Exits 1 when a credential could
    not be opened with either key (it is left as it was)."""
    from service.app.bootstrap import bootstrap
    from service.app.crypto import SecretBox
    from service.app.rotation import rotate_credentials
    from service.config import get_settings

    settings = get_settings()
    services = bootstrap(settings, _database_url())
    try:
        box = SecretBox(settings.secret_key, settings.secret_key_previous)
        report = rotate_credentials(services.engine, services.unit_of_work, box)
    finally:
        services.close()
    typer.echo(
        f"key {report.key_id}: {len(report.rotated)} re-sealed, "
        f"{len(report.current)} already current, {len(report.failed)} failed"
    )
    for name in report.rotated:
        typer.echo(f"cluster/{name} re-sealed")
    for name, why in sorted(report.failed.items()):
        console.print(f"[red]cluster/{name} not re-sealed[/red]: {why}")
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def standalone(
    host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the API listens on.")] = 8080,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where databases, credentials and logs are kept.",
            show_default="$QM_DATA_DIR or .qm-data",
        ),
    ] = None,
    clusters: Annotated[
        int,
        typer.Option(
            help="Stand-in member clusters to serve: the fleet's first N (0: none; the demo "
            "fleet's four are three Kueue members and the Volcano member vc-1)."
        ),
    ] = 4,
    fleet: Annotated[
        Path | None,
        typer.Option(help="Fleet file of the stand-ins.", show_default="sim/fleets/demo.yaml"),
    ] = None,
    quotas: Annotated[
        Path | None,
        typer.Option(
            help="Manifests to create when missing.", show_default="sim/fleets/demo-quotas.yaml"
        ),
    ] = None,
    demo: Annotated[bool, typer.Option(help="Create the demo quotas.")] = True,
    qmctl_context: Annotated[
        bool, typer.Option(help="Write a qmctl context 'standalone' and make it current.")
    ] = True,
) -> None:
    """Everything on one machine: Postgres and Redis (embedded unless
    QM_DATABASE_URL / QM_BROKER_URL are set), migrations, the API, a worker,
    the scheduler, stand-in member clusters registered as Clusters, and demo
    quotas. Ctrl-C stops it all; a restart with the same data directory resumes.

    \b
    Examples:
      quartermaster standalone
      quartermaster standalone --port 9090 --data-dir /tmp/qm --clusters 1
      QM_DATABASE_URL=postgresql+psycopg://qm@db/qm quartermaster standalone
    """
    from service.config import get_settings
    from service.runtime import standalone as runtime

    settings = get_settings()
    options = runtime.Options(
        host=host,
        port=port,
        data_dir=data_dir or settings.data_dir,
        clusters=clusters,
        fleet=fleet or runtime.DEMO_FLEET,
        quotas=(quotas or runtime.DEMO_QUOTAS) if demo else None,
        write_qmctl_context=qmctl_context,
    )
    status = Console(stderr=True, soft_wrap=True)
    raise typer.Exit(runtime.run(options, settings, status))


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
