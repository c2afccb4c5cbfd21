"""Watches on member clusters: a change there wakes the fleet loop for that
cluster at once, instead of at its next periodic resync.

A watch here is a hint, never the record: the pass it triggers lists what it
needs (workers/sync.py), so a missed event costs latency, not correctness.
Each stream resumes from the last resourceVersion it saw (bookmarks
included); a ``410 Gone`` (the member compacted past it) starts again from a
fresh list, and wakes the loop since something may have been missed. A
cluster that cannot be reached is retried with a capped backoff.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from workers.clusters import KINDS, Member

log = logging.getLogger(__name__)

#: What a watch follows: Nodes (inventory) and member Kueue Workloads (every
#: job kind's PodsReady, Finished and Evicted show there).
WATCHED = ("Node", "Workload")
#: On a Volcano member: Nodes and the PodGroups, whose phases sync reads.
VOLCANO_WATCHED = ("Node", "PodGroup")


def watched(backend: str) -> tuple[str, ...]:
    return VOLCANO_WATCHED if backend == "volcano" else WATCHED


_WINDOW = 60  # seconds a watch request stays open before it is renewed
_BACKOFF_MAX = 5.0


def _version(obj: Any) -> str | None:
    if isinstance(obj, dict):
        return (obj.get("metadata") or {}).get("resourceVersion")
    meta = getattr(obj, "metadata", None)
    return getattr(meta, "resource_version", None)


class Stream:
    """One resumable watch of one kind on one member cluster."""

    def __init__(
        self, member: Member, kind: str, wake: Callable[[], None], stop: threading.Event
    ) -> None:
        self.member = member
        self.kind = kind
        self.wake = wake
        self.stop = stop
        self.version: str | None = None
        self.events = 0
        self.relists = 0
        self._watch: Any = None

    def _call(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        member: Any = self.member
        if self.kind == "Node":
            return kubernetes.client.CoreV1Api(member.api).list_node, ()
        k = KINDS[self.kind]
        api = kubernetes.client.CustomObjectsApi(member.api)
        return api.list_cluster_custom_object, (k.group, k.version, k.plural)

    def _list(self) -> None:
        """A fresh starting point: the list's own resourceVersion."""
        func, args = self._call()
        self.member.limiter.acquire()
        raw: Any = func(*args, _preload_content=False, _request_timeout=self.member.timeout)
        self.version = (json.loads(raw.data).get("metadata") or {}).get("resourceVersion")
        self.relists += 1

    def run(self) -> None:
        backoff = 0.25
        while not self.stop.is_set():
            try:
                if self.version is None:
                    self._list()
                    self.wake()
                self._follow()
                backoff = 0.25
            except ApiException as error:
                if error.status == 410:
                    log.info("%s %s watch expired; listing again", self.member.name, self.kind)
                    self.version = None
                    continue
                log.debug("%s %s watch: %s", self.member.name, self.kind, error)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
            except Exception as error:  # unreachable, reset, timed out: try again later
                log.debug("%s %s watch: %r", self.member.name, self.kind, error)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)

    def _follow(self) -> None:
        func, args = self._call()
        watch_module: Any = kubernetes.watch
        self._watch = watch_module.Watch()
        self.member.limiter.acquire()
        stream = self._watch.stream(
            func,
            *args,
            resource_version=self.version,
            allow_watch_bookmarks=True,
            timeout_seconds=_WINDOW,
            _request_timeout=(self.member.timeout[0], _WINDOW + 5),
        )
        for event in stream:
            if self.stop.is_set():
                self._watch.stop()
                return
            version = _version(event.get("object") if isinstance(event, dict) else None)
            if version is None and isinstance(event, dict):
                version = _version(event.get("raw_object"))
            if version:
                self.version = version
            if event.get("type") != "BOOKMARK":
                self.events += 1
                self.wake()

    def close(self) -> None:
        """Stop, and unblock a read waiting for the next event."""
        watch = self._watch
        if watch is not None:
            watch.stop()
            response = getattr(watch, "_resp", None)
            if response is not None and hasattr(response, "shutdown"):
                with contextlib.suppress(OSError):  # already closed by the other side
                    response.shutdown()


class ClusterWatch:
    """The streams of one member cluster, each in a daemon thread."""

    def __init__(
        self, member: Member, wake: Callable[[], None], kinds: tuple[str, ...] = WATCHED
    ) -> None:
        self.member = member
        self.kinds = kinds
        self.stop = threading.Event()
        self.streams = [Stream(member, kind, wake, self.stop) for kind in kinds]
        self.threads = [
            threading.Thread(target=s.run, name=f"watch-{member.name}-{s.kind}", daemon=True)
            for s in self.streams
        ]
        for thread in self.threads:
            thread.start()

    def close(self, wait: float = 2.0) -> None:
        self.stop.set()
        for stream in self.streams:
            stream.close()
        for thread in self.threads:
            thread.join(wait)


__all__ = ["VOLCANO_WATCHED", "WATCHED", "ClusterWatch", "Stream", "watched"]
