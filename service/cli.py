"""The ``quartermaster`` server command line."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from service.ledger.cli import app as ledger_app
from sim.cli import app as sim_app

app = typer.Typer(help="Quartermaster: fleet-wide admission for GPU gangs.", no_args_is_help=True)
projections_app = typer.Typer(help="Read models built from the event log.", no_args_is_help=True)
app.add_typer(projections_app, name="projections")
app.add_typer(sim_app, name="sim")
app.add_typer(ledger_app, name="ledger")
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


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    workers: Annotated[int, typer.Option(help="API worker processes.")] = 1,
) -> None:
    """Serve the REST API (QM_DATABASE_URL must point at a migrated database)."""
    import uvicorn

    _database_url()
    uvicorn.run("service.api.main:create", factory=True, host=host, port=port, workers=workers)


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


@app.command()
def standalone(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    data_dir: Annotated[
        Path | None, typer.Option(help="Where embedded servers keep their data.")
    ] = None,
) -> None:
    """Everything in one command: an embedded Postgres unless QM_DATABASE_URL is
    set, migrations, and the API."""
    from contextlib import ExitStack

    import uvicorn

    from service.api.app import create_app
    from service.app.bootstrap import bootstrap
    from service.app.migrate import upgrade
    from service.config import get_settings
    from service.runtime.embedded import embedded_postgres

    settings = get_settings()
    data = (data_dir or settings.data_dir).resolve()
    if not settings.bootstrap_token:
        # A fresh admin token per data directory, kept there, so that a restart
        # resumes with the same credentials.
        token_file = data / "admin-token"
        if not token_file.exists():
            token_file.parent.mkdir(parents=True, exist_ok=True)
            token_file.write_text("qm_" + secrets.token_urlsafe(32))
            token_file.chmod(0o600)
        settings = settings.model_copy(update={"bootstrap_token": token_file.read_text().strip()})
    with ExitStack() as stack:
        url = settings.database_url
        if not url:
            with console.status(f"starting embedded Postgres in {data / 'postgres'}…"):
                url = stack.enter_context(embedded_postgres(data / "postgres"))
        with console.status("migrating…"):
            upgrade(url)
        services = bootstrap(settings, url)
        stack.callback(services.close)
        console.print(f"[green]Quartermaster[/green] API at http://{host}:{port}  (Ctrl-C stops)")
        console.print(f"admin token: {settings.bootstrap_token}")
        uvicorn.run(create_app(services), host=host, port=port, log_level="info")


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
