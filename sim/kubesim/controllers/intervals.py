"""Every pod's running intervals, as the kubelet ran them: what a test
compares across members to prove no gang ran in two clusters at once
(tests/workers/test_fencing_partition.py), and with the ledger's ``ran``
(tests/workers/test_usage_invariant.py). A pod runs from its phase turning
``Running`` on a node until it is terminal or gone; times are the host's
wall clock, which every stand-in on one machine shares.

A transition the kubelet makes (start, end) is stamped by it: the record
keeps the kubelet's instant, and the pod's own timestamps are that instant
truncated to the second (:func:`second`), as a real kubelet's are. A pod
removed while still running (no kubelet ended it) ends at its removal."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sim.kubesim.controllers.base import pod_requests
from sim.kubesim.resources import ResourceType
from sim.kubesim.store import DELETED, Event

__all__ = ["RunningIntervals", "second"]


def second(instant: float) -> str:
    """``instant`` (seconds since the epoch) as a Kubernetes timestamp: RFC
    3339, truncated to the whole second."""
    return datetime.fromtimestamp(int(instant), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunningIntervals:
    """A store listener: one record per pod that ran, kept for the process' life."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.records: list[dict[str, Any]] = []
        self._open: dict[str, dict[str, Any]] = {}
        self._stamps: dict[str, float] = {}

    @contextmanager
    def stamped(self, uid: str, instant: float) -> Iterator[None]:
        """A transition of pod ``uid`` written meanwhile happened at
        ``instant`` (the one its timestamps carry), not when it is seen."""
        self._stamps[uid] = instant
        try:
            yield
        finally:
            self._stamps.pop(uid, None)

    def _now(self, uid: str) -> float:
        return self._stamps.get(uid) or self.clock()

    def observe(self, rtype: ResourceType, event: Event) -> None:
        if rtype.key != "pods":
            return
        pod = event.obj
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        running = (
            event.type != DELETED
            and (pod.get("status") or {}).get("phase") == "Running"
            and bool((pod.get("spec") or {}).get("nodeName"))
        )
        record = self._open.get(uid)
        if running and record is None:
            record = {
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "uid": uid,
                "node": pod["spec"]["nodeName"],
                "labels": dict(meta.get("labels") or {}),
                "requests": pod_requests(pod["spec"]),
                "start": self._now(uid),
                "end": None,
            }
            self._open[uid] = record
            self.records.append(record)
        elif not running and record is not None:
            record["end"] = self._now(uid)
            del self._open[uid]

    def snapshot(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.records]
