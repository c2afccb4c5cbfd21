"""``quartermaster sim …``: the replay simulator and the member-cluster stand-in.

Each sub-package registers its own commands here with one line, so that the
two can grow without touching each other.
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
