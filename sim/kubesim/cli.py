"""``quartermaster sim cluster``: serve simulated member clusters until interrupted."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from pathlib import Path
from typing import Annotated

import typer

from sim.kubesim.cluster import ClusterOptions, SimCluster
from sim.kubesim.server import (
    ClusterServer,
    kubeconfig,
    make_tls,
    settle_heap,
    write_kubeconfig,
)

__all__ = ["register"]


def _fleet_labels(fleet: Path) -> dict[str, dict[str, str]]:
    from sim.fleet import load_fleet

    return {spec.cluster.name: dict(spec.cluster.labels) for spec in load_fleet(fleet).clusters}


def _cluster_names(fleet: Path, names: list[str], count: int | None) -> list[str]:
    available = list(_fleet_labels(fleet))
    if names:
        unknown = [n for n in names if n not in available]
        if unknown:
            raise typer.BadParameter(
                f"not in the fleet: {', '.join(unknown)}", param_hint="--cluster"
            )
        return names
    wanted = count or 1
    if wanted > len(available):
        raise typer.BadParameter(
            f"the fleet has {len(available)} cluster(s), {wanted} requested", param_hint="--count"
        )
    return available[:wanted]


async def _serve(
    names: list[str],
    options: ClusterOptions,
    host: str,
    port: int,
    admin_port: int,
    tls: bool,
    kubeconfig_out: Path,
    labels: dict[str, dict[str, str]],
) -> None:
    material = make_tls((host, "localhost", "127.0.0.1")) if tls else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    servers: list[tuple[str, ClusterServer, str, str]] = []
    try:
        for index, name in enumerate(names):
            cluster = SimCluster(dataclasses.replace(options, name=name))
            token = cluster.add_user("admin")
            admin_token = cluster.add_user("kubesim-admin", admin=True)
            try:
                server = ClusterServer(
                    cluster,
                    host=host,
                    port=port + index if port else 0,
                    admin_port=admin_port + index if admin_port else 0,
                    tls=material,
                )
            except OSError as error:
                raise _Unservable(f"cluster {name}: cannot listen on {host}: {error}") from None
            await server.start()
            servers.append((name, server, token, admin_token))
            typer.echo(
                json.dumps(
                    {
                        "cluster": name,
                        "backend": cluster.backend,
                        "server": server.url,
                        "admin": server.admin_url,
                        "adminToken": admin_token,
                        "nodes": len(cluster.store.collections["nodes"].objects),
                    }
                )
            )
        settle_heap()
        ca = material.ca_pem if material else None
        entries = ((n, s.url, t, ca) for n, s, t, _ in servers)
        write_kubeconfig(kubeconfig_out, kubeconfig(entries, labels=labels))
        typer.echo(f"kubeconfig written to {kubeconfig_out}")
        await stop.wait()
    finally:
        for _, server, _, _ in servers:
            await server.stop()


class _Unservable(Exception):
    """A cluster could not be served (its port is taken); reported without a traceback."""


def cluster(
    fleet: Annotated[Path, typer.Option(help="Fleet file whose clusters' Nodes are served.")],
    kubeconfig_out: Annotated[Path, typer.Option(help="Where to write the kubeconfig.")],
    port: Annotated[
        int, typer.Option(help="API port of the first cluster (next ones follow).")
    ] = 6443,
    count: Annotated[int | None, typer.Option(help="Serve the fleet's first N clusters.")] = None,
    cluster_name: Annotated[
        list[str], typer.Option("--cluster", help="Serve these fleet clusters (repeatable).")
    ] = [],  # noqa: B006 - typer needs a literal default
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    admin_port: Annotated[int, typer.Option(help="Admin port of the first cluster (0: any).")] = 0,
    tls: Annotated[bool, typer.Option(help="Serve HTTPS with a generated CA.")] = True,
    time_scale: Annotated[float, typer.Option(help="Multiplier for simulated durations.")] = 1.0,
    seed_kueue: Annotated[
        bool,
        typer.Option(
            help="Also create the fleet's namespaces and Kueue objects (Volcano members: "
            "namespaces only)."
        ),
    ] = False,
    crds_dir: Annotated[
        Path | None,
        typer.Option(
            help="Kueue CRD directory (default $QM_KUEUE_CRDS_DIR or ../shared/kueue-crds)."
        ),
    ] = None,
    controllers: Annotated[
        bool,
        typer.Option(
            help="Run the scheduler, kubelet and the Kueue (or, for a fleet cluster with "
            "backend: volcano, Volcano) loop."
        ),
    ] = True,
    event_ttl: Annotated[
        float, typer.Option(help="Seconds an Event is kept after it last occurred.")
    ] = 3600.0,
) -> None:
    """Serve simulated member clusters (Kubernetes API + Kueue-like admission) until Ctrl-C."""
    names = _cluster_names(fleet, list(cluster_name), count)
    options = ClusterOptions(
        fleet=fleet,
        seed_kueue=seed_kueue,
        crds_dir=crds_dir,
        time_scale=time_scale,
        controllers=controllers,
        event_ttl=event_ttl,
    )
    try:
        labels = _fleet_labels(fleet)
        asyncio.run(_serve(names, options, host, port, admin_port, tls, kubeconfig_out, labels))
    except _Unservable as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    """Add ``cluster`` to the ``quartermaster sim`` command group."""
    app.command("cluster")(cluster)
