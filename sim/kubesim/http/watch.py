"""Watches: newline-delimited JSON events over chunked transfer encoding, with history
replay, ``sendInitialEvents``, bookmarks and the watch's timeout, as the real server's."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from service.jsonio import dumps
from sim.kubesim.api.paging import matches
from sim.kubesim.errors import ApiError
from sim.kubesim.http.request import Receive, Request, Send, Target, selectable_fields, wants_table
from sim.kubesim.http.response import start_stream
from sim.kubesim.selectors import parse_field_selector, parse_label_selector
from sim.kubesim.store import ADDED, DELETED, MODIFIED, Event, Watcher
from sim.kubesim.tables import table

if TYPE_CHECKING:
    from sim.kubesim.cluster import SimCluster

__all__ = ["WatchSession", "serve_watch"]


async def serve_watch(
    cluster: SimCluster, target: Target, request: Request, receive: Receive, send: Send
) -> None:
    """Answer one watch request until it times out, the client leaves or the server stops."""
    session = WatchSession(cluster, target, request)
    try:
        initial = session.open()
    except ApiError as error:
        # An expired resourceVersion is an ERROR event on a 200 stream, as from the watch cache.
        await start_stream(send)
        line = dumps({"type": "ERROR", "object": error.body()}) + b"\n"
        await send({"type": "http.response.body", "body": line, "more_body": False})
        return
    await start_stream(send)
    disconnected = asyncio.Event()
    listener = asyncio.ensure_future(wait_disconnect(receive, disconnected, session.watcher))
    try:
        await session.stream(send, initial, disconnected)
    finally:
        listener.cancel()
        session.close()


class WatchSession:
    """One watch request: initial state or history replay, then live events and bookmarks."""

    def __init__(self, cluster: SimCluster, target: Target, request: Request) -> None:
        self.cluster = cluster
        self.target = target
        self.resource = target.resource
        self.labels = parse_label_selector(request.query.get("labelSelector"))
        self.fields = parse_field_selector(
            request.query.get("fieldSelector"), selectable_fields(self.resource)
        )
        self.namespace = target.namespace
        self.name = self.fields.exact("metadata.name") or ""
        self.rv = request.query.get("resourceVersion", "")
        self.bookmarks = request.flag("allowWatchBookmarks")
        self.send_initial = request.flag("sendInitialEvents")
        self.table = wants_table(request)
        self.include = request.query.get("includeObject", "Metadata")
        timeout = request.query.get("timeoutSeconds")
        self.deadline = time.monotonic() + (
            float(timeout) if timeout else cluster.options.max_watch_seconds
        )
        self.watcher = Watcher(self._in_scope)
        self.columns_sent = False
        self.last_rv = 0

    def _in_scope(self, event: Event) -> bool:
        key = event.key
        return (not self.namespace or key[0] == self.namespace) and (
            not self.name or key[1] == self.name
        )

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        return matches(obj, self.labels, self.fields)

    def open(self) -> list[tuple[str, dict[str, Any]]]:
        """Register the watcher and collect what precedes live events, atomically."""
        store = self.cluster.store
        collection = store.collection(self.resource.rtype)
        initial: list[tuple[str, dict[str, Any]]] = []
        if self.rv in ("", "0") or self.send_initial:
            for obj in store.items(self.resource.rtype, self.namespace):
                if (not self.name or obj["metadata"]["name"] == self.name) and self._matches(obj):
                    initial.append((ADDED, obj))
            self.last_rv = store.rv
        else:
            replay = collection.events_after(int(self.rv))
            for event in replay:
                if self._in_scope(event):
                    translated = self._translate(event)
                    if translated:
                        initial.append(translated)
            self.last_rv = int(self.rv)
        collection.watchers.add(self.watcher)
        self.cluster.watchers.add(self.watcher)
        return initial

    def close(self) -> None:
        self.cluster.store.collection(self.resource.rtype).watchers.discard(self.watcher)
        self.cluster.watchers.discard(self.watcher)

    def _translate(self, event: Event) -> tuple[str, dict[str, Any]] | None:
        now, before = self._matches(event.obj), self._matches(event.prev)
        if event.type == DELETED:
            return (DELETED, event.obj) if before or now else None
        if now and before:
            return MODIFIED, event.obj
        if now:
            return ADDED, event.obj
        if before and event.type == MODIFIED:
            return DELETED, event.obj
        return None

    def _encode(self, kind: str, obj: dict[str, Any]) -> bytes:
        if not self.table:
            text = self.cluster.store.encoded(self.resource.rtype, obj, self.resource.api_version)
            if text is not None:
                # ``kind`` is ADDED, MODIFIED or DELETED: nothing in it to escape.
                return b'{"type":"' + kind.encode() + b'","object":' + text + b"}\n"
        shown = self.cluster.core.present(self.resource, obj)
        if self.table:
            shown = table(
                self.resource.rtype,
                self.resource.version.name,
                [shown],
                shown["metadata"].get("resourceVersion", ""),
                self.include,
                with_columns=not self.columns_sent,
            )
            self.columns_sent = True
        return dumps({"type": kind, "object": shown}) + b"\n"

    def _bookmark(self, initial_end: bool = False) -> bytes:
        metadata: dict[str, Any] = {"resourceVersion": str(self.last_rv)}
        if initial_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {
            "kind": self.resource.rtype.kind,
            "apiVersion": self.resource.api_version,
            "metadata": metadata,
        }
        return dumps({"type": "BOOKMARK", "object": obj}) + b"\n"

    async def stream(
        self, send: Send, initial: list[tuple[str, dict[str, Any]]], disconnected: asyncio.Event
    ) -> None:
        chunk = b"".join(self._encode(kind, obj) for kind, obj in initial)
        if self.send_initial and self.bookmarks:
            chunk += self._bookmark(initial_end=True)
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        interval = self.cluster.options.bookmark_interval
        while not disconnected.is_set() and not self.watcher.closed:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                break
            batch = await self.watcher.next_batch(min(interval, remaining))
            if disconnected.is_set():
                break
            lines = []
            for event in batch:
                translated = self._translate(event)
                self.last_rv = event.rv
                if translated:
                    lines.append(self._encode(*translated))
            if not batch and self.bookmarks and not self.watcher.closed:
                self.last_rv = self.cluster.store.rv
                lines.append(self._bookmark())
            if lines:
                await send(
                    {"type": "http.response.body", "body": b"".join(lines), "more_body": True}
                )
        if not disconnected.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def wait_disconnect(receive: Receive, disconnected: asyncio.Event, watcher: Watcher) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            watcher.ready.set()
            return
