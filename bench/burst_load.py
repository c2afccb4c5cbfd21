"""The parts of ``bench/burst.py`` that run in processes of their own.

``timed_app`` is what each API process serves: Quartermaster's app
(``service.api.main:create``, as ``quartermaster api`` serves it) wrapped so
that every answer carries ``Server-Timing: app;dur=<ms>`` (from the app's
call to its response's start, inside the API process) and the answering
process's pid.

``generate`` is a load generator: a minimal HTTP/1.1 client on asyncio
(uvloop when installed), keep-alive connections, one request at a time per
connection, httptools to parse answers, open loop (a request goes out when
it is due, on a new connection if every one is busy). It paces each tenant
at its rate for each phase, records every request, and snapshots its own
CPU at each phase's end, so that its cost on the shared cores is known.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import resource
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

Message = MutableMapping[str, Any]


# -- in each API process ------------------------------------------------------------------


class ServerTiming:
    """Adds the time spent in the app, and this process's pid, to every answer."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pid = str(os.getpid()).encode()

    async def __call__(
        self, scope: Message, receive: Callable[[], Awaitable[Message]], send: Any
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = b"app;dur=%.3f" % ((time.perf_counter() - start) * 1e3)
                extra = [(b"server-timing", took), (b"x-bench-pid", self.pid)]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, timed)


def timed_app() -> Any:
    """uvicorn's factory in each API process."""
    sys.path.insert(0, str(ROOT))
    from service.api.main import create

    return ServerTiming(create())


# -- load generator -------------------------------------------------------------------------

#: A record per request: phase, kind (0 list, 1 submission), status (-1: no
#: answer), ms from write to answer, ms in the API (-1: not said), API pid,
#: ms the request went out after it was due.
Record = tuple[int, int, int, float, float, int, float]


class _Connection(asyncio.Protocol):
    def __init__(self, tenant: _Tenant) -> None:
        import httptools

        self.tenant = tenant
        self.transport: asyncio.Transport | None = None
        tenant.live.add(self)
        self.parser = httptools.HttpResponseParser(self)
        self.request: tuple[int, int, float, float] | None = None  # phase, kind, due, sent
        self.server_ms, self.pid = -1.0, 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.tenant.ready(self)

    def send(self, data: bytes, phase: int, kind: int, due: float) -> None:
        assert self.transport is not None
        self.request = (phase, kind, due, time.perf_counter())
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"server-timing":
            self.server_ms = float(value.partition(b"dur=")[2])
        elif name == b"x-bench-pid":
            self.pid = int(value)

    def on_message_complete(self) -> None:
        request, self.request = self.request, None
        assert request is not None
        status = self.parser.get_status_code()
        self._record(request, status)
        self.tenant.ready(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.tenant.lost(self)
        self.tenant.live.discard(self)
        if self.request is not None:
            request, self.request = self.request, None
            self._record(request, -1)

    def _record(self, request: tuple[int, int, float, float], status: int) -> None:
        phase, kind, due, sent = request
        now = time.perf_counter()
        self.tenant.records.append(
            (
                phase,
                kind,
                status,
                round((now - sent) * 1e3, 3),
                self.server_ms,
                self.pid,
                round((sent - due) * 1e3, 3),
            )
        )
        self.server_ms, self.pid = -1.0, 0


class _Tenant:
    """One tenant's connections and requests: lists of its namespace's
    workloads and submissions to it, alternately."""

    def __init__(self, spec: dict[str, Any], port: int, tag: str) -> None:
        self.spec, self.port = spec, port
        namespace, token = spec["namespace"], spec["token"]
        head = f"Host: {HOST}:{port}\r\nAuthorization: Bearer {token}\r\n"
        path = f"/v1/namespaces/{namespace}/workloads"
        self.list = f"GET {path}?limit=20 HTTP/1.1\r\n{head}\r\n".encode()
        self.post_head = f"POST {path} HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
        head_of_body, _, tail = json.dumps(spec["workload"]).partition('"NAME"')
        self.body = (head_of_body + f'"{tag}-', '"' + tail)
        self.idle: deque[_Connection] = deque()
        self.live: set[_Connection] = set()
        self.queued: deque[tuple[int, int, float, bytes]] = deque()
        self.records: list[Record] = []
        self.opening = 0
        self.opened = 0
        self.index = 0

    def fire(self, phase: int, due: float) -> None:
        kind = self.index % 2
        if kind:
            body = f"{self.body[0]}{self.index}{self.body[1]}".encode()
            data = self.post_head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body
        else:
            data = self.list
        self.index += 1
        if self.idle:
            self.idle.popleft().send(data, phase, kind, due)
            return
        self.queued.append((phase, kind, due, data))
        if self.opening < len(self.queued):
            self.open()

    def open(self) -> None:
        self.opening += 1
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.create_connection(lambda: _Connection(self), HOST, self.port))
        task.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[Any]) -> None:
        self.opening -= 1
        self.opened += 1
        if task.exception() is not None and self.queued:
            phase, kind, _, _ = self.queued.popleft()
            self.records.append((phase, kind, -1, 0.0, -1.0, 0, 0.0))

    def ready(self, connection: _Connection) -> None:
        if self.queued:
            phase, kind, due, data = self.queued.popleft()
            connection.send(data, phase, kind, due)
        else:
            self.idle.append(connection)  # used again last: round robin

    def lost(self, connection: _Connection) -> None:
        if connection in self.idle:
            self.idle.remove(connection)

    def in_flight(self) -> int:
        return sum(c.request is not None for c in self.live) + len(self.queued)

    async def pace(self, start: float, phases: list[float], rates: list[float]) -> None:
        """At each phase's rate, a request when it is due."""
        at = start
        for phase, (seconds, rate) in enumerate(zip(phases, rates, strict=True)):
            end = at + seconds
            due = at
            while due < end:
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                self.fire(phase, due)
                due += 1 / rate
            at = end


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _generate(spec: dict[str, Any]) -> dict[str, Any]:
    port, start, phases = spec["port"], spec["start"], spec["phases"]
    tenants = [_Tenant(t, port, f"{t['namespace']}-{spec['tag']}") for t in spec["tenants"]]
    for tenant in tenants:
        for _ in range(tenant.spec["connections"]):
            tenant.open()
    cpu = [_cpu_seconds()]

    async def snapshots() -> None:
        at = start
        for seconds in phases:
            at += seconds
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            cpu.append(_cpu_seconds())

    watcher = asyncio.get_running_loop().create_task(snapshots())
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    await asyncio.gather(*(t.pace(start, phases, t.spec["rates"]) for t in tenants))
    await watcher
    deadline = time.monotonic() + 30
    while any(t.in_flight() for t in tenants) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return {
        "cpu_seconds": [round(b - a, 3) for a, b in itertools.pairwise(cpu)],
        "tenants": [
            {"namespace": t.spec["namespace"], "records": t.records, "connections": t.opened}
            for t in tenants
        ],
        "unanswered": sum(t.in_flight() for t in tenants),
    }


def generate(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # plain asyncio costs more CPU per request, and says so in its figures
        runner = asyncio.run
    result = runner(_generate(spec))
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    generate(sys.argv[1], sys.argv[2])
