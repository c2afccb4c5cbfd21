"""``quartermaster sim …``: the replay simulator and the member-cluster stand-in.

Each sub-package registers its own commands here with one line, so that the
two can grow without touching each other. The ``quartermaster`` entry point
mounts it (workers/cli.py); ``python -m sim.cli`` runs it alone, as the
standalone supervisor does (the service imports nothing of sim).
"""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Simulation: replay GPU traces, run stand-in member clusters.", no_args_is_help=True
)

from sim.kubesim.cli import register as _register_kubesim  # noqa: E402

_register_kubesim(app)
from sim.replay.cli import register as _register_replay  # noqa: E402

_register_replay(app)

if __name__ == "__main__":
    app()
