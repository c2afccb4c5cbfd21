"""``quartermaster standalone``: a working Quartermaster with a simulated fleet.

The parts run as they would in production, each its own process: the API
(``quartermaster api``), a Celery worker and the scheduler (``python -m
workers.cli worker|scheduler`` — the service starts the workers as programs,
never imports them), and the stand-in member clusters (``quartermaster sim
cluster``). Postgres and Redis are embedded unless ``QM_DATABASE_URL`` /
``QM_BROKER_URL`` name servers. The demo quotas and the stand-ins' Cluster
objects are seeded through the API, as any client would.

Everything standalone mode makes up lives in the data directory: the admin
token, the key that encrypts cluster credentials, the ledger signing key (and
its verifier key for auditors), the databases and every child's log — so a
restart with the same directory resumes with the same credentials and data.

Once everything is up, a part that dies is restarted (``supervisor.py`` has
the policy) on the same ports and data, so that every other part still finds
it; the stand-ins' Cluster objects are pointed at their new credentials. A
Postgres or Redis given by URL is only watched: its outage and recovery are
reported.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from service.config import Settings
from service.runtime.demo import load_manifests, register_clusters, seed_quotas, stand_ins
from service.runtime.embedded import (
    ServerCommand,
    postgres_command,
    probe_postgres,
    probe_redis,
    reachable,
    redis_command,
    steady_ports,
)
from service.runtime.supervisor import Child, Event, Part, Program, Supervisor

#: The simulator's fleet files: data beside the service's package, found by
#: path (the service imports nothing of sim; it runs it as a program).
FLEETS = Path(__file__).resolve().parents[2] / "sim" / "fleets"
DEMO_FLEET = FLEETS / "demo.yaml"
DEMO_QUOTAS = FLEETS / "demo-quotas.yaml"
DEMO_JOB = FLEETS / "demo-job.yaml"
QMCTL_CONTEXT = "standalone"


@dataclass
class Options:
    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = Path(".qm-data")
    clusters: int = 4
    fleet: Path = DEMO_FLEET
    quotas: Path | None = DEMO_QUOTAS
    startup_timeout: float = 90.0
    grace: float = 10.0
    write_qmctl_context: bool = True


class StartupFailed(Exception):
    """A part did not come up; the message says which and why."""


class Interrupted(Exception):
    """SIGINT or SIGTERM: stop everything that was started."""


# --- credentials kept per data directory -------------------------------------------


def _kept(path: Path, make: Callable[[], str]) -> str:
    """The secret in ``path``, made (owner-readable only) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(make() + "\n")
    return path.read_text(encoding="utf-8").strip()


def _ledger_key(data: Path) -> str:
    from service.ledger.checkpoint import DEFAULT_ORIGIN, NoteSigner

    def make() -> str:
        signer, seed = NoteSigner.generate(DEFAULT_ORIGIN)
        (data / "ledger-verifier.pub").write_text(signer.verifier_key + "\n", encoding="utf-8")
        return str(seed)

    return _kept(data / "ledger-signing-key", make)


def credentials(settings: Settings, data: Path) -> Settings:
    """Settings with an admin token, a secret key and a ledger signing key,
    from the environment when given there, else kept in ``data``."""
    token = settings.bootstrap_token or _kept(
        data / "admin-token", lambda: "qm_" + secrets.token_urlsafe(32)
    )
    secret = os.environ.get("QM_SECRET_KEY") or _kept(
        data / "secret-key", lambda: secrets.token_urlsafe(32)
    )
    ledger = settings.ledger_signing_key or _ledger_key(data)
    return settings.model_copy(
        update={"bootstrap_token": token, "secret_key": secret, "ledger_signing_key": ledger}
    )


@contextmanager
def _exclusive(data: Path) -> Iterator[None]:
    """One standalone per data directory."""
    data.mkdir(parents=True, exist_ok=True)
    with (data / "standalone.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartupFailed(f"another quartermaster standalone uses {data}") from None
        yield


# --- readiness ---------------------------------------------------------------------


def _get(url: str, **kwargs: Any) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=1.0, **kwargs)
    except httpx.HTTPError:
        return None


_CELERY_READY = re.compile(r"celery@\S+ ready\.")
_LEADER = re.compile(r"^qm_admission_leader (\S+)$", re.MULTILINE)
#: Stopped after the other parts, which use them.
SERVERS = ("postgres", "redis")
#: What the API, the worker and the scheduler need to be restarted.
NEEDS = SERVERS


class Standalone:
    def __init__(self, options: Options, settings: Settings, console: Console) -> None:
        self.options = options
        self.data = options.data_dir.resolve()
        self.settings = credentials(settings, self.data)
        self.console = console
        self.api_url = f"http://{_loopback(options.host)}:{options.port}"
        #: The scheduler's /metrics: the port after the API's, the same every start.
        self.metrics_port = options.port + 1
        self._signals = 0

    # -- the whole run ---------------------------------------------------------------

    def run(self) -> int:
        """Start everything, then supervise it until a signal; stop everything."""
        began = time.monotonic()
        for port, what in ((self.options.port, "the API"), (self.metrics_port, "metrics")):
            if reachable(_loopback(self.options.host), port):
                self.console.print(
                    f"[red]✗ something already listens on port {port}[/red], {what}'s "
                    "(--port chooses another; the scheduler's metrics take the next one)"
                )
                return 1
        previous = {s: signal.signal(s, self._interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            with _exclusive(self.data):
                supervisor = Supervisor(self.data / "logs", self._child_env(), report=self._report)
                try:
                    try:
                        self._start(supervisor)
                    except StartupFailed as error:
                        # Said before the clean-up, which says what it stops.
                        self.console.print(f"[red]✗ {error}[/red]", highlight=False)
                        return 1
                    self._ready(time.monotonic() - began)
                    return self._watch(supervisor)
                finally:
                    self._stop(supervisor)
        except StartupFailed as error:
            self.console.print(f"[red]✗ {error}[/red]", highlight=False)
            return 1
        except Interrupted:
            return 0
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _start(self, supervisor: Supervisor) -> None:
        # The stand-in clusters start first: they need no database.
        clusters = self._start_clusters(supervisor)
        database, broker = self._servers(supervisor)
        self._migrate(database)
        self._check()
        env = {"QM_DATABASE_URL": database, "QM_BROKER_URL": broker}
        self._wait([*clusters, *self._start_processes(supervisor, env)])
        self._seed()
        self._check()

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag, which the start-up steps and the watch loop look at: an
        # exception raised from a signal handler lands wherever the main
        # thread happens to be, and a weakref callback or a lock's bookkeeping
        # swallows or half-does it. A signal during the clean-up cuts the
        # children's grace period short.
        self._signals += 1

    def _check(self) -> None:
        if self._signals:
            raise Interrupted

    def _stop(self, supervisor: Supervisor) -> None:
        """The parts first, then the servers they use; a further signal cuts
        every grace period short."""
        signals = self._signals
        for servers in (False, True):
            names = [p.name for p in supervisor.parts if (p.name in SERVERS) == servers]
            if not names:
                continue
            shown = ", ".join(names)
            with self.console.status(f"stopping {shown}… (Ctrl-C again kills them)"):
                killed = supervisor.stop(
                    self.options.grace, lambda: self._signals > signals, only=names
                )
            for name in killed:
                self.console.print(f"[yellow]! {name} was killed[/]")
            self.console.print(f"[green]✓[/green] stopped {shown}")

    def _watch(self, supervisor: Supervisor) -> int:
        """Until a signal: restart parts that die (the supervisor reports
        each event), point the Clusters at restarted stand-ins, and report
        the member clusters' sync (heartbeat and inventory) once the workers
        do."""
        supervisor.supervise()
        synced = self.options.clusters <= 0
        next_look = time.monotonic()
        register: float | None = None
        while not self._signals:
            for event in supervisor.poll():
                if event.kind == "back" and event.part == "clusters":
                    register, synced = time.monotonic(), False
            now = time.monotonic()
            if register is not None and now >= register:
                register = None if self._reregister() else now + 2.0
            if not synced and register is None and now >= next_look:
                synced, next_look = self._synced(), time.monotonic() + 2.0
            time.sleep(0.2)
        return 0

    def _report(self, event: Event) -> None:
        mark = {"restarting": "[cyan]↻[/cyan]"}.get(
            event.kind, "[green]✓[/green]" if event.good else "[red]✗[/red]"
        )
        text = f"{mark} {event.line}"
        if event.detail:
            text += "\n" + "\n".join(f"    {line}" for line in event.detail.splitlines())
        self.console.print(text, highlight=False, markup=True)

    def _reregister(self) -> bool:
        """Point the stand-ins' Clusters at a restarted stand-in's new token
        and CA (its ports are the same); False to try again later."""
        headers = {"Authorization": f"Bearer {self.settings.bootstrap_token}"}
        try:
            found = stand_ins(self.data / "clusters" / "kubeconfig")
            with httpx.Client(base_url=self.api_url, headers=headers, timeout=10) as api:
                registered = register_clusters(api, found)
        except (OSError, ValueError, KeyError, yaml.YAMLError, httpx.HTTPError):
            return False
        if registered.failed:
            return False
        self._line("member clusters", f"registered again: {registered.summary()}")
        self._failures(registered.skipped)
        return True

    def _synced(self) -> bool:
        """Whether every Cluster reports Ready with nodes; says so once they do."""
        headers = {"Authorization": f"Bearer {self.settings.bootstrap_token}"}
        response = _get(f"{self.api_url}/v1/clusters", headers=headers)
        if response is None or response.status_code != 200:
            return False
        items = response.json().get("items") or []
        ready = {
            c["metadata"]["name"]: len(
                ((c.get("status") or {}).get("inventory") or {}).get("nodes") or ()
            )
            for c in items
            if (c.get("status") or {}).get("state") == "Ready"
        }
        if not items or len(ready) < len(items):
            return False
        nodes = ", ".join(f"{name} ({count} nodes)" for name, count in sorted(ready.items()))
        self._line("member clusters", f"synced, Ready: {nodes}")
        return True

    # -- the parts -------------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PYTHONUNBUFFERED="1",
            QM_DATA_DIR=str(self.data),
            QM_BOOTSTRAP_TOKEN=self.settings.bootstrap_token or "",
            QM_SECRET_KEY=self.settings.secret_key,
            QM_LEDGER_SIGNING_KEY=self.settings.ledger_signing_key or "",
        )
        return env

    def _servers(self, supervisor: Supervisor) -> tuple[str, str]:
        """Embedded Postgres and Redis as children, or the configured ones
        watched; their URLs."""
        database, broker = self.settings.database_url, self.settings.broker_url
        if database:
            supervisor.watch("postgres", partial(probe_postgres, database))
            self._line("postgres", _redacted(database))
        else:
            with self.console.status("preparing embedded Postgres…"):
                try:
                    command = postgres_command(self.data / "postgres")
                except (OSError, subprocess.SubprocessError) as error:
                    raise StartupFailed(f"embedded Postgres: {error}") from None
            database = command.url
            self._wait([supervisor.add(_postgres(command, self.data / "postgres"))])
        self._check()
        if broker:
            supervisor.watch("redis", partial(probe_redis, broker))
            self._line("redis", _redacted(broker))
        else:
            port = steady_ports()
            broker = f"redis://127.0.0.1:{port}/0"
            self._wait([supervisor.add(_redis(self.data / "redis", port, broker))])
        return database, broker

    def _migrate(self, database: str) -> None:
        from service.app.migrate import upgrade

        began = time.monotonic()
        with self.console.status("migrating…"):
            try:
                upgrade(database)
            except SQLAlchemyError as error:
                raise StartupFailed(f"cannot migrate {_redacted(database)}: {error}") from None
        self._line("migrations", "the schema is at the newest migration", began)

    def _start_clusters(self, supervisor: Supervisor) -> list[Part]:
        """The stand-ins, on ports kept for their restarts (API ports, then
        admin ports), so that their Cluster objects' servers stay right."""
        count = self.options.clusters
        if count <= 0:
            return []
        kubeconfig = self.data / "clusters" / "kubeconfig"
        kubeconfig.unlink(missing_ok=True)
        base = steady_ports(2 * count)
        argv = [
            *_sim_command(),
            *("cluster", "--fleet", str(self.options.fleet)),
            *("--count", str(count), "--port", str(base), "--admin-port", str(base + count)),
            *("--kubeconfig-out", str(kubeconfig)),
        ]

        def ready(child: Child) -> str | None:
            output = child.output()
            if "kubeconfig written" not in output:
                return None
            lines = [json.loads(x) for x in output.splitlines() if x.startswith("{")]
            return ", ".join(f"{x['cluster']} ({x['nodes']} nodes) {x['server']}" for x in lines)

        return [supervisor.add(Program("clusters", argv, ready=ready))]

    def _start_processes(self, supervisor: Supervisor, env: dict[str, str]) -> list[Part]:
        host, port = self.options.host, self.options.port
        metrics = self.metrics_port

        def api_ready(child: Child) -> str | None:
            response = _get(f"{self.api_url}/readyz")
            return self.api_url if response is not None and response.status_code == 200 else None

        def worker_ready(child: Child) -> str | None:
            return "Celery, outbox consumers" if _CELERY_READY.search(child.output()) else None

        def scheduler_ready(child: Child) -> str | None:
            response = _get(f"http://127.0.0.1:{metrics}/metrics")
            found = _LEADER.search(response.text) if response is not None else None
            if found is None or float(found.group(1)) < 1:
                return None
            return f"leads admission; metrics at http://127.0.0.1:{metrics}/metrics"

        programs = [
            Program(
                "api",
                [*_server_command(), "api", "--host", host, "--port", str(port)],
                env,
                api_ready,
                NEEDS,
            ),
            Program("worker", [*_workers_command(), "worker"], env, worker_ready, NEEDS),
            Program(
                "scheduler",
                [*_workers_command(), "scheduler", "--metrics-port", str(metrics)],
                env,
                scheduler_ready,
                NEEDS,
            ),
        ]
        return [supervisor.add(program) for program in programs]

    def _wait(self, parts: list[Part]) -> None:
        """Until every part is ready (its ✓ line said); a part that exits
        meanwhile fails the start-up (it is not retried before it was up)."""
        deadline = time.monotonic() + self.options.startup_timeout
        pending = list(parts)
        with self.console.status("") as status:
            while pending:
                self._check()
                status.update("waiting for " + ", ".join(p.name for p in pending) + "…")
                for part in list(pending):
                    detail = part.check()
                    if detail is not None:
                        pending.remove(part)
                        self._line(part.name, detail, part.child.began)
                    elif not part.child.alive:
                        raise StartupFailed(
                            f"{part.name} exited ({part.child.process.returncode}); "
                            f"its log ({part.child.log}) ends:\n{part.child.tail()}"
                        )
                if pending and time.monotonic() > deadline:
                    late = pending[0]
                    why = f"{late.name} not ready after {self.options.startup_timeout:g} s"
                    why += f"; its log ({late.child.log}) ends:\n{late.child.tail()}"
                    raise StartupFailed(why)
                time.sleep(0.1)

    def _seed(self) -> None:
        headers = {"Authorization": f"Bearer {self.settings.bootstrap_token}"}
        with httpx.Client(base_url=self.api_url, headers=headers, timeout=30) as api:
            if self.options.quotas is not None:
                began = time.monotonic()
                try:
                    manifests = load_manifests(self.options.quotas)
                except (OSError, ValueError, yaml.YAMLError) as error:
                    raise StartupFailed(f"cannot read {self.options.quotas}: {error}") from None
                seeded = seed_quotas(api, manifests)
                self._line("demo quotas", f"{self.options.quotas.name}: {seeded.summary()}", began)
                self._failures(seeded.failed)
            if self.options.clusters > 0:
                began = time.monotonic()
                found = stand_ins(self.data / "clusters" / "kubeconfig")
                registered = register_clusters(api, found)
                self._line("member clusters", f"registered: {registered.summary()}", began)
                self._failures(registered.failed + registered.skipped)

    def _failures(self, failed: list[str]) -> None:
        for line in failed:
            self.console.print(f"  [yellow]! {line}[/yellow]")

    def _ready(self, seconds: float) -> None:
        context = self._write_context()
        out = Console(highlight=False, soft_wrap=True)
        out.print(f"[bold green]Quartermaster is ready[/bold green] in {seconds:.1f} s")
        out.print(f"  API            {self.api_url}  (OpenAPI at {self.api_url}/docs)")
        out.print(f"  admin token    {self._token_shown()}")
        if context:
            out.print(f"  qmctl context  {context}")
        out.print(f"  data and logs  {self.data}  (logs in {self.data / 'logs'})")
        out.print("Try:  qmctl get clusterqueues   qmctl get clusters   qmctl get workloads -A")
        out.print(f"      qmctl submit -n vision -f {_shown(DEMO_JOB)} --wait")
        out.print("Ctrl-C stops everything.")

    def _token_shown(self) -> str:
        """The admin token's first characters and where the whole one is: a
        terminal's scrollback and a shared screen are no place for it."""
        token = self.settings.bootstrap_token or ""
        kept = self.data / "admin-token"
        stored = kept.is_file() and kept.read_text(encoding="utf-8").strip() == token
        where = f"whole in {_shown(kept)}" if stored else "as QM_BOOTSTRAP_TOKEN gave it"
        return f"{token[:11]}…  ({where})"

    def _write_context(self) -> str | None:
        if not self.options.write_qmctl_context:
            return None
        from quartermaster_client.config import ConfigFile
        from quartermaster_client.errors import ConfigError

        try:
            config = ConfigFile.load()
            config.set_context(QMCTL_CONTEXT, self.api_url, self.settings.bootstrap_token)
            config.current_context = QMCTL_CONTEXT
            config.save()
        except (ConfigError, OSError) as error:
            self.console.print(f"  [yellow]! qmctl context not written: {error}[/yellow]")
            return None
        return f"{QMCTL_CONTEXT} (current) in {config.path}"

    def _line(self, name: str, detail: str, since: float | None = None) -> None:
        took = f"  [dim]{time.monotonic() - since:.1f} s[/dim]" if since is not None else ""
        self.console.print(f"[green]✓[/green] {name:<16} {detail}{took}", highlight=False)


def _postgres(command: ServerCommand, data: Path) -> Program:
    def ready(child: Child) -> str | None:
        return f"embedded, data in {data}" if probe_postgres(command.url) is None else None

    # SIGINT is Postgres's fast shutdown; SIGTERM would wait for its clients.
    return Program(
        "postgres", command.argv, ready=ready, stop_signal=signal.SIGINT, user=command.user
    )


def _redis(data: Path, port: int, url: str) -> Program:
    def ready(child: Child) -> str | None:
        return f"embedded, {url}" if probe_redis(url, append_only=True) is None else None

    # The command is made for each start: see redis_command.
    return Program("redis", lambda: redis_command(data, port).argv, ready=ready)


def _loopback(host: str) -> str:
    """Where a local client reaches a server listening on ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _redacted(url: str) -> str:
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


def _server_command() -> list[str]:
    return [sys.executable, "-m", "service"]


def _sim_command() -> list[str]:
    # A program, not an import: the service imports nothing of sim.
    return [sys.executable, "-m", "sim.cli"]


def _workers_command() -> list[str]:
    # A program, not an import: the service may not import the workers.
    return [sys.executable, "-m", "workers.cli"]


def run(options: Options, settings: Settings, console: Console) -> int:
    return Standalone(options, settings, console).run()
