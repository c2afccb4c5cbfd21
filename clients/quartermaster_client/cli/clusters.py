"""``qmctl cluster from-kubeconfig``: the ``Cluster`` object that registers
a member, from its kubeconfig (or a server, a token and a CA).

Registering a member is then two commands: ``kubectl apply -k
deploy/member`` on it, and this one piped to ``qmctl apply -f -``. The
server and CA come from a kubeconfig context; the credentials from the
workers' token Secret (``--secret``, as ``kubectl get secret -o yaml``
prints it), a token file, or else the context's own user: its token, or —
for a client certificate — a kubeconfig of that one context with every file
inlined. Users of exec plugins and auth providers are refused: the workers
run no plugin. A server URL that carries credentials or a query is refused
as the API refuses it (``spec.server``).
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
import yaml

from quartermaster_client.cli.render import to_json, to_yaml
from quartermaster_client.cli.shared import examples, handled

commands = typer.Typer(
    help="Member clusters: the Cluster object that registers one.", no_args_is_help=True
)

Obj = dict[str, Any]
_CERT_FIELDS = ("client-certificate", "client-key", "certificate-authority")


# -- reading what was given ----------------------------------------------------------------


def _read(path: str) -> str:
    """A file's text; ``-`` is stdin."""
    return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")


def _default_kubeconfig() -> Path:
    configured = os.environ.get("KUBECONFIG", "")
    first = next((p for p in configured.split(os.pathsep) if p), "")
    return Path(first) if first else Path.home() / ".kube" / "config"


def _named(items: Any, name: str, what: str) -> Obj:
    for item in items or ():
        if isinstance(item, Mapping) and item.get("name") == name:
            found = item.get(what)
            return dict(found) if isinstance(found, Mapping) else {}
    raise ValueError(f"the kubeconfig has no {what} named {name!r}")


def _inline(entry: Mapping[str, Any], key: str, base: Path) -> str | None:
    """``key-data`` of a kubeconfig entry, or the file ``key`` names
    (relative to the kubeconfig's folder) as base64."""
    data = entry.get(f"{key}-data")
    if data:
        return str(data)
    path = entry.get(key)
    if path:
        return base64.b64encode((base / str(path)).read_bytes()).decode()
    return None


class Kubeconfig:
    """One context of a kubeconfig: its cluster and its user."""

    def __init__(self, path: Path, context: str | None) -> None:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(config, Mapping):
            raise ValueError(f"{path} is not a kubeconfig")
        self.base = path.parent
        self.context = context or str(config.get("current-context") or "")
        if not self.context:
            raise ValueError(f"{path} has no current-context: give --kube-context")
        ctx = _named(config.get("contexts"), self.context, "context")
        self.cluster_name = str(ctx.get("cluster") or "")
        self.user_name = str(ctx.get("user") or "")
        self.cluster = _named(config.get("clusters"), self.cluster_name, "cluster")
        self.user = _named(config.get("users"), self.user_name, "user") if self.user_name else {}

    def ca(self) -> str | None:
        return _inline(self.cluster, "certificate-authority", self.base)

    def credentials(self) -> tuple[Obj, str]:
        """The user's credentials as a Cluster takes them, and where from."""
        user = self.user
        for plugin in ("exec", "auth-provider"):
            if user.get(plugin):
                raise ValueError(
                    f"user {self.user_name!r} authenticates with an {plugin} plugin, which the "
                    "workers cannot run: give --secret (the workers' token Secret) or --token-file"
                )
        if user.get("token"):
            return {"token": str(user["token"])}, f"the token of user {self.user_name!r}"
        if user.get("tokenFile"):
            token = (self.base / str(user["tokenFile"])).read_text(encoding="utf-8").strip()
            return {"token": token}, f"the token file of user {self.user_name!r}"
        if user.get("client-certificate") or user.get("client-certificate-data"):
            return {"kubeconfig": self._alone()}, f"the client certificate of {self.user_name!r}"
        raise ValueError(
            f"user {self.user_name!r} has no token or client certificate: "
            "give --secret or --token-file"
        )

    def _alone(self) -> str:
        """A kubeconfig of this one context, every file inlined."""
        cluster = {k: v for k, v in self.cluster.items() if k not in _CERT_FIELDS}
        user = {k: v for k, v in self.user.items() if k not in _CERT_FIELDS}
        for key in _CERT_FIELDS:
            source = self.cluster if key == "certificate-authority" else self.user
            value = _inline(source, key, self.base)
            if value:
                (cluster if source is self.cluster else user)[f"{key}-data"] = value
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.cluster_name, "cluster": cluster}],
            "users": [{"name": self.user_name, "user": user}],
            "contexts": [
                {
                    "name": self.context,
                    "context": {"cluster": self.cluster_name, "user": self.user_name},
                }
            ],
            "current-context": self.context,
        }
        return yaml.safe_dump(config, sort_keys=False)


def secret_credentials(text: str) -> tuple[str, str | None, str]:
    """The token and CA (base64 PEM) of a ServiceAccount token Secret, as
    ``kubectl get secret -o yaml`` (or ``-o json``) prints it; and its name."""
    secret = yaml.safe_load(text)
    if not isinstance(secret, Mapping) or secret.get("kind") != "Secret":
        raise ValueError("--secret: not a Secret (kubectl get secret NAME -o yaml)")
    data = secret.get("data") or {}
    meta = secret.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}".strip("/")
    if not data.get("token"):
        raise ValueError(
            f"--secret: Secret {name} has no token yet (is it of type "
            "kubernetes.io/service-account-token, and does its ServiceAccount exist?)"
        )
    token = base64.b64decode(str(data["token"])).decode().strip()
    ca = str(data["ca.crt"]) if data.get("ca.crt") else None
    return token, ca, name


def checked_server(server: str) -> str:
    """``server`` as the API takes it for ``spec.server``."""
    url = urlsplit(server)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError(f"spec.server: {server!r} is not an http(s) URL")
    if url.username is not None or url.password is not None or "@" in url.netloc:
        raise ValueError("spec.server: must not carry credentials (user:password@)")
    if url.query or url.fragment or "?" in server or "#" in server:
        raise ValueError("spec.server: must not carry a query or fragment")
    return server.rstrip("/")


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {pair!r}: expected key=value")
        labels[key] = value
    return labels


def _pem_base64(text: str) -> str:
    """A CA file's PEM as base64, as a kubeconfig and caData hold it."""
    if "BEGIN CERTIFICATE" not in text:
        raise ValueError("--ca-file: no PEM certificate in it")
    return base64.b64encode(text.encode()).decode()


# -- the command ---------------------------------------------------------------------------


@commands.command(
    "from-kubeconfig",
    epilog=examples(
        "kubectl --context east -n quartermaster-system get secret quartermaster-workers-token "
        "-o yaml | qmctl cluster from-kubeconfig --kube-context east --name east-1 --secret - "
        "| qmctl apply -f -",
        "qmctl cluster from-kubeconfig --kube-context east --name east-1 > cluster.yaml",
        "qmctl cluster from-kubeconfig --name east-1 --server https://east.example:6443 "
        "--token-file token --ca-file ca.crt --label region=east",
    ),
)
@handled
def from_kubeconfig(
    name: Annotated[str, typer.Option("--name", help="The Cluster's name at the centre.")],
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."),
    ] = None,
    kube_context: Annotated[
        str | None, typer.Option(help="Its context (default: its current context).")
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="The API server as the workers reach it.")
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(help="The workers' token Secret as kubectl prints it (file, or -)."),
    ] = None,
    token_file: Annotated[
        str | None, typer.Option(help="A file holding the bearer token (or -).")
    ] = None,
    ca_file: Annotated[Path | None, typer.Option(help="The API server's CA (PEM).")] = None,
    insecure_skip_tls_verify: Annotated[
        bool, typer.Option(help="Do not verify the server's certificate (tests only).")
    ] = False,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="key=value; repeatable.")
    ] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="yaml or json.")] = "yaml",
) -> None:
    """Print the Cluster object that registers a member cluster.

    Pipe it to `qmctl apply -f -`, or write it to a file and apply that (it
    holds the token in clear: delete the file afterwards)."""
    if output not in ("yaml", "json"):
        raise ValueError(f"-o {output}: expected yaml or json")
    explicit = server is not None and (secret or token_file)
    config = None
    if kubeconfig is not None or kube_context is not None or not explicit:
        config = Kubeconfig(kubeconfig or _default_kubeconfig(), kube_context)
    url = server or (str(config.cluster.get("server") or "") if config else "")
    if not url:
        raise ValueError("spec.server: the context's cluster names no server: give --server")
    ca = config.ca() if config else None
    credentials: Obj
    if secret is not None:
        token, secret_ca, secret_name = secret_credentials(_read(secret))
        credentials, source, ca = {"token": token}, f"the Secret {secret_name}", secret_ca or ca
    elif token_file is not None:
        credentials, source = {"token": _read(token_file).strip()}, "the token file"
    else:
        assert config is not None  # read above: neither --secret nor --token-file was given
        credentials, source = config.credentials()
    if not any(credentials.values()):
        raise ValueError("spec.credentials: the token is empty")
    if ca_file is not None:
        ca = _pem_base64(ca_file.read_text(encoding="utf-8"))
    spec: Obj = {"server": checked_server(url)}
    skip = insecure_skip_tls_verify or bool(
        config and config.cluster.get("insecure-skip-tls-verify")
    )
    if skip:
        spec["insecureSkipTLSVerify"] = True
    elif ca:
        spec["caData"] = ca
    spec["credentials"] = credentials
    metadata: Obj = {"name": name}
    if label:
        metadata["labels"] = _labels(label)
    cluster = {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Cluster",
        "metadata": metadata,
        "spec": spec,
    }
    typer.echo(to_json(cluster) if output == "json" else to_yaml(cluster))
    where = f"context {config.context}" if config else "the options"
    typer.echo(f"cluster/{name}: {spec['server']} from {where}, with {source}", err=True)


__all__ = ["Kubeconfig", "checked_server", "commands", "secret_credentials"]
