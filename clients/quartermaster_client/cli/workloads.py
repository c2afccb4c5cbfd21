"""``qmctl submit``, ``explain``, ``cancel``, ``wait`` and ``watch``: a team's workloads."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Annotated, cast

import typer

from quartermaster_client.apply import kueue_to_quartermaster
from quartermaster_client.cli.render import Context, render_table, to_json, to_yaml
from quartermaster_client.cli.shared import (
    EXIT_CODES,
    EXIT_TIMEOUT,
    STATE,
    AllNamespaces,
    Files,
    Namespace,
    examples,
    handled,
    kind_named,
    queue_usage_of,
)
from quartermaster_client.client import Client
from quartermaster_client.errors import ApiError, WatchTimeout
from quartermaster_client.explain import in_words
from quartermaster_client.kinds import Kind
from quartermaster_client.manifests import load
from quartermaster_client.models import ClusterQueue, Event, Workload
from quartermaster_client.outcomes import outcome, waiting_for

commands = typer.Typer()


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``5m``, ``1h30m``, ``1.5h``."""
    total, rest = 0.0, text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", rest):
        return float(rest)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", rest)
    if not parts or "".join(n + u for n, u in parts) != rest:
        raise typer.BadParameter(f"{text!r} is not a duration such as 90s, 5m or 1h30m")
    for number, unit in parts:
        total += float(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    return total


@commands.command(
    epilog=examples(
        "qmctl submit -f job.yaml -n team-a",
        "qmctl submit -f pytorchjob.yaml --wait --timeout 2h   # exit code says how it ended",
        "cat workload.yaml | qmctl submit -f -",
        "",
        "Exit codes with --wait: 0 succeeded, 3 failed, 4 preempted for good, "
        "5 timed out, 6 cancelled, 1 any other error.",
    )
)
@handled
def submit(
    filename: Files,
    namespace: Namespace = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it finishes.")] = False,
    timeout: Annotated[
        str | None, typer.Option("--timeout", help="With --wait: give up after, e.g. 30m.")
    ] = None,
    poll: Annotated[float, typer.Option("--poll", help="Seconds between checks.", hidden=True)] = (
        2.0
    ),
    output: Annotated[str, typer.Option("-o", "--output", help="text, json or yaml.")] = "text",
) -> None:
    """Submit a job and optionally wait for it to finish.

    A Workload or a job manifest: batch/v1 Job, JobSet, PyTorchJob, MPIJob,
    RayJob, RayCluster, Deployment, StatefulSet, LeaderWorkerSet or a Volcano
    Job (batch.volcano.sh/v1alpha1). With
    --wait it is a step in a pipeline (Argo, Temporal, CI): the exit code says
    how it ended."""
    manifests = load(filename)
    if not manifests:
        raise ValueError("no objects in the given files")
    limit = duration(timeout) if timeout else None
    with STATE.client() as client:
        submitted: list[Workload] = []
        for manifest in manifests:
            ns = namespace or (manifest.body.get("metadata") or {}).get("namespace")
            body = kueue_to_quartermaster(manifest.body)[0]
            workload = client.submit(body, STATE.namespace(ns))
            submitted.append(workload)
            if output == "text":
                typer.echo(
                    f"workload/{workload.name} submitted to {workload.namespace}"
                    f" (ClusterQueue {workload.status.cluster_queue}, {workload.status.state})"
                )
            else:
                data = workload.to_dict()
                typer.echo(to_json(data) if output == "json" else to_yaml(data))
        if not wait:
            return
        code = 0
        deadline = None if limit is None else time.monotonic() + limit
        for workload in submitted:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                final = client.wait(workload.name, workload.namespace, timeout=left, poll=poll)
            except WatchTimeout as error:
                typer.echo(f"timed out: {error}", err=True)
                raise typer.Exit(EXIT_TIMEOUT) from None
            ended = outcome(final)
            assert ended is not None
            finished = final.status.condition("Finished")
            why = f": {finished.message}" if finished and finished.message else ""
            typer.echo(f"workload/{final.name} {ended.value}{why}")
            code = code or EXIT_CODES[ended]
    raise typer.Exit(code)


@commands.command(
    epilog=examples("qmctl explain train-7 -n team-a"),
)
@handled
def explain(name: str, namespace: Namespace = None) -> None:
    """Why a workload waits, or where it runs, in words."""
    ns = STATE.namespace(namespace)
    with STATE.client() as client:
        explanation = client.explain(name, ns)
        usage = None
        if explanation.cluster_queue:
            try:
                cq = cast(ClusterQueue, client.get("ClusterQueue", explanation.cluster_queue))
            except ApiError:
                cq = None
            usage = queue_usage_of(client, cq) if cq is not None else None
    typer.echo("\n".join(in_words(explanation, usage)))


@commands.command(epilog=examples("qmctl cancel train-7 -n team-a", "qmctl cancel a b c"))
@handled
def cancel(
    names: Annotated[list[str], typer.Argument(help="Workloads.")], namespace: Namespace = None
) -> None:
    """Cancel workloads: a pending one is dropped, an admitted one evicted."""
    ns = STATE.namespace(namespace)
    with STATE.client() as client:
        for name in names:
            workload = client.cancel(name, ns)
            typer.echo(f"workload/{workload.name} {workload.status.state.lower()}")


@commands.command(epilog=examples("qmctl scale llama-8b --replicas 5 -n serve"))
@handled
def scale(
    name: Annotated[str, typer.Argument(help="A serving workload.")],
    replicas: Annotated[int, typer.Option("--replicas", help="Replicas to ask for.")],
    namespace: Namespace = None,
) -> None:
    """Scale a serving workload: admission asks for the new replicas only."""
    ns = STATE.namespace(namespace)
    with STATE.client() as client:
        answer = client.scale(name, replicas, ns)
    admitted = (answer.get("status") or {}).get("replicas", 0)
    typer.echo(f"workload/{name} scaled to {replicas} replicas ({admitted} admitted)")


@commands.command(
    "wait",
    epilog=examples(
        "qmctl wait train-7 -n team-a --for state=Running",
        "qmctl wait a b --for state=Admitted,Running --timeout 5m",
        "qmctl wait train-7 --for condition=PodsReady",
        "qmctl wait llama-8b -n serve --for replicas=5   # a serving workload's admitted replicas",
        "",
        "Exit codes: 0 every workload got there, 5 timed out; a workload that ended "
        "first exits as submit --wait does (3 failed, 4 preempted for good, 6 cancelled).",
    ),
)
@handled
def wait_for(
    names: Annotated[list[str], typer.Argument(help="Workloads.")],
    for_: Annotated[
        str,
        typer.Option("--for", help="state=STATE[,STATE...], condition=TYPE or replicas=N."),
    ],
    namespace: Namespace = None,
    timeout: Annotated[str, typer.Option("--timeout", help="Give up after, e.g. 90s.")] = "5m",
    poll: Annotated[float, typer.Option("--poll", help="Seconds between checks.", hidden=True)] = (
        2.0
    ),
) -> None:
    """Wait until workloads reach a state or condition, as kubectl wait does."""
    try:
        until = waiting_for(for_)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--for") from None
    ns = STATE.namespace(namespace)
    deadline = time.monotonic() + duration(timeout)

    def there_or_ended(workload: Workload) -> bool:
        return until(workload) or outcome(workload) is not None

    with STATE.client() as client:
        for name in names:
            left = max(0.0, deadline - time.monotonic())
            try:
                got = client.wait(name, ns, timeout=left, poll=poll, until=there_or_ended)
            except WatchTimeout as error:
                typer.echo(f"timed out: {error}", err=True)
                raise typer.Exit(EXIT_TIMEOUT) from None
            ended = outcome(got)
            if not until(got) and ended is not None:
                typer.echo(f"workload/{got.name} {ended.value} before {for_}", err=True)
                raise typer.Exit(EXIT_CODES[ended])
            typer.echo(f"workload/{got.name} {got.status.state}")


def _events_line(event: Event) -> str:
    at = (event.recorded_at or "")[:19].replace("T", " ")
    state = (event.data.get("status") or {}).get("state", "") if event.data else ""
    return f"{event.position:>8}  {at}  {event.type:<22} {event.subject}  {state}".rstrip()


@commands.command(
    epilog=examples(
        "qmctl watch                      # workloads of the context's namespace",
        "qmctl watch workloads -A",
        "qmctl watch events -n team-a --since 0",
        "qmctl watch events --timeout 5m",
    )
)
@handled
def watch(
    what: Annotated[str, typer.Argument(help="workloads or events.")] = "workloads",
    namespace: Namespace = None,
    all_namespaces: AllNamespaces = False,
    timeout: Annotated[str | None, typer.Option("--timeout", help="Stop after, e.g. 10m.")] = None,
    since: Annotated[
        int | None, typer.Option("--since", help="Events after this position (default: now).")
    ] = None,
) -> None:
    """A live table of workloads, or the stream of events, as they change."""
    ns = None if all_namespaces else STATE.namespace(namespace)
    limit = duration(timeout) if timeout else None
    with STATE.client() as client:
        if what == "events":
            typer.echo(f"{'POSITION':>8}  {'TIME':<19}  {'TYPE':<22} OBJECT  STATE")
            for event in client.watch(since, namespace=ns, timeout=limit):
                typer.echo(_events_line(event))
            return
        k = kind_named(what)
        if k.kind != "Workload":
            raise typer.BadParameter("watch shows workloads or events")
        _live_workloads(client, k, ns, since, limit)


def _live_workloads(
    client: Client, k: Kind, ns: str | None, since: int | None, limit: float | None
) -> None:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    def snapshot() -> str:
        items = list(client.list(k, ns, all_namespaces=ns is None))
        if not items:
            return f"No workloads{' in ' + ns if ns else ''} yet."
        return render_table(k, items, False, ns is None, Context())

    console = Console()
    position = client.head() if since is None else since
    if not console.is_terminal:
        typer.echo(snapshot())
        for event in client.watch(position, namespace=ns, kind="Workload", timeout=limit):
            typer.echo(_events_line(event))
        return
    with Live(Text(snapshot()), console=console, auto_refresh=False) as live:
        for _ in _events(client, position, ns, limit):
            live.update(Text(snapshot()), refresh=True)


def _events(client: Client, position: int, ns: str | None, limit: float | None) -> Iterator[Event]:
    yield from client.watch(position, namespace=ns, kind="Workload", timeout=limit)
