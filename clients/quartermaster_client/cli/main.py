"""``qmctl``: the Quartermaster command line, in the manner of kubectl."""

from __future__ import annotations

import base64
import functools
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer
import yaml

from quartermaster_client import __version__
from quartermaster_client.apply import kueue_to_quartermaster
from quartermaster_client.cli.render import (
    OUTPUTS,
    Context,
    age,
    as_list,
    render_table,
    table,
    to_json,
    to_yaml,
)
from quartermaster_client.client import Client
from quartermaster_client.config import ConfigFile, resolve
from quartermaster_client.errors import (
    AlreadyExists,
    ApiError,
    ConfigError,
    NotFound,
    QuartermasterError,
    WatchTimeout,
)
from quartermaster_client.explain import QueueUsage, in_words, queue_usage
from quartermaster_client.kinds import APPLY_ORDER, Kind, lookup
from quartermaster_client.ledger import verify_export
from quartermaster_client.manifests import Manifest, load
from quartermaster_client.models import ClusterQueue, Event, Resource, UsageRow, Workload
from quartermaster_client.outcomes import Outcome, outcome, waiting_for

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

app = typer.Typer(
    name="qmctl",
    help="Quartermaster from the command line: apply quotas, submit and watch GPU gangs.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(
    help="Contexts (server, token, namespace) in ~/.config/qmctl/config or $QMCTL_CONFIG.",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")


def examples(*lines: str) -> str:
    """An epilog that keeps one example per line in --help."""
    return "[b]Examples[/b]\n\n" + "\n\n".join(f"  {line}" for line in lines)


@dataclass
class State:
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


Namespace = Annotated[
    str | None, typer.Option("-n", "--namespace", help="Namespace (default: the context's).")
]
AllNamespaces = Annotated[bool, typer.Option("-A", "--all-namespaces", help="Every namespace.")]
Files = Annotated[
    list[str],
    typer.Option("-f", "--filename", help="File, directory or - for stdin; repeatable."),
]
Output = Annotated[str, typer.Option("-o", "--output", help="table, wide, json, yaml or name.")]


def _kind(name: str) -> Kind:
    try:
        return lookup(name)
    except KeyError as error:
        raise typer.BadParameter(str(error.args[0])) from None


def _complete_kind(incomplete: str) -> list[str]:
    from quartermaster_client.kinds import KINDS

    return [k.plural for k in KINDS if k.plural.startswith(incomplete)]


KindArg = Annotated[
    str,
    typer.Argument(
        help="Kind: workloads (wl), clusterqueues (cq), localqueues (lq), resourceflavors (rf), "
        "topologies, cohorts, workloadpriorityclasses (wpc), clusters.",
        autocompletion=_complete_kind,
    ),
]


def _sorted(manifests: list[Manifest]) -> list[Manifest]:
    """Flavors before the queues that name them, queues before workloads."""

    def rank(m: Manifest) -> int:
        try:
            return APPLY_ORDER.index(lookup(m.kind).kind)
        except KeyError:
            return len(APPLY_ORDER)

    return sorted(manifests, key=rank)


def _is_job(manifest: Manifest) -> bool:
    try:
        return lookup(manifest.kind).kind == "Workload"
    except KeyError:
        return True  # Job, JobSet, PyTorchJob, MPIJob: submissions


# -- apply, delete -----------------------------------------------------------------------


@app.command(
    epilog=examples(
        "qmctl apply -f fleet.yaml",
        "qmctl apply -f kueue/ -R            # every *.yaml under kueue/",
        "kubectl get clusterqueues -o yaml | qmctl apply -f -",
    )
)
@handled
def apply(
    filename: Files,
    namespace: Namespace = None,
    recursive: Annotated[
        bool, typer.Option("-R", "--recursive", help="Recurse into dirs.")
    ] = False,
) -> None:
    """Create or replace objects from YAML files.

    Multi-document YAML; Kueue manifests (kueue.x-k8s.io/v1beta2) are translated;
    Jobs and Workloads are submitted."""
    manifests = _sorted(load(filename, recursive))
    if not manifests:
        raise ValueError("no objects in the given files")
    failures = 0
    with STATE.client() as client:
        for manifest in manifests:
            label = f"{manifest.kind.lower()}/{manifest.name}"
            ns = namespace or (manifest.body.get("metadata") or {}).get("namespace")
            try:
                if _is_job(manifest):
                    body = kueue_to_quartermaster(manifest.body)[0]
                    try:
                        result = client.submit(body, STATE.namespace(ns))
                    except AlreadyExists:
                        # Workloads are immutable: cancel and resubmit to change one.
                        typer.echo(f"workload/{manifest.name} unchanged (exists)")
                        continue
                    typer.echo(f"workload/{result.name} created")
                    continue
                kind = lookup(manifest.kind)
                applied = client.apply(
                    manifest.body, STATE.namespace(ns) if kind.namespaced else None
                )
                for note in applied.notes:
                    typer.echo(f"warning: {note}", err=True)
                typer.echo(f"{kind.kind.lower()}/{applied.object.name} {applied.action}")
            except ApiError as error:
                failures += 1
                typer.echo(f"error: {label} ({manifest.source}): {error}", err=True)
    if failures:
        raise typer.Exit(EXIT_ERROR)


@app.command(
    epilog=examples(
        "qmctl delete clusterqueue team-a",
        "qmctl delete workload train-7 -n team-a     # cancels it",
        "qmctl delete -f fleet.yaml",
    )
)
@handled
def delete(
    kind: Annotated[str | None, typer.Argument(help="Kind, as for get.")] = None,
    names: Annotated[list[str] | None, typer.Argument(help="Names.")] = None,
    filename: Annotated[
        list[str] | None, typer.Option("-f", "--filename", help="Delete what these files define.")
    ] = None,
    namespace: Namespace = None,
) -> None:
    """Delete objects (a workload is cancelled)."""
    targets: list[tuple[Kind, str, str | None]] = []
    if filename:
        for manifest in reversed(_sorted(load(filename))):
            k = lookup("Workload") if _is_job(manifest) else lookup(manifest.kind)
            ns = namespace or (manifest.body.get("metadata") or {}).get("namespace")
            targets.append((k, manifest.name, STATE.namespace(ns) if k.namespaced else None))
    elif kind and names:
        k = _kind(kind)
        targets = [(k, n, STATE.namespace(namespace) if k.namespaced else None) for n in names]
    else:
        raise typer.BadParameter("give KIND NAME... or -f FILE")
    failures = 0
    with STATE.client() as client:
        for k, name, ns in targets:
            try:
                client.delete(k, name, ns)
            except ApiError as error:
                failures += 1
                typer.echo(f"error: {k.kind.lower()}/{name}: {error}", err=True)
                continue
            verb = "cancelled" if k.kind == "Workload" else "deleted"
            typer.echo(f"{k.kind.lower()}/{name} {verb}")
    if failures:
        raise typer.Exit(EXIT_ERROR)


# -- get, describe -----------------------------------------------------------------------


def _usage_context(client: Client, kind: Kind) -> Context:
    if kind.kind != "ClusterQueue":
        return Context()
    return Context(lambda: list(client.workloads.list(all_namespaces=True)))


@app.command(
    epilog=examples(
        "qmctl get clusterqueues",
        "qmctl get workloads -n team-a -o wide",
        "qmctl get wl -A --field-selector status.state=Pending",
        "qmctl get cq team-a -o yaml",
    )
)
@handled
def get(
    kind: KindArg,
    names: Annotated[list[str] | None, typer.Argument(help="Names (default: all).")] = None,
    namespace: Namespace = None,
    all_namespaces: AllNamespaces = False,
    output: Output = "table",
    selector: Annotated[
        str | None, typer.Option("-l", "--selector", help="Label selector.")
    ] = None,
    field_selector: Annotated[
        str | None, typer.Option("--field-selector", help="e.g. status.state=Pending")
    ] = None,
) -> None:
    """List objects of a kind, or show some by name."""
    if output not in OUTPUTS:
        raise typer.BadParameter(f"-o must be one of {', '.join(OUTPUTS)}")
    k = _kind(kind)
    ns = STATE.namespace(namespace) if k.namespaced and not all_namespaces else None
    with STATE.client() as client:
        if names:
            items: list[Resource] = [client.get(k, name, ns) for name in names]
        else:
            items = list(
                client.list(
                    k,
                    ns,
                    all_namespaces=all_namespaces,
                    label_selector=selector,
                    field_selector=field_selector,
                )
            )
        if output == "json":
            single = len(items) == 1 and names
            typer.echo(to_json(items[0].to_dict() if single else as_list(k, items)))
        elif output == "yaml":
            single = len(items) == 1 and names
            typer.echo(to_yaml(items[0].to_dict() if single else as_list(k, items)))
        elif output == "name":
            for item in items:
                typer.echo(f"{k.kind.lower()}/{item.name}")
        elif not items:
            where = f" in namespace {ns}" if ns else ""
            typer.echo(f"No {k.plural} found{where}.", err=True)
        else:
            namespaces = k.namespaced and all_namespaces
            context = _usage_context(client, k)
            typer.echo(render_table(k, items, output == "wide", namespaces, context))


def _section(title: str, body: Any) -> str:
    if not body:
        return f"{title}: <none>"
    text = yaml.safe_dump(body, sort_keys=False).rstrip()
    return f"{title}:\n" + "\n".join(f"  {line}" for line in text.splitlines())


def _pairs(values: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in values.items()) or "<none>"


def _events_table(events: list[Event]) -> str:
    rows = [
        [str(e.position), age(e.recorded_at), e.type, str(e.metadata.get("actor", "-"))]
        for e in events
    ]
    return table(["POSITION", "AGE", "TYPE", "BY"], rows)


@app.command(
    epilog=examples(
        "qmctl describe workload train-7 -n team-a",
        "qmctl describe cq team-a",
    )
)
@handled
def describe(kind: KindArg, name: str, namespace: Namespace = None) -> None:
    """Everything about one object.

    Metadata, spec and status; for a workload also why it waits and its events,
    for a ClusterQueue its GPU usage."""
    k = _kind(kind)
    ns = STATE.namespace(namespace) if k.namespaced else None
    with STATE.client() as client:
        obj = client.get(k, name, ns)
        meta = obj.metadata
        lines = [f"Name:         {meta.name}"]
        if meta.namespace:
            lines.append(f"Namespace:    {meta.namespace}")
        lines += [
            f"Kind:         {k.kind}",
            f"Labels:       {_pairs(meta.labels)}",
            f"Annotations:  {_pairs(meta.annotations)}",
            f"Created:      {meta.creation_timestamp} ({age(meta.creation_timestamp)} ago)",
            f"Version:      {meta.resource_version} (generation {meta.generation})",
        ]
        body = obj.to_dict()
        spec = body.get("spec") or {
            key: value
            for key, value in body.items()
            if key not in ("apiVersion", "kind", "metadata")
        }
        if k.kind == "Workload":
            job = spec.get("job") or {}
            spec = {key: value for key, value in spec.items() if key != "job"}
            if job:
                lines.append(f"Job:          {job.get('apiVersion')} {job.get('kind')} (-o yaml)")
        lines.append(_section("Spec", spec))
        if "status" in body:
            lines.append(_section("Status", body["status"]))
        if isinstance(obj, ClusterQueue):
            usage = _queue_usage(client, obj)
            if usage is not None:
                lines.append(
                    f"Usage:        {usage.used}/{usage.nominal} GPUs, {usage.borrowed} borrowed; "
                    f"{usage.pending} pending, {usage.admitted} admitted"
                )
        if k.kind == "Workload" and ns:
            explanation = client.explain(name, ns)
            lines.append("Explain:\n" + "\n".join(f"  {s}" for s in in_words(explanation)))
            events = list(client.events(namespace=ns, workload=name))[-20:]
            lines.append(
                "Events:\n" + "\n".join(f"  {s}" for s in _events_table(events).split("\n"))
            )
    typer.echo("\n".join(lines))


def _queue_usage(client: Client, cq: ClusterQueue) -> QueueUsage | None:
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


# -- workloads ---------------------------------------------------------------------------


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


@app.command(
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

    A Workload or a batch/v1 Job, JobSet, PyTorchJob or MPIJob manifest. With
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


@app.command(
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
            usage = _queue_usage(client, cq) if cq is not None else None
    typer.echo("\n".join(in_words(explanation, usage)))


@app.command(epilog=examples("qmctl cancel train-7 -n team-a", "qmctl cancel a b c"))
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


@app.command(
    "wait",
    epilog=examples(
        "qmctl wait train-7 -n team-a --for state=Running",
        "qmctl wait a b --for state=Admitted,Running --timeout 5m",
        "qmctl wait train-7 --for condition=PodsReady",
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
        typer.Option("--for", help="state=STATE[,STATE...] or condition=TYPE."),
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


@app.command(
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
        k = _kind(what)
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


@app.command(epilog=examples("qmctl whoami"))
@handled
def whoami() -> None:
    """Who the token is: name, roles, namespaces."""
    with STATE.client() as client:
        me = client.whoami()
    typer.echo(
        f"{me.name}  roles={','.join(me.roles)}  namespaces={','.join(me.namespaces) or '-'}"
    )


# -- ledger, usage -----------------------------------------------------------------------

ledger_app = typer.Typer(
    help="The audit ledger: query, export and verify entries; signed checkpoints.",
    no_args_is_help=True,
)
app.add_typer(ledger_app, name="ledger")


def _filters(
    namespace: str | None,
    cluster_queue: str | None,
    local_queue: str | None,
    cluster: str | None,
    workload: str | None,
    actor: str | None,
    flavor: str | None,
    kind: list[str] | None,
    since: str | None,
    until: str | None,
) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "cluster_queue": cluster_queue,
        "local_queue": local_queue,
        "cluster": cluster,
        "workload": workload,
        "actor": actor,
        "flavor": flavor,
        "kind": kind or None,
        "since": since,
        "until": until,
    }


LNamespace = Annotated[str | None, typer.Option("-n", "--namespace", help="Namespace.")]
LClusterQueue = Annotated[str | None, typer.Option("--cluster-queue", help="ClusterQueue.")]
LLocalQueue = Annotated[str | None, typer.Option("--local-queue", help="LocalQueue.")]
LCluster = Annotated[str | None, typer.Option("--cluster", help="Member cluster.")]
LWorkload = Annotated[str | None, typer.Option("--workload", help="Workload name.")]
LActor = Annotated[str | None, typer.Option("--actor", help="Who acted.")]
LFlavor = Annotated[str | None, typer.Option("--flavor", help="ResourceFlavor.")]
LKind = Annotated[
    list[str] | None, typer.Option("--kind", help="Entry kind, e.g. workload.admitted; repeatable.")
]
LSince = Annotated[str | None, typer.Option("--since", help="From (ISO 8601 time).")]
LUntil = Annotated[str | None, typer.Option("--until", help="Until (ISO 8601 time).")]


def _subject(body: dict[str, Any]) -> str:
    name = body.get("workload") or body.get("name") or "-"
    kind = body.get("object_kind") or ("Workload" if body.get("workload") else "")
    where = f"{body['namespace']}/{name}" if body.get("namespace") else str(name)
    return f"{kind}/{where}" if kind else where


@ledger_app.command(
    "query",
    epilog=examples(
        "qmctl ledger query -n team-a --kind workload.admitted",
        "qmctl ledger query --cluster-queue team-a --since 2026-01-01T00:00:00Z -o json",
    ),
)
@handled
def ledger_query(
    namespace: LNamespace = None,
    cluster_queue: LClusterQueue = None,
    local_queue: LLocalQueue = None,
    cluster: LCluster = None,
    workload: LWorkload = None,
    actor: LActor = None,
    flavor: LFlavor = None,
    kind: LKind = None,
    since: LSince = None,
    until: LUntil = None,
    after: Annotated[int | None, typer.Option("--after", help="Entries after this seq.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many.")] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="table, json or yaml.")] = "table",
) -> None:
    """Ledger entries matching the filters, oldest first (auditors)."""
    filters = _filters(
        namespace, cluster_queue, local_queue, cluster, workload, actor, flavor, kind, since, until
    )
    with STATE.client() as client:
        found = []
        for entry in client.ledger_entries(after, **filters):
            found.append(entry)
            if limit is not None and len(found) >= limit:
                break
    if output in ("json", "yaml"):
        data = [e.to_dict() for e in found]
        typer.echo(to_json(data) if output == "json" else to_yaml({"items": data}))
        return
    rows = [
        [
            str(e.seq),
            e.recorded_at[:19].replace("T", " "),
            e.kind,
            _subject(e.body),
            str(e.body.get("actor", "-")),
        ]
        for e in found
    ]
    typer.echo(table(["SEQ", "TIME", "KIND", "OBJECT", "ACTOR"], rows))


@ledger_app.command(
    "export",
    epilog=examples(
        "qmctl ledger export > ledger.ndjson        # then: quartermaster ledger verify",
        "qmctl ledger export --format csv --filtered -n team-a --file team-a.csv",
    ),
)
@handled
def ledger_export(
    format: Annotated[str, typer.Option("--format", help="ndjson or csv.")] = "ndjson",
    file: Annotated[Path | None, typer.Option("--file", help="Write here, not stdout.")] = None,
    filtered: Annotated[
        bool, typer.Option("--filtered", help="Only the entries matching the filters.")
    ] = False,
    namespace: LNamespace = None,
    cluster_queue: LClusterQueue = None,
    local_queue: LLocalQueue = None,
    cluster: LCluster = None,
    workload: LWorkload = None,
    actor: LActor = None,
    flavor: LFlavor = None,
    kind: LKind = None,
    since: LSince = None,
    until: LUntil = None,
) -> None:
    """Export the ledger, streamed, as NDJSON (verifiable offline) or CSV."""
    filters = _filters(
        namespace, cluster_queue, local_queue, cluster, workload, actor, flavor, kind, since, until
    )
    with STATE.client() as client:
        chunks = client.ledger_export(format, filtered, **filters)
        if file is None:
            for chunk in chunks:
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return
        with file.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
    typer.echo(f"wrote {file}", err=True)


@ledger_app.command(
    "checkpoint",
    epilog=examples("qmctl ledger checkpoint", "qmctl ledger checkpoint --publish   # admin"),
)
@handled
def ledger_checkpoint(
    publish: Annotated[bool, typer.Option("--publish", help="Sign one now (admin).")] = False,
) -> None:
    """The latest signed checkpoint of the ledger (tree size and root hash)."""
    with STATE.client() as client:
        note = client.publish_checkpoint() if publish else client.latest_checkpoint()
    typer.echo(note.rstrip("\n"))


@ledger_app.command(
    "verify",
    epilog=examples(
        "qmctl ledger verify --key $LEDGER_KEY        # the live ledger and its latest checkpoint",
        "qmctl ledger verify -f ledger.ndjson --checkpoint cp.txt --key $LEDGER_KEY   # offline",
        "",
        "Exit codes: 0 verified, 8 the ledger does not verify, 1 any other error.",
    ),
)
@handled
def ledger_verify(
    file: Annotated[
        str | None, typer.Option("-f", "--file", help="NDJSON export, or - (default: the server).")
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="Signed checkpoint note (default: the server's latest)."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", envvar="QMCTL_LEDGER_KEY", help="Verifier key name+id+key."),
    ] = None,
) -> None:
    """Check the ledger: every hash, every link, the Merkle root against a signed checkpoint."""
    note = checkpoint.read_text() if checkpoint else None
    if file is not None:
        if file == "-":
            report = verify_export(sys.stdin, note, key)
        else:
            with Path(file).open() as lines:
                report = verify_export(lines, note, key)
    else:
        with STATE.client() as client:
            if note is None:
                try:
                    note = client.latest_checkpoint()
                except NotFound:
                    note = None
            report = verify_export(_lines_of(client.ledger_export()), note, key)
    typer.echo(
        f"{report.entries} entries; head {report.head_hash[:16]}…; "
        f"root {base64.b64encode(report.root_hash).decode()}"
    )
    for seq, reason in report.breaks[:20]:
        typer.echo(f"  seq {seq}: {reason}", err=True)
    if report.checkpoint is None:
        typer.echo("checkpoint: none checked")
    else:
        cp = report.checkpoint
        verdict = "matches" if report.checkpoint_matches else "DOES NOT MATCH"
        typer.echo(f"checkpoint: {cp.origin} size {cp.size}: root {verdict}")
        if report.signature is None:
            typer.echo("signature: not checked (give --key)")
        else:
            typer.echo(f"signature: {'valid' if report.signature else 'INVALID'}")
    if not report.ok:
        typer.echo("the ledger does NOT verify", err=True)
        raise typer.Exit(EXIT_LEDGER_BROKEN)
    typer.echo("verified")


def _lines_of(chunks: Iterator[bytes]) -> Iterator[bytes]:
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from complete
    if buffer:
        yield buffer


@app.command(
    epilog=examples(
        "qmctl usage                                   # GPU-hours per namespace and day",
        "qmctl usage --by cluster_queue --granularity month --chart",
        "qmctl usage --by namespace --by flavor --resource all -o json",
    )
)
@handled
def usage(
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by", help="namespace, local_queue, cluster_queue, cluster, flavor; repeatable."
        ),
    ] = None,
    granularity: Annotated[str, typer.Option("--granularity", help="hour, day, month.")] = "day",
    resource: Annotated[
        str, typer.Option("--resource", help="nvidia.com/gpu, cpu, memory ... or all.")
    ] = "nvidia.com/gpu",
    as_of: Annotated[str | None, typer.Option("--as-of", help="ISO 8601 time.")] = None,
    chart: Annotated[bool, typer.Option("--chart", help="Bars of the total per group.")] = False,
    output: Annotated[str, typer.Option("-o", "--output", help="table, json or yaml.")] = "table",
) -> None:
    """Resource-hours per team and queue from the ledger, as a table or a chart."""
    groups = by or ["namespace"]
    with STATE.client() as client:
        rows = client.usage(granularity, groups, as_of)
    rows = [r for r in rows if resource in ("all", r.resource)]
    if output in ("json", "yaml"):
        data = [r.to_dict() for r in rows]
        typer.echo(to_json(data) if output == "json" else to_yaml({"items": data}))
        return
    if not rows:
        what = "" if resource == "all" else f"{resource} "
        typer.echo(f"No {what}usage recorded yet.", err=True)
        return
    if chart:
        typer.echo(_chart(rows, groups))
        return
    header = ["PERIOD", *(g.upper() for g in groups), "RESOURCE", "HOURS"]
    body = [
        [
            r.period[:16].replace("T", " "),
            *(str(r.group().get(g, "-")) for g in groups),
            r.resource,
            f"{r.hours:,.2f}",
        ]
        for r in rows
    ]
    typer.echo(table(header, body))


def _chart(rows: list[UsageRow], groups: list[str]) -> str:
    totals: dict[str, float] = {}
    for row in rows:
        key = "/".join(str(row.group().get(g, "-")) for g in groups) + f" {row.resource}"
        totals[key] = totals.get(key, 0.0) + row.hours
    width, top = 40, max(totals.values()) or 1.0
    label = max(len(k) for k in totals)
    return "\n".join(
        f"{key.ljust(label)}  {'█' * max(1, round(width * hours / top)):<{width}}  {hours:,.2f} h"
        for key, hours in sorted(totals.items(), key=lambda kv: -kv[1])
    )


# -- config ------------------------------------------------------------------------------


def _config() -> ConfigFile:
    return ConfigFile.load(STATE.config)


@config_app.command(
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


@config_app.command("use-context", epilog=examples("qmctl config use-context prod"))
@handled
def use_context(name: str) -> None:
    """Make a context the current one."""
    config = _config()
    config.use(name)
    config.save()
    typer.echo(f"switched to context {name}")


@config_app.command("get-contexts", epilog=examples("qmctl config get-contexts"))
@handled
def get_contexts() -> None:
    """The contexts, the current one marked with *."""
    config = _config()
    rows = [
        ["*" if c.name == config.current_context else "", c.name, c.server or "", c.namespace or ""]
        for c in config.contexts.values()
    ]
    typer.echo(table(["CURRENT", "NAME", "SERVER", "NAMESPACE"], rows))


@config_app.command("current-context", epilog=examples("qmctl config current-context"))
@handled
def current_context() -> None:
    """The current context's name."""
    config = _config()
    if not config.current_context:
        raise ConfigError(f"no current context in {config.path}")
    typer.echo(config.current_context)


@config_app.command("delete-context", epilog=examples("qmctl config delete-context old"))
@handled
def delete_context(name: str) -> None:
    """Remove a context."""
    config = _config()
    config.delete(name)
    config.save()
    typer.echo(f"deleted context {name}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["app", "main"]
