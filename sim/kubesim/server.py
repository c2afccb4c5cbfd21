"""Serving simulated clusters over TCP: uvicorn, TLS, partitions, kubeconfigs.

Each cluster listens on two sockets: the API port (optionally TLS, self-signed
CA generated at start-up and handed to clients through the kubeconfig's
``certificate-authority-data``) and an admin port that a partition never
touches, so a chaos test can always heal what it broke. A *refuse* partition
closes the API listening socket and drops its open connections (clients get
``ECONNREFUSED``); a *blackhole* partition keeps accepting but holds every
request until healed (clients time out).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import gc
import ipaddress
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sim.kubesim.cluster import SimCluster
from sim.kubesim.http import KubeApp

__all__ = [
    "ClusterServer",
    "ServerThread",
    "TlsMaterial",
    "kubeconfig",
    "listen_socket",
    "make_tls",
]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def context(self) -> ssl.SSLContext:
        """A server context; the PEMs pass through a private temp dir that is removed at once."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="kubesim-tls-") as directory:
            cert, key = Path(directory, "tls.crt"), Path(directory, "tls.key")
            cert.write_bytes(self.cert_pem + self.ca_pem)
            key.write_bytes(self.key_pem)
            os.chmod(key, 0o600)
            context.load_cert_chain(cert, key)
        return context


def make_tls(hosts: Iterable[str] = ("127.0.0.1", "localhost")) -> TlsMaterial:
    """A throw-away CA and a server certificate for ``hosts`` signed by it."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubesim-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return TlsMaterial(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


#: A young-generation collection every 10,000 allocations, not 700.
_GC_THRESHOLDS = (10_000, 10, 10)


def settle_heap() -> None:
    """Tune the cyclic garbage collector of a process that serves stand-ins.

    Every write allocates a few hundred containers (the new object, its managedFields)
    that then live on in the watch history, so with the default thresholds a collection
    ran every few requests and a full one kept re-scanning the CRD schemas and the
    history: a large share of the CPU under e2e-like load. Objects alive once the clusters are
    up (schemas, modules) are frozen out of every later collection, and young
    collections run less often; JSON data holds no reference cycles, so this only
    delays the reclaiming of the few cycles the event loop makes.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)


def listen_socket(host: str, port: int) -> socket.socket:
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says so, and without it Nagle + delayed ACK add 40 ms to every answer.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class ClusterServer:
    """Serves one :class:`SimCluster` on an API port and an admin port, in the running loop."""

    def __init__(
        self,
        cluster: SimCluster,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_port: int = 0,
        tls: TlsMaterial | None = None,
    ) -> None:
        self.cluster = cluster
        self.host = host
        self.tls = tls
        self._api_socket = listen_socket(host, port)
        self._admin_socket = listen_socket(host, admin_port)
        self.port = self._api_socket.getsockname()[1]
        self.admin_port = self._admin_socket.getsockname()[1]
        cluster.address = f"{host}:{self.port}"
        self._ssl = tls.context() if tls else None
        self._api: uvicorn.Server | None = None
        self._admin: uvicorn.Server | None = None
        self._partition_timer: asyncio.TimerHandle | None = None
        self.partitioned = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def _config(self, app: Any, tls: bool) -> uvicorn.Config:
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http="httptools",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=30,
        )
        config.load()
        config.ssl = self._ssl if tls else None
        return config

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.cluster.start(self._loop)
        self.cluster.partition_hook = self.partition
        self.cluster.heal_hook = self.heal
        self._api = uvicorn.Server(self._config(KubeApp(self.cluster), tls=self.tls is not None))
        self._admin = uvicorn.Server(
            self._config(KubeApp(self.cluster, admin_only=True), tls=False)
        )
        for server, sock in ((self._api, self._api_socket), (self._admin, self._admin_socket)):
            server.lifespan = server.config.lifespan_class(server.config)  # set by serve() normally
            await server.startup(sockets=[sock])

    async def stop(self) -> None:
        if self._partition_timer:
            self._partition_timer.cancel()
        self.cluster.stop()
        for server in (self._api, self._admin):
            if server is not None and server.started:
                server.should_exit = True
                # Idle keep-alive connections would hold shutdown for its whole grace period
                # (a TLS close waits for the peer's close_notify): a stopping cluster drops them.
                _drop_connections(server)
                await server.shutdown()
        for sock in (self._api_socket, self._admin_socket):
            sock.close()

    # -- partitions ------------------------------------------------------------------------

    def partition(self, seconds: float | None = None, mode: str = "refuse") -> None:
        """Cut the API port off; heal automatically after ``seconds`` when given."""
        assert self._api is not None and self._loop is not None
        if mode == "blackhole":
            self.cluster.faults.set_blackhole(True)
        elif not self.partitioned:
            _drop_connections(self._api)
            self._api_socket.close()
            for watcher in list(self.cluster.watchers):
                watcher.close()
        self.partitioned = True
        if self._partition_timer:
            self._partition_timer.cancel()
        if seconds is not None:
            self._partition_timer = self._loop.call_later(seconds, self.heal)

    def heal(self) -> None:
        if self._loop is None or not self.partitioned:
            return
        if self._partition_timer:
            self._partition_timer.cancel()
            self._partition_timer = None
        self.partitioned = False
        if self.cluster.faults.blackhole:
            self.cluster.faults.set_blackhole(False)
            return
        self._loop.create_task(self._reopen())

    async def _reopen(self) -> None:
        assert self._api is not None
        self._api_socket = listen_socket(self.host, self.port)
        config, state = self._api.config, self._api.server_state

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state={}, _loop=self._loop
            )

        server = await asyncio.get_running_loop().create_server(
            protocol, sock=self._api_socket, ssl=config.ssl, backlog=config.backlog
        )
        self._api.servers = [server]


def _drop_connections(server: uvicorn.Server) -> None:
    """Stop accepting and abort every open connection (clients see a reset, as on a cut)."""
    for listener in server.servers:
        listener.close()
    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.abort()


#: The kubeconfig cluster extension that carries a fleet cluster's labels, so
#: that whoever registers the stand-ins needs only the kubeconfig.
LABELS_EXTENSION = "quartermaster.dev/labels"


def kubeconfig(
    entries: Iterable[tuple[str, str, str, bytes | None]],
    current: str | None = None,
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A kubeconfig with one context per ``(name, server_url, token, ca_pem)``,
    each cluster's fleet ``labels`` in its ``LABELS_EXTENSION`` extension."""
    clusters, users, contexts = [], [], []
    names = []
    for name, server, token, ca_pem in entries:
        names.append(name)
        cluster: dict[str, Any] = {"server": server}
        if ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
        if labels and labels.get(name):
            extension = {"name": LABELS_EXTENSION, "extension": dict(labels[name])}
            cluster["extensions"] = [extension]
        clusters.append({"name": name, "cluster": cluster})
        users.append({"name": f"{name}-admin", "user": {"token": token}})
        contexts.append(
            {
                "name": name,
                "context": {"cluster": name, "user": f"{name}-admin", "namespace": "default"},
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": clusters,
        "users": users,
        "contexts": contexts,
        "current-context": current or (names[0] if names else ""),
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    os.chmod(path, 0o600)


class ServerThread:
    """Runs servers on a private event loop in a daemon thread (for tests and tools)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="kubesim", daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, _T], timeout: float = 30.0) -> _T:
        """Run a coroutine on the server loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, function: Callable[..., _T], *args: Any, timeout: float = 30.0) -> _T:
        """Run a plain function on the server loop (safe access to cluster state)."""

        async def wrapper() -> _T:
            return function(*args)

        return self.call(wrapper(), timeout)

    def close(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
