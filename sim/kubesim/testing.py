"""Pytest-friendly helpers: start simulated clusters on ephemeral ports, get clients.

>>> with running_cluster("sim/fleets/demo.yaml", name="east-1", seed_kueue=True) as c:
...     v1 = kubernetes.client.CoreV1Api(c.api_client())
...     v1.list_node()

Everything is torn down on exit: servers stopped, the event-loop thread
joined, the kubeconfig and CA files (in a private temp dir) removed. Several
clusters share one loop thread (:func:`running_clusters`), like the member
clusters of one fleet, and one kubeconfig with a context per cluster.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes

from sim.kubesim.auth import AuditRecord
from sim.kubesim.cluster import ClusterOptions, SimCluster
from sim.kubesim.server import ClusterServer, ServerThread, kubeconfig, make_tls, write_kubeconfig

__all__ = ["RunningCluster", "running_cluster", "running_clusters"]

_T = TypeVar("_T")


@dataclass(slots=True)
class RunningCluster:
    """A served cluster: where it is, how to authenticate, and chaos controls."""

    name: str
    url: str
    admin_url: str
    token: str
    admin_token: str
    kubeconfig: Path
    context: str
    ca_file: Path | None
    cluster: SimCluster
    server: ClusterServer
    thread: ServerThread

    def configuration(self, token: str | None = None) -> kubernetes.client.Configuration:
        config = kubernetes.client.Configuration()
        config.host = self.url
        config.api_key = {"authorization": f"Bearer {token or self.token}"}
        if self.ca_file is not None:
            config.ssl_ca_cert = str(self.ca_file)
        return config

    def api_client(self, token: str | None = None) -> kubernetes.client.ApiClient:
        """An official-client ApiClient for this cluster (close it, or use ``with``)."""
        return kubernetes.client.ApiClient(self.configuration(token))

    def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """Call ``function(*args)`` on the server loop (safe access to ``cluster`` state)."""
        return self.thread.run(function, *args)

    def add_user(self, name: str, rules: Sequence[dict[str, Any]] | None = None) -> str:
        """A bearer token for ``name`` limited to RBAC-style ``rules`` (``None``: everything)."""
        return self.run(lambda: self.cluster.add_user(name, rules))

    def used_rules(self, user: str | None = None) -> list[dict[str, Any]]:
        """What ``user`` actually did, as RBAC rules (compare with a ClusterRole)."""
        return self.run(self.cluster.auth.used_rules, user)

    def set_rules(self, name: str, rules: Sequence[dict[str, Any]] | None) -> None:
        """Give user ``name`` these rules from its next request on (``None``: everything)."""
        self.run(self.cluster.auth.set_rules, name, rules)

    def audit(self, user: str | None = None) -> list[AuditRecord]:
        """The authorization decisions made so far (refusals: code 403)."""
        return self.run(self.cluster.auth.records, user)

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """``latencyMs``, ``jitterMs``, ``errorRate``, ``errorCode``, ``verbs``, ``resources``."""

        def update() -> dict[str, Any]:
            self.cluster.faults.update(changes)
            return self.cluster.faults.as_dict()

        return self.run(update)

    def clear_faults(self) -> None:
        self.run(self.cluster.faults.reset)

    def partition(self, seconds: float | None = None, mode: str = "refuse") -> None:
        self.run(self.server.partition, seconds, mode)

    def heal(self) -> None:
        self.run(self.server.heal)

    def set_node_ready(self, node: str, ready: bool) -> None:
        self.run(self.cluster.set_node_ready, node, ready)

    def fail_pod(
        self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error"
    ) -> None:
        self.run(self.cluster.fail_pod, namespace, name, exit_code, reason, "injected failure")

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Read an object straight from the store (no HTTP)."""

        def read() -> dict[str, Any] | None:
            resource = self.cluster.core.for_kind(api_version, kind)
            return self.cluster.store.get(resource.rtype, namespace, name)

        return self.run(read)


@contextmanager
def running_clusters(
    fleet: str | Path | None = None,
    names: Sequence[str] = ("kubesim",),
    *,
    tls: bool = True,
    time_scale: float = 0.01,
    seed_kueue: bool = False,
    controllers: bool = True,
    history_size: int = 10_000,
    bookmark_interval: float = 1.0,
    default_field_validation: str = "Warn",
    crds_dir: Path | None = None,
    extra_objects: Sequence[dict[str, Any]] = (),
    event_ttl: float = 3600.0,
    backend: str | None = None,
) -> Iterator[list[RunningCluster]]:
    """Serve one cluster per name (fleet clusters of that name supply Nodes; ``backend``
    ``volcano`` or ``kueue`` overrides the fleet cluster's own)."""
    workdir = Path(tempfile.mkdtemp(prefix="kubesim-"))
    thread = ServerThread()
    servers: list[ClusterServer] = []
    try:
        tls_material = make_tls() if tls else None
        ca_file = None
        if tls_material is not None:
            ca_file = workdir / "ca.crt"
            ca_file.write_bytes(tls_material.ca_pem)
        handles = []
        for name in names:
            options = ClusterOptions(
                name=name,
                fleet=fleet,
                seed_kueue=seed_kueue,
                crds_dir=crds_dir,
                history_size=history_size,
                time_scale=time_scale,
                bookmark_interval=bookmark_interval,
                default_field_validation=default_field_validation,
                controllers=controllers,
                extra_objects=list(extra_objects),
                event_ttl=event_ttl,
                backend=backend,
            )
            cluster = thread.run(SimCluster, options)
            token = thread.run(lambda c=cluster: c.add_user("admin", None))
            admin_token = thread.run(
                lambda c=cluster: c.add_user("kubesim-admin", None, admin=True)
            )
            server = thread.run(lambda c=cluster: ClusterServer(c, tls=tls_material))
            thread.call(server.start())
            servers.append(server)
            handles.append((name, cluster, server, token, admin_token))
        config_path = workdir / "kubeconfig"
        ca_pem = tls_material.ca_pem if tls_material else None
        write_kubeconfig(
            config_path, kubeconfig((name, s.url, t, ca_pem) for name, _, s, t, _ in handles)
        )
        yield [
            RunningCluster(
                name=name,
                url=server.url,
                admin_url=server.admin_url,
                token=token,
                admin_token=admin_token,
                kubeconfig=config_path,
                context=name,
                ca_file=ca_file,
                cluster=cluster,
                server=server,
                thread=thread,
            )
            for name, cluster, server, token, admin_token in handles
        ]
    finally:
        for server in servers:
            thread.call(server.stop())
        thread.close()
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def running_cluster(
    fleet: str | Path | None = None, *, name: str = "kubesim", **options: Any
) -> Iterator[RunningCluster]:
    """One served cluster; see :func:`running_clusters` for the options."""
    with running_clusters(fleet, (name,), **options) as clusters:
        yield clusters[0]
