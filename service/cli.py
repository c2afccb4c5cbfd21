"""The ``quartermaster`` server command line."""

from __future__ import annotations

import typer

from sim.cli import app as sim_app

app = typer.Typer(help="Quartermaster: fleet-wide admission for GPU gangs.", no_args_is_help=True)
projections_app = typer.Typer(help="Read models built from the event log.", no_args_is_help=True)
app.add_typer(projections_app, name="projections")
app.add_typer(sim_app, name="sim")


def main() -> None:
    app()
