"""``qmctl apply``, ``delete``, ``get`` and ``describe``: objects by kind and name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer
import yaml

from quartermaster_client.apply import differs, kueue_to_quartermaster
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
from quartermaster_client.cli.shared import (
    EXIT_ERROR,
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
from quartermaster_client.errors import AlreadyExists, ApiError
from quartermaster_client.explain import in_words
from quartermaster_client.kinds import APPLY_ORDER, KINDS, Kind, of_manifest
from quartermaster_client.manifests import Manifest, load
from quartermaster_client.models import ClusterQueue, Event, Resource, Workload
from quartermaster_client.volcano import QueueRefused

commands = typer.Typer()
Output = Annotated[str, typer.Option("-o", "--output", help="table, wide, json, yaml or name.")]


def _complete_kind(incomplete: str) -> list[str]:
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
            return APPLY_ORDER.index(of_manifest(m.api_version, m.kind).kind)
        except KeyError:
            return len(APPLY_ORDER)

    return sorted(manifests, key=rank)


def _where(kind: Kind, ns: str | None) -> str:
    """`` in namespace NS`` for a namespaced object's line, else nothing."""
    return f" in namespace {ns}" if kind.namespaced and ns else ""


# -- apply, delete -----------------------------------------------------------------------


@commands.command(
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

    Multi-document YAML; Kueue manifests (kueue.x-k8s.io/v1beta2) are translated,
    a Volcano Queue (scheduling.volcano.sh/v1beta1) becomes a ClusterQueue
    (docs/volcano.md); Jobs and Workloads are submitted. Applied again, a
    workload is unchanged, or scaled when a serving manifest's replicas alone
    differ; any other change is refused (a workload is immutable)."""
    manifests = _sorted(load(filename, recursive))
    if not manifests:
        raise ValueError("no objects in the given files")
    failures = 0
    with STATE.client() as client:
        for manifest in manifests:
            try:
                _apply_one(client, manifest, namespace)
            except (ApiError, KeyError, QueueRefused, Immutable) as error:
                failures += 1
                reason = error.args[0] if isinstance(error, KeyError) else error
                label = f"{manifest.kind.lower()}/{manifest.name}"
                typer.echo(f"error: {label} ({manifest.source}): {reason}", err=True)
    if failures:
        raise typer.Exit(EXIT_ERROR)


class Immutable(ValueError):
    """A workload applied again with another spec than the one it has."""


def _reapply(
    client: Client, name: str, body: Mapping[str, Any], ns: str | None, kind: Kind
) -> None:
    """A workload that exists, applied again: unchanged; scaled, when a
    serving manifest differs in its replicas alone (as ``kubectl apply`` of
    a Deployment scales it); else refused, since a workload is immutable but
    for its replicas."""
    current = client.get(kind, name, ns)
    assert isinstance(current, Workload)
    stored = current.spec.job
    if stored is None:  # a Workload applied as one
        asked, now = dict(body.get("spec") or {}), current.spec.model_dump(by_alias=True)
        replicas = asked.pop("replicas", None)
    else:
        asked = {**body, "spec": dict(body.get("spec") or {})}
        now = {**stored, "spec": dict(stored.get("spec") or {})}
        replicas = asked["spec"].pop("replicas", None)
        now["spec"].pop("replicas", None)
    where = _where(kind, current.metadata.namespace)
    if differs(asked, now):
        raise Immutable(
            "exists with another spec: a workload is immutable but for its replicas "
            "(qmctl scale); cancel it and submit it again to change it"
        )
    if isinstance(replicas, int) and current.spec.replicas not in (None, replicas):
        answer = client.scale(name, replicas, current.metadata.namespace)
        admitted = (answer.get("status") or {}).get("replicas", 0)
        typer.echo(f"workload/{name} scaled to {replicas} replicas ({admitted} admitted){where}")
        return
    typer.echo(f"workload/{name} unchanged{where}")


def _apply_one(client: Client, manifest: Manifest, namespace: str | None) -> None:
    """Submit a job or Workload, or create or replace any other object; one line says which."""
    kind = of_manifest(manifest.api_version, manifest.kind)
    ns = STATE.namespace(namespace or (manifest.body.get("metadata") or {}).get("namespace"))
    if kind.kind == "Workload":
        body = kueue_to_quartermaster(manifest.body)[0]
        try:
            result = client.submit(body, ns)
        except AlreadyExists:
            _reapply(client, manifest.name, body, ns, kind)
            return
        typer.echo(f"workload/{result.name} created{_where(kind, result.namespace)}")
        return
    applied = client.apply(manifest.body, ns if kind.namespaced else None, kind=kind)
    for note in applied.notes:
        typer.echo(f"warning: {note}", err=True)
    where = _where(kind, applied.object.metadata.namespace)
    typer.echo(f"{kind.kind.lower()}/{applied.object.name} {applied.action}{where}")


@commands.command(
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
            k = of_manifest(manifest.api_version, manifest.kind)
            ns = namespace or (manifest.body.get("metadata") or {}).get("namespace")
            targets.append((k, manifest.name, STATE.namespace(ns) if k.namespaced else None))
    elif kind and names:
        k = kind_named(kind)
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
            typer.echo(f"{k.kind.lower()}/{name} {verb}{_where(k, ns)}")
    if failures:
        raise typer.Exit(EXIT_ERROR)


# -- get, describe -----------------------------------------------------------------------


def _usage_context(client: Client, kind: Kind) -> Context:
    if kind.kind != "ClusterQueue":
        return Context()
    return Context(lambda: list(client.workloads.list(all_namespaces=True)))


def _no_watch(value: bool) -> None:
    """``get -w`` as kubectl knows it: say where watching lives."""
    if value:
        typer.echo(
            "error: qmctl get does not watch; qmctl watch does: "
            "qmctl watch workloads [-n NAMESPACE | -A], or qmctl watch events",
            err=True,
        )
        raise typer.Exit(2)


@commands.command(
    epilog=examples(
        "qmctl get clusterqueues",
        "qmctl get workloads -n team-a -o wide",
        "qmctl get wl -A --field-selector status.state=Pending",
        "qmctl get cq team-a -o yaml",
        "qmctl watch workloads -n team-a             # what kubectl get -w does",
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
    watch: Annotated[
        bool, typer.Option("-w", "--watch", hidden=True, is_eager=True, callback=_no_watch)
    ] = False,
) -> None:
    """List objects of a kind, or show some by name."""
    if output not in OUTPUTS:
        raise typer.BadParameter(f"-o must be one of {', '.join(OUTPUTS)}")
    k = kind_named(kind)
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


@commands.command(
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
    k = kind_named(kind)
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
            usage = queue_usage_of(client, obj)
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
