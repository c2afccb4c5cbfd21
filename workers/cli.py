"""``quartermaster worker`` and ``quartermaster scheduler``.

A typer app of its own, mounted on the server CLI by the entry point (the
service may not import the workers); ``python -m workers.cli`` runs it alone.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
from typing import Annotated, Any

import typer

app = typer.Typer(help="Quartermaster's background processes.", no_args_is_help=True)


def _database_url() -> str:
    from workers.settings import get_worker_settings

    url = get_worker_settings().database_url
    if not url:
        typer.echo("QM_DATABASE_URL is not set", err=True)
        raise typer.Exit(2)
    return url


#: Allocations between young-generation collections (CPython's default: 700).
GC_THRESHOLD = (50_000, 20, 20)


def quiet_gc() -> None:
    """Collect garbage less often, and never scan what start-up made.

    A pass decodes thousands of JSON containers and the admission cycle
    keeps every live workload in memory; with CPython's default thresholds
    the collector ran every 700 allocations and rescanned all of that over
    and over (it showed up as the cost of whatever line allocated next).
    Our data is acyclic, so reference counting frees it; the collector is
    only a backstop. ``gc.freeze`` leaves the imported modules (the
    ``kubernetes`` client alone is hundreds of thousands of objects) out of
    every scan, and in a Celery worker it is done before the pool forks."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(help="Pool processes.")] = 2,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
) -> None:
    """A Celery worker: outbox consumers (QM_BROKER_URL, QM_DATABASE_URL)."""
    _database_url()
    import workers.tasks  # noqa: F401  (its imports, before the freeze and the fork)
    from workers.celery_app import QUEUE
    from workers.celery_app import app as celery

    quiet_gc()

    celery.worker_main(
        [
            "worker",
            f"--loglevel={loglevel}",
            f"--concurrency={concurrency}",
            f"--queues={QUEUE}",
            "--without-gossip",
            "--without-mingle",
        ]
    )


@app.command()
def scheduler(
    relay: Annotated[bool, typer.Option(help="Also relay the outbox.")] = True,
    metrics_port: Annotated[
        int, typer.Option(help="Serve Prometheus /metrics on this port (0: off).")
    ] = 9101,
) -> None:
    """The outbox relay and the admission cycle (one leader among replicas)."""
    from service.app.bootstrap import make_engine
    from workers.jsonio import postgres_json
    from workers.scheduler import Scheduler
    from workers.settings import get_worker_settings
    from workers.tasks import sender

    postgres_json()
    quiet_gc()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    engine = make_engine(_database_url(), pool_size=4)
    runner = Scheduler(engine, get_worker_settings(), sender(), relay=relay)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, registry=runner.metrics.registry)

    def stop(signum: int, frame: Any) -> None:
        runner.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        runner.run()
    finally:
        engine.dispose()


@app.command("fence-agent")
def fence_agent(
    kubeconfig: Annotated[
        str | None,
        typer.Option(help="Kubeconfig of the member (unset: the pod's service account)."),
    ] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context.")] = None,
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between reads of the centre's heartbeat.")
    ] = 10.0,
    namespace: Annotated[str, typer.Option(help="Namespace of the heartbeat Leases.")] = (
        "quartermaster-system"
    ),
    identity: Annotated[
        str, typer.Option(envvar="POD_NAME", help="Who holds the agent's Lease.")
    ] = "fence-agent",
) -> None:
    """Runs in a member cluster: stops Quartermaster's jobs there when the
    centre's heartbeat is older than its fence time (docs/fencing.md)."""
    import kubernetes

    from workers.fence import FenceAgent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config: Any = kubernetes.config  # untyped library
    api: Any
    if kubeconfig is None:
        config.load_incluster_config()
        api = kubernetes.client.ApiClient()
    else:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)
    agent = FenceAgent(api, poll=poll_interval, identity=identity, namespace=namespace)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    typer.echo(f"fence agent polling every {poll_interval:g} s", err=True)
    try:
        agent.run(stop)
    finally:
        api.close()


def main() -> None:
    """The whole server CLI: ``quartermaster`` with ``worker`` and ``scheduler``
    and the simulator's ``sim`` mounted (the entry point points here; the
    service imports neither the workers nor sim)."""
    from service.cli import app as server
    from service.cli import main as server_main
    from sim.cli import app as sim_app

    server.add_typer(app)
    server.add_typer(sim_app, name="sim")
    server_main()


if __name__ == "__main__":
    app()
