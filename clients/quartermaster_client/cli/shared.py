"""What every verb group of ``qmctl`` uses: the global options' state, one
way to report errors, the options several groups share and the exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer

from quartermaster_client.client import Client
from quartermaster_client.config import resolve
from quartermaster_client.errors import ApiError, ConfigError, QuartermasterError
from quartermaster_client.explain import QueueUsage, queue_usage
from quartermaster_client.kinds import Kind, lookup
from quartermaster_client.models import ClusterQueue, Workload
from quartermaster_client.outcomes import Outcome

EXIT_ERROR = 1
EXIT_FAILED = 3
EXIT_PREEMPTED = 4
EXIT_TIMEOUT = 5
EXIT_CANCELLED = 6
EXIT_LEDGER_BROKEN = 8
EXIT_CODES = {
    Outcome.SUCCEEDED: 0,
    Outcome.FAILED: EXIT_FAILED,
    Outcome.PREEMPTED: EXIT_PREEMPTED,
    Outcome.CANCELLED: EXIT_CANCELLED,
}


def examples(*lines: str) -> str:
    """An epilog that keeps one example per line in --help."""
    return "[b]Examples[/b]\n\n" + "\n\n".join(f"  {line}" for line in lines)


@dataclass
class State:
    """The global options (``--context``, ``--server`` ...), set before any command runs."""

    context: str | None = None
    server: str | None = None
    token: str | None = None
    config: Path | None = None

    def namespace(self, given: str | None) -> str:
        if given:
            return given
        try:
            found = resolve(self.server, self.token, None, self.context, self.config).namespace
        except ConfigError:
            found = None
        return found or "default"

    def client(self) -> Client:
        found = resolve(self.server, self.token, None, self.context, self.config)
        return Client(found.server, found.token, namespace=found.namespace)


STATE = State()
F = TypeVar("F", bound=Callable[..., Any])


def handled(func: F) -> F:
    """API and input errors as one line on stderr (with each field at fault)
    and exit code 1, instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (QuartermasterError, ValueError, KeyError, OSError) as error:
            message = error.args[0] if isinstance(error, KeyError) and error.args else error
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(EXIT_ERROR) from None

    return cast(F, wrapper)


Namespace = Annotated[
    str | None, typer.Option("-n", "--namespace", help="Namespace (default: the context's).")
]
AllNamespaces = Annotated[bool, typer.Option("-A", "--all-namespaces", help="Every namespace.")]
Files = Annotated[
    list[str],
    typer.Option("-f", "--filename", help="File, directory or - for stdin; repeatable."),
]
Output = Annotated[str, typer.Option("-o", "--output", help="table, wide, json, yaml or name.")]


def kind_named(name: str) -> Kind:
    try:
        return lookup(name)
    except KeyError as error:
        raise typer.BadParameter(str(error.args[0])) from None


def queue_usage_of(client: Client, cq: ClusterQueue) -> QueueUsage | None:
    """What a ClusterQueue uses now, or None when its workloads cannot be read."""
    try:
        workloads = cast(
            list[Workload],
            list(
                client.workloads.list(
                    all_namespaces=True, field_selector=f"status.clusterQueue={cq.name}"
                )
            ),
        )
    except ApiError:
        return None
    return queue_usage(cq, workloads)
