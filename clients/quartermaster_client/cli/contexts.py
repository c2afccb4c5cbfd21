"""``qmctl config …`` (contexts: server, token, namespace) and ``qmctl whoami``."""

from __future__ import annotations

from typing import Annotated

import typer

from quartermaster_client.cli.render import table
from quartermaster_client.cli.shared import STATE, examples, handled
from quartermaster_client.config import ConfigFile
from quartermaster_client.errors import ConfigError

commands = typer.Typer()
config = typer.Typer(
    help="Contexts (server, token, namespace) in ~/.config/qmctl/config or $QMCTL_CONFIG.",
    no_args_is_help=True,
)


@commands.command(epilog=examples("qmctl whoami"))
@handled
def whoami() -> None:
    """Who the token is: name, roles, namespaces."""
    with STATE.client() as client:
        me = client.whoami()
    typer.echo(
        f"{me.name}  roles={','.join(me.roles)}  namespaces={','.join(me.namespaces) or '-'}"
    )


def _config() -> ConfigFile:
    return ConfigFile.load(STATE.config)


@config.command(
    "set-context",
    epilog=examples(
        "qmctl config set-context local --server http://127.0.0.1:8080 --token $TOKEN --use",
        "qmctl config set-context local --namespace team-a     # change one field",
    ),
)
@handled
def set_context(
    name: str,
    server: Annotated[str | None, typer.Option("--server", help="API URL.")] = None,
    token: Annotated[str | None, typer.Option("--token", help="Bearer token.")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Default ns.")] = None,
    use: Annotated[bool, typer.Option("--use", help="Make it the current context.")] = False,
) -> None:
    """Create a context or change its fields."""
    config = _config()
    config.set_context(name, server, token, namespace)
    if use:
        config.use(name)
    config.save()
    typer.echo(f"context {name} set in {config.path}")


@config.command("use-context", epilog=examples("qmctl config use-context prod"))
@handled
def use_context(name: str) -> None:
    """Make a context the current one."""
    config = _config()
    config.use(name)
    config.save()
    typer.echo(f"switched to context {name}")


@config.command("get-contexts", epilog=examples("qmctl config get-contexts"))
@handled
def get_contexts() -> None:
    """The contexts, the current one marked with *."""
    config = _config()
    rows = [
        ["*" if c.name == config.current_context else "", c.name, c.server or "", c.namespace or ""]
        for c in config.contexts.values()
    ]
    typer.echo(table(["CURRENT", "NAME", "SERVER", "NAMESPACE"], rows))


@config.command("current-context", epilog=examples("qmctl config current-context"))
@handled
def current_context() -> None:
    """The current context's name."""
    config = _config()
    if not config.current_context:
        raise ConfigError(f"no current context in {config.path}")
    typer.echo(config.current_context)


@config.command("delete-context", epilog=examples("qmctl config delete-context old"))
@handled
def delete_context(name: str) -> None:
    """Remove a context."""
    config = _config()
    config.delete(name)
    config.save()
    typer.echo(f"deleted context {name}")
