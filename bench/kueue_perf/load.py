"""The generator: every workload of a config submitted over the API at the
time Kueue's generator would create it, from a process of its own.

Open loop, as Kueue's generator (a goroutine per workload set sleeping
``creationIntervalMs`` before each create): each submission is due at
``start + arrival``, sent when due by the first free keep-alive connection,
late when the API is behind (the lateness is measured). Each carries an
``Idempotency-Key``; one answered 503 or 429 (the API shedding load), or
409 while the same key is in flight, or whose connection broke, is sent
again 0.5 s later with the same key until it is answered — so that every
workload is submitted, once.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import multiprocessing as mp
import queue
import time
from dataclasses import dataclass
from typing import Any

from bench.api import read_answer
from bench.kueue_perf.configs import Config, arrivals
from bench.kueue_perf.manifests import workload
from tests.workers.stack import TOKEN

RETRY_AFTER = 0.5
RETRIED = (429, 503, 409)


@dataclass(frozen=True)
class Answer:
    namespace: str
    name: str
    due: float  # wall time it was due
    answered: float  # wall time of the answer that settled it
    status: int
    attempts: int


def _request(namespace: str, name: str, body: bytes, port: int) -> bytes:
    head = (
        f"POST /v1/namespaces/{namespace}/workloads HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Idempotency-Key: kueue-perf-{namespace}-{name}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


Item = tuple[float, int, str, str, bytes]


def _requests(config: Config, port: int) -> list[Item]:
    """Every submission, due times relative to the start."""
    items = []
    for seq, a in enumerate(arrivals(config)):
        body = json.dumps(workload(a), separators=(",", ":")).encode()
        items.append((a.due, seq, a.namespace, a.name, _request(a.namespace, a.name, body, port)))
    return items


async def _submit_all(
    items: list[Item], port: int, start: float, connections: int
) -> tuple[list[Answer], dict[str, int]]:
    """Send every workload when due; returns its settling answer and the
    count of every status seen (retries included)."""
    heap = [(start + due, seq, ns, name, request) for due, seq, ns, name, request in items]
    heapq.heapify(heap)
    due_at = {(ns, n): due for due, _, ns, n, _ in heap}
    attempts: dict[tuple[str, str], int] = {}
    answers: list[Answer] = []
    seen: dict[str, int] = {}
    lock = asyncio.Lock()

    async def take() -> Item | None:
        async with lock:
            return heapq.heappop(heap) if heap else None

    async def connection() -> None:
        reader = writer = None
        while True:
            if not heap:
                # Others may still put a retry back: wait while any is in flight.
                if len(answers) == len(due_at):
                    break
                await asyncio.sleep(0.05)
                continue
            item = await take()
            if item is None:
                continue
            when, seq, ns, name, request = item
            if (wait := when - time.time()) > 0:
                await asyncio.sleep(wait)
            attempts[(ns, name)] = attempts.get((ns, name), 0) + 1
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                assert reader is not None
                writer.write(request)
                status = int((await read_answer(reader)).split()[1])
            except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
                status = 0
                if writer is not None:
                    writer.close()
                reader = writer = None
            seen[str(status)] = seen.get(str(status), 0) + 1
            if status == 0 or status in RETRIED:
                async with lock:
                    heapq.heappush(heap, (time.time() + RETRY_AFTER, seq, ns, name, request))
                continue
            answers.append(
                Answer(ns, name, due_at[(ns, name)], time.time(), status, attempts[(ns, name)])
            )
        if writer is not None:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return answers, seen


def _generate(config: Config, port: int, connections: int, control: Any, out: Any) -> None:
    items = _requests(config, port)
    out.put(len(items))  # ready
    start = float(control.get())
    out.put(asyncio.run(_submit_all(items, port, start, connections)))


class Generator:
    """The generator process: it builds every request, then submits from
    the start it is given (:meth:`begin`)."""

    def __init__(self, config: Config, port: int, connections: int) -> None:
        context = mp.get_context("spawn")
        self._control: Any = context.Queue()
        self._queue: Any = context.Queue()
        self.process = context.Process(
            target=_generate,
            args=(config, port, connections, self._control, self._queue),
            daemon=True,
            name="kueue-perf-generator",
        )
        self.process.start()
        self.count = self._ready()

    def _ready(self) -> int:
        """The number of requests it built, once it has (or its death)."""
        while True:
            try:
                return int(self._queue.get(timeout=1.0))
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(f"the generator exited ({self.process.exitcode})") from None

    def begin(self, start: float) -> None:
        """Submissions are due from ``start`` (wall time) on."""
        self._control.put(start)

    def poll(self) -> tuple[list[Answer], dict[str, int]] | None:
        """Its answers once every workload was answered, else None."""
        try:
            answers: tuple[list[Answer], dict[str, int]] = self._queue.get(timeout=0.1)
        except queue.Empty:
            return None
        self.process.join(30)
        return answers

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
