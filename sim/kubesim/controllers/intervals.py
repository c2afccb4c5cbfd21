"""Every pod's running intervals, as the kubelet ran them: what a test
compares across members to prove no gang ran in two clusters at once
(tests/workers/test_fencing.py). A pod runs from its phase turning
``Running`` on a node until it is terminal or gone; times are the host's
wall clock, which every stand-in on one machine shares."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sim.kubesim.resources import ResourceType
from sim.kubesim.store import DELETED, Event

__all__ = ["RunningIntervals"]


class RunningIntervals:
    """A store listener: one record per pod that ran, kept for the process' life."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.records: list[dict[str, Any]] = []
        self._open: dict[str, dict[str, Any]] = {}

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
                "start": self.clock(),
                "end": None,
            }
            self._open[uid] = record
            self.records.append(record)
        elif not running and record is not None:
            record["end"] = self.clock()
            del self._open[uid]

    def snapshot(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.records]
