"""In-memory object storage with one global resourceVersion, history and watchers.

It plays etcd plus the API server's watch cache: every write takes the next
revision of a single counter (so resourceVersions order all writes, as etcd's
revision does), each resource keeps a bounded history of its change events to
resume watches and serve consistent ``continue`` pages, and a request older
than that history gets ``410 Expired`` exactly where a compacted etcd would.

Everything here runs on the server's event loop thread; stored objects are
never mutated in place (a write stores a new dict), so readers may hold them.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import orjson

from sim.kubesim.errors import expired
from sim.kubesim.resources import ResourceType

__all__ = ["ADDED", "DELETED", "MODIFIED", "Collection", "Event", "Store", "Watcher", "clone"]

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

Obj = dict[str, Any]
Key = tuple[str, str]


_T = TypeVar("_T")


def clone(value: _T) -> _T:
    """A deep copy of JSON-shaped data (several times faster than ``copy.deepcopy``).

    ``marshal`` copies in C; format 2 because later formats keep shared references
    shared, and a copy must never alias a mutable part of the original.
    """
    if isinstance(value, (dict, list)):
        try:
            return cast(_T, marshal.loads(marshal.dumps(value, 2)))
        except ValueError:  # something marshal cannot write: copy it the slow way
            return _clone(value)
    return value


def _clone(value: _T) -> _T:
    if isinstance(value, dict):
        return cast(
            _T, {k: _clone(v) if isinstance(v, (dict, list)) else v for k, v in value.items()}
        )
    if isinstance(value, list):
        return cast(_T, [_clone(v) if isinstance(v, (dict, list)) else v for v in value])
    return value


def object_key(obj: Obj) -> Key:
    metadata = obj["metadata"]
    return metadata.get("namespace") or "", metadata["name"]


@dataclass(slots=True)
class Event:
    """A change to one object; ``prev`` is its state before (``None`` for ADDED)."""

    type: str
    rv: int
    obj: Obj
    prev: Obj | None
    key: Key


class Watcher:
    """One watch stream's inbox: events are pushed synchronously, read asynchronously.

    A watcher that falls ``max_backlog`` events behind is closed, as the real
    API server does with a slow consumer; the client re-watches from its last
    resourceVersion.
    """

    def __init__(self, accept: Callable[[Event], bool], max_backlog: int = 50_000) -> None:
        self.accept = accept
        self.pending: deque[Event] = deque()
        self.ready = asyncio.Event()
        self.closed = False
        self.max_backlog = max_backlog

    def push(self, event: Event) -> None:
        if self.closed or not self.accept(event):
            return
        if len(self.pending) >= self.max_backlog:
            self.close()
            return
        self.pending.append(event)
        self.ready.set()

    def close(self) -> None:
        self.closed = True
        self.ready.set()

    async def next_batch(self, timeout: float) -> list[Event]:
        if not self.pending and not self.closed:
            self.ready.clear()
            # A timeout returns what is pending, not ``[]``: an event pushed
            # while the timeout was being handled would otherwise sit behind
            # the bookmark an empty batch sends (at the store's newest
            # revision), and a client resuming from it would never see it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), timeout)
        batch = list(self.pending)
        self.pending.clear()
        return batch


@dataclass(slots=True)
class Collection:
    """All objects of one resource type, with its change history and watchers."""

    rtype: ResourceType
    history_size: int
    objects: dict[Key, Obj] = field(default_factory=dict)
    history: deque[Event] = field(default_factory=deque)
    #: Events with ``rv <= compacted_rv`` have left the history.
    compacted_rv: int = 0
    watchers: set[Watcher] = field(default_factory=set)
    #: The JSON of stored objects as last served: key → (object, apiVersion, bytes).
    encoded: dict[Key, tuple[Obj, str, bytes]] = field(default_factory=dict)

    def record(self, event: Event) -> None:
        if len(self.history) >= self.history_size:
            self.compacted_rv = self.history.popleft().rv
        self.history.append(event)
        for watcher in tuple(self.watchers):
            watcher.push(event)

    def events_after(self, rv: int) -> list[Event]:
        """Every event with a revision above ``rv``; 410 when some already left the history."""
        if rv < self.compacted_rv:
            raise expired(f"too old resource version: {rv} ({self.compacted_rv + 1})")
        return [event for event in self.history if event.rv > rv]

    def state_at(self, rv: int) -> dict[Key, Obj]:
        """The objects as they were at revision ``rv`` (for consistent paging)."""
        later = self.events_after(rv)
        state = dict(self.objects)
        for event in reversed(later):
            if event.prev is None:
                state.pop(event.key, None)
            else:
                state[event.key] = event.prev
        return state


Listener = Callable[[ResourceType, Event], None]


class Store:
    """The cluster's objects. ``history_size`` bounds each resource's event history."""

    def __init__(self, types: Iterable[ResourceType], history_size: int = 10_000) -> None:
        self.rv = 0
        self.collections: dict[str, Collection] = {
            t.key: Collection(t, history_size) for t in types
        }
        self.listeners: list[Listener] = []

    def collection(self, rtype: ResourceType) -> Collection:
        return self.collections[rtype.key]

    def get(self, rtype: ResourceType, namespace: str, name: str) -> Obj | None:
        return self.collections[rtype.key].objects.get((namespace, name))

    def items(self, rtype: ResourceType, namespace: str = "") -> list[Obj]:
        """Current objects in key order (namespace, name), optionally of one namespace."""
        objects = self.collections[rtype.key].objects
        keys = sorted(objects) if not namespace else sorted(k for k in objects if k[0] == namespace)
        return [objects[k] for k in keys]

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def encoded(self, rtype: ResourceType, obj: Obj, api_version: str) -> bytes | None:
        """``obj`` as JSON served at ``api_version`` (orjson's compact text), or ``None``
        where orjson cannot write it.

        Remembered for the object stored now, so that a write's response, its watch
        events and later lists encode it once (as the real watch cache's cachingObject
        does): stored objects are never mutated in place, so the text stays true until
        a write stores another object under the key.
        """
        collection = self.collections[rtype.key]
        key = object_key(obj)
        hit = collection.encoded.get(key)
        if hit is not None and hit[0] is obj and hit[1] == api_version:
            return hit[2]
        shown = obj if obj.get("apiVersion") == api_version else {**obj, "apiVersion": api_version}
        try:
            text = orjson.dumps(shown)
        except TypeError:
            return None
        if collection.objects.get(key) is obj:
            collection.encoded[key] = (obj, api_version, text)
        return text

    def write(self, rtype: ResourceType, obj: Obj) -> Event:
        """Store ``obj`` (created or replaced) at the next revision; returns the event."""
        collection = self.collections[rtype.key]
        key = object_key(obj)
        prev = collection.objects.get(key)
        rv = self.next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        collection.objects[key] = obj
        event = Event(ADDED if prev is None else MODIFIED, rv, obj, prev, key)
        self._publish(collection, event)
        return event

    def remove(self, rtype: ResourceType, obj: Obj) -> Event:
        """Delete ``obj``; the DELETED event carries its last state at a new revision."""
        collection = self.collections[rtype.key]
        key = object_key(obj)
        prev = collection.objects.pop(key)
        collection.encoded.pop(key, None)
        rv = self.next_rv()
        final = dict(obj)
        final["metadata"] = {**obj["metadata"], "resourceVersion": str(rv)}
        event = Event(DELETED, rv, final, prev, key)
        self._publish(collection, event)
        return event

    def _publish(self, collection: Collection, event: Event) -> None:
        collection.record(event)
        for listener in self.listeners:
            listener(collection.rtype, event)
