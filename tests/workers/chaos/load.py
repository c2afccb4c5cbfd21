"""The run's client: a steady load of submissions, each retried with its key
until it is answered."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tests.workers.chaos.config import TEAMS, Size
from tests.workers.stack import (
    gang,
)


@dataclass
class Submission:
    key: str  # namespace/name
    body: dict[str, Any]
    due: float = 0.0
    attempts: int = 0


class Load(threading.Thread):
    """Submits a gang every 1/rate s (open loop: late when behind, never in a
    burst) to the API processes in turn, the next one at once when one
    refuses the connection; a submission whose outcome it was not told (a
    503, a 409 "in flight", a broken connection) is retried later with the
    same key, between new ones, until it is answered."""

    def __init__(self, urls: Sequence[str], size: Size, token: str) -> None:
        super().__init__(daemon=True, name="load")
        self.urls = list(urls)
        self.size = size
        self.clients = [
            httpx.Client(base_url=u, headers={"Authorization": f"Bearer {token}"}, timeout=5)
            for u in self.urls
        ]
        self.random = random.Random(size.seed)
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.attempted: dict[str, Submission] = {}
        self.acknowledged: dict[str, float] = {}  # key -> wall time of its 201
        self.waiting: deque[Submission] = deque()
        #: The long gangs' keys.
        self.long: set[str] = set()
        self.answers: Counter[str] = Counter()
        self.failures: list[str] = []
        self.turn = 0

    def _next(self, number: int) -> Submission:
        team = TEAMS[number % len(TEAMS)]
        name = f"c{number:04d}"
        gpus = self.random.choice((4, 8, 8, 16))
        low, high = self.size.run_seconds
        key = f"{team}/{name}"
        if self.size.long_every and number % self.size.long_every == self.size.long_every - 1:
            gpus, (low, high) = 4, self.size.long_seconds
            with self.lock:
                self.long.add(key)
        seconds = self.random.uniform(low, high) / self.size.time_scale
        return Submission(key, gang(name, gpus, round(seconds)))

    def run(self) -> None:
        start, number = time.monotonic(), 0
        while not self.halt.is_set():
            due = start + number / self.size.rate
            if self.halt.wait(max(0.0, due - time.monotonic())):
                break
            self._retry_due(limit=3)
            submission = self._next(number)
            number += 1
            with self.lock:
                self.attempted[submission.key] = submission
            self._send(submission)

    def _retry_due(self, limit: int) -> None:
        now = time.monotonic()
        for _ in range(min(limit, len(self.waiting))):
            if self.waiting[0].due > now:
                return
            self._send(self.waiting.popleft())

    def settle(self, ceiling: float) -> None:
        """After the load: retry what is in doubt until each is answered."""
        deadline = time.monotonic() + ceiling
        while self.waiting and time.monotonic() < deadline:
            self._retry_due(limit=len(self.waiting))
            time.sleep(0.2)

    def _send(self, submission: Submission) -> None:
        submission.attempts += 1
        namespace = submission.key.split("/")[0]
        for hop in range(len(self.clients)):
            client = self.clients[(self.turn + hop) % len(self.clients)]
            try:
                response = client.post(
                    f"/v1/namespaces/{namespace}/workloads",
                    json=submission.body,
                    headers={"Idempotency-Key": f"chaos-{submission.key}"},
                )
            except httpx.ConnectError:
                self.answers["ConnectError"] += 1
                continue  # that process is down: the other one, now
            except httpx.TransportError as error:
                self.answers[type(error).__name__] += 1
                self._later(submission, 1.0)
                break
            self._answered(submission, response)
            break
        else:
            self._later(submission, 0.5)
        self.turn += 1

    def _answered(self, submission: Submission, response: httpx.Response) -> None:
        status = response.status_code
        problem = ""
        if response.headers.get("content-type", "").startswith("application/problem+json"):
            with contextlib.suppress(ValueError):
                problem = str(response.json().get("type", "")).rsplit("/", 1)[-1]
        self.answers[f"{status} {problem}".strip()] += 1
        if status == 201:
            with self.lock:
                self.acknowledged[submission.key] = time.time()
        elif status in (503, 429) or (status == 409 and problem == "idempotency-key-in-flight"):
            self._later(submission, float(response.headers.get("retry-after") or 1))
        else:
            self.failures.append(f"{submission.key}: {status} {response.text[:200]}")
            if status >= 500:
                self._later(submission, 1.0)

    def _later(self, submission: Submission, seconds: float) -> None:
        submission.due = time.monotonic() + min(seconds, 5.0)
        self.waiting.append(submission)

    def long_keys(self) -> set[str]:
        with self.lock:
            return set(self.long)

    def acked_since(self, moment: float) -> int:
        with self.lock:
            return sum(1 for at in self.acknowledged.values() if at > moment)

    def close(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join(30)
        for client in self.clients:
            client.close()
