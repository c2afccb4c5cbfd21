"""Fault injection state: what the chaos tests switch on through ``/_admin/faults``.

Latency and error rates apply to API requests (never to the admin endpoints);
``blackhole`` holds requests until healed, which a client sees as a timeout;
a *partition* (refused connections) is carried out by the server, which closes
its listening socket — see :mod:`sim.kubesim.server`.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from sim.kubesim.errors import ApiError

__all__ = ["Faults"]


@dataclass(slots=True)
class Faults:
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    error_rate: float = 0.0
    error_code: int = 500
    #: Only requests with these verbs / resources are affected (empty: all).
    verbs: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    blackhole: bool = False
    healed: asyncio.Event | None = None

    def as_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies ``healed``, an asyncio.Event bound to a loop.
        return {
            "latencyMs": self.latency_ms,
            "jitterMs": self.jitter_ms,
            "errorRate": self.error_rate,
            "errorCode": self.error_code,
            "verbs": list(self.verbs),
            "resources": list(self.resources),
            "blackhole": self.blackhole,
        }

    def update(self, changes: dict[str, Any]) -> None:
        self.latency_ms = float(changes.get("latencyMs", self.latency_ms))
        self.jitter_ms = float(changes.get("jitterMs", self.jitter_ms))
        self.error_rate = float(changes.get("errorRate", self.error_rate))
        self.error_code = int(changes.get("errorCode", self.error_code))
        self.verbs = list(changes.get("verbs", self.verbs))
        self.resources = list(changes.get("resources", self.resources))
        self.set_blackhole(bool(changes.get("blackhole", self.blackhole)))

    def reset(self) -> None:
        self.update(
            {
                "latencyMs": 0,
                "jitterMs": 0,
                "errorRate": 0,
                "errorCode": 500,
                "verbs": [],
                "resources": [],
                "blackhole": False,
            }
        )

    def set_blackhole(self, on: bool) -> None:
        self.blackhole = on
        if self.healed is None:
            self.healed = asyncio.Event()
        if on:
            self.healed.clear()
        else:
            self.healed.set()

    def _applies(self, verb: str, resource: str) -> bool:
        return (not self.verbs or verb in self.verbs) and (
            not self.resources or resource in self.resources
        )

    async def before(self, verb: str, resource: str) -> None:
        """Delay, hold or fail a request as configured."""
        if self.blackhole and self.healed is not None:
            await self.healed.wait()
        if not self._applies(verb, resource):
            return
        delay = self.latency_ms + (random.uniform(0, self.jitter_ms) if self.jitter_ms else 0.0)
        if delay > 0:
            await asyncio.sleep(delay / 1000)
        if self.error_rate and random.random() < self.error_rate:
            code = self.error_code
            reason = {503: "ServiceUnavailable", 504: "Timeout", 429: "TooManyRequests"}.get(
                code, "InternalError"
            )
            raise ApiError(
                code,
                reason,
                "Internal error occurred: injected fault"
                if code == 500
                else f"injected fault ({code})",
                headers={"Retry-After": "1"} if code in (429, 503) else {},
            )
