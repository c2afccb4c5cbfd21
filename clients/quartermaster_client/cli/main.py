"""``qmctl``: the Quartermaster command line, in the manner of kubectl.

The verb groups live in modules of their own; this one composes them, in the
order ``--help`` lists them, under the global options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from quartermaster_client import __version__
from quartermaster_client.cli import clusters, contexts, ledger, objects, usage, workloads
from quartermaster_client.cli.shared import STATE

app = typer.Typer(
    name="qmctl",
    help="Quartermaster from the command line: apply quotas, submit and watch GPU gangs.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(objects.commands)
app.add_typer(workloads.commands)
app.add_typer(contexts.commands)
app.add_typer(usage.commands)
app.add_typer(contexts.config, name="config")
app.add_typer(ledger.commands, name="ledger")
app.add_typer(clusters.commands, name="cluster")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"qmctl {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    context: Annotated[
        str | None, typer.Option("--context", help="Context to use (default: the current one).")
    ] = None,
    server: Annotated[
        str | None, typer.Option("--server", envvar="QMCTL_SERVER", help="API URL.")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="QMCTL_TOKEN", help="Bearer token.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", envvar="QMCTL_CONFIG", help="Contexts file."),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
) -> None:
    STATE.context, STATE.server, STATE.token, STATE.config = context, server, token, config


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["app", "main"]
