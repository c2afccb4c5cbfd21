"""The run's client: a steady load of submissions, each retried with its key
until it is answered."""

from __future__ import annotations

import contextlib
import heapq
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tests.workers.chaos.config import HIGH, TEAMS, Size
from tests.workers.stack import (
    gang,
)


@dataclass
class Submission:
    key: str  # namespace/name
    body: dict[str, Any]
    due: float = 0.0
    attempts: int = 0
    #: To be cancelled once acknowledged.
    cancel: bool = False


class Load(threading.Thread):
    """Submits a gang every 1/rate s (open loop: late when behind, never in a
    burst) to the API processes in turn, the next one at once when one
    refuses the connection; a submission whose outcome it was not told (a
    503, a 409 "in flight", a broken connection) is retried later with the
    same key, between new ones, until it is answered. Every
    ``cancel_every``-th acknowledged gang is cancelled a random while after
    its 201, the cancel retried alike until it is answered."""

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
        #: Cancels due, (monotonic time, key); those asked, and those answered 200.
        self.cancels: list[tuple[float, str]] = []
        self.cancel_asked: set[str] = set()
        self.cancelled: set[str] = set()

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
        high_every, cancel_every = self.size.high_every, self.size.cancel_every
        urgent = HIGH if high_every and number % high_every == high_every - 1 else None
        cancel = bool(cancel_every) and number % cancel_every == cancel_every // 2
        return Submission(
            key, gang(name, gpus, round(seconds), priority_class=urgent), cancel=cancel
        )

    def run(self) -> None:
        start, number = time.monotonic(), 0
        while not self.halt.is_set():
            due = start + number / self.size.rate
            if self.halt.wait(max(0.0, due - time.monotonic())):
                break
            self._retry_due(limit=3)
            self._cancel_due(limit=3)
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
        while (self.waiting or self.cancels) and time.monotonic() < deadline:
            self._retry_due(limit=len(self.waiting))
            self._cancel_due(limit=len(self.cancels))
            time.sleep(0.2)

    def _cancel_due(self, limit: int) -> None:
        now = time.monotonic()
        for _ in range(limit):
            if not self.cancels or self.cancels[0][0] > now:
                return
            _, key = heapq.heappop(self.cancels)
            self._cancel(key)

    def _cancel(self, key: str) -> None:
        namespace, name = key.split("/")
        with self.lock:
            self.cancel_asked.add(key)
        for hop in range(len(self.clients)):
            client = self.clients[(self.turn + hop) % len(self.clients)]
            try:
                response = client.post(
                    f"/v1/namespaces/{namespace}/workloads/{name}/cancel",
                    headers={"Idempotency-Key": f"chaos-cancel-{key}"},
                )
            except httpx.ConnectError:
                continue
            except httpx.TransportError as error:
                self.answers[f"cancel {type(error).__name__}"] += 1
                break
            status, problem = response.status_code, _problem(response)
            self.answers[f"cancel {status} {problem}".strip()] += 1
            if status == 200:
                with self.lock:
                    self.cancelled.add(key)
                return
            if status not in (503, 429) and not (
                status == 409 and problem == "idempotency-key-in-flight"
            ):
                self.failures.append(f"cancel {key}: {status} {response.text[:200]}")
                if status < 500:
                    return
            break
        heapq.heappush(self.cancels, (time.monotonic() + 1.0, key))

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
        status, problem = response.status_code, _problem(response)
        self.answers[f"{status} {problem}".strip()] += 1
        if status == 201:
            with self.lock:
                self.acknowledged[submission.key] = time.time()
            if submission.cancel and submission.key not in self.cancel_asked:
                due = time.monotonic() + self.random.uniform(0, self.size.cancel_within)
                heapq.heappush(self.cancels, (due, submission.key))
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


def _problem(response: httpx.Response) -> str:
    """The last segment of a problem+json answer's ``type``, or ""."""
    if response.headers.get("content-type", "").startswith("application/problem+json"):
        with contextlib.suppress(ValueError):
            return str(response.json().get("type", "")).rsplit("/", 1)[-1]
    return ""
