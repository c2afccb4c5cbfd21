"""Garbage collection by ownerReferences, and namespace termination.

The real cluster does both in kube-controller-manager, asynchronously after the
write that triggers them; so do we: a store listener records what changed and
the work runs on the next loop iteration. Background deletion removes
dependents after the owner is gone; foreground deletion keeps the owner (with
its ``foregroundDeletion`` finalizer) until its dependents are gone; a
terminating namespace is emptied, then removed. Events expire after
``event_ttl`` seconds, as with kube-apiserver's ``--event-ttl`` (1 h by default),
so that a long-running cluster does not grow without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from sim.kubesim.api import ApiCore, Context
from sim.kubesim.errors import ApiError
from sim.kubesim.resources import ResourceType
from sim.kubesim.store import DELETED, Event, clone

__all__ = ["EventExpiry", "GarbageCollector"]

Ref = tuple[str, str, str]  # (resource key, namespace, name)


class GarbageCollector:
    def __init__(self, core: ApiCore, loop: asyncio.AbstractEventLoop) -> None:
        self.core = core
        self.loop = loop
        self.ctx = Context(
            user="system:serviceaccount:kube-system:generic-garbage-collector",
            manager="kube-controller-manager",
        )
        self.dependents: dict[str, set[Ref]] = defaultdict(set)
        #: uid -> object, for every object that exists (an owner that still exists keeps
        #: its dependents, whatever happens to the other dependents).
        self.alive: dict[str, Ref] = {}
        self.types = {t.key: t for t in core.types}
        self.gone: set[str] = set()
        self.foreground: set[Ref] = set()
        self.namespaces: set[str] = set()
        self.scheduled = False
        core.store.listeners.append(self.observe)

    def observe(self, rtype: ResourceType, event: Event) -> None:
        metadata = event.obj["metadata"]
        ref = (rtype.key, metadata.get("namespace") or "", metadata["name"])
        self._index(event, ref)
        if event.type == DELETED:
            self.alive.pop(metadata["uid"], None)
            self.gone.add(metadata["uid"])
            for owner in metadata.get("ownerReferences") or ():
                self.gone.add(owner.get("uid", ""))  # re-check a foreground owner
        else:
            self.alive[metadata["uid"]] = ref
        if event.type != DELETED and metadata.get("deletionTimestamp"):
            if rtype.key == "namespaces":
                self.namespaces.add(metadata["name"])
            elif "foregroundDeletion" in (metadata.get("finalizers") or ()):
                self.foreground.add(ref)
        if rtype.namespaced and metadata.get("namespace") in self._terminating():
            self.namespaces.add(metadata["namespace"])
        self._schedule()

    def _terminating(self) -> set[str]:
        return self.namespaces

    def _index(self, event: Event, ref: Ref) -> None:
        before = {
            o.get("uid")
            for o in (event.prev or {}).get("metadata", {}).get("ownerReferences") or ()
        }
        after = (
            set()
            if event.type == DELETED
            else {o.get("uid") for o in event.obj["metadata"].get("ownerReferences") or ()}
        )
        for uid in before - after:
            self.dependents[uid].discard(ref)
        for uid in after - before:
            self.dependents[uid].add(ref)

    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        self.scheduled = False
        gone, self.gone = self.gone, set()
        for uid in gone:
            self._collect(uid)
        for ref in list(self.foreground):
            self._finish_foreground(ref)
        for namespace in list(self.namespaces):
            self._finish_namespace(namespace)

    def _delete(self, ref: Ref) -> None:
        rtype = self.types[ref[0]]
        # Already gone, or refused because it is terminating: either way nothing left to do.
        with contextlib.suppress(ApiError):
            self.core.delete(
                self.core.storage(rtype), ref[1], ref[2], self.ctx, propagation="Background"
            )

    def _collect(self, uid: str) -> None:
        # An owner that still exists keeps its dependents (one being deleted in the
        # foreground lets them go in _finish_foreground): only a vanished owner's are collected.
        if not uid or uid in self.alive:
            return
        for ref in list(self.dependents.get(uid, ())):
            self._delete(ref)
        self.dependents.pop(uid, None)

    def _finish_foreground(self, ref: Ref) -> None:
        rtype = self.types[ref[0]]
        obj = self.core.store.get(rtype, ref[1], ref[2])
        if obj is None or "foregroundDeletion" not in (obj["metadata"].get("finalizers") or ()):
            self.foreground.discard(ref)
            return
        remaining = self.dependents.get(obj["metadata"]["uid"], set())
        for dependent in list(remaining):
            self._delete(dependent)
        if not self.dependents.get(obj["metadata"]["uid"]):
            self.foreground.discard(ref)
            updated = clone(obj)
            updated["metadata"]["finalizers"] = [
                f for f in obj["metadata"]["finalizers"] if f != "foregroundDeletion"
            ]
            self.core.update(self.core.storage(rtype), ref[1], ref[2], updated, self.ctx)

    def _finish_namespace(self, namespace: str) -> None:
        ns_type = self.types["namespaces"]
        ns = self.core.store.get(ns_type, "", namespace)
        if ns is None:
            self.namespaces.discard(namespace)
            return
        remaining = 0
        for rtype in self.core.types:
            if not rtype.namespaced:
                continue
            for obj in self.core.store.items(rtype, namespace):
                remaining += 1
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete((rtype.key, namespace, obj["metadata"]["name"]))
        if remaining == 0 or not any(
            self.core.store.items(t, namespace) for t in self.core.types if t.namespaced
        ):
            self.namespaces.discard(namespace)
            self.core.store.remove(ns_type, ns)


class EventExpiry:
    """Deletes core/v1 Events whose ``lastTimestamp`` is older than ``ttl`` seconds."""

    def __init__(self, core: ApiCore, loop: asyncio.AbstractEventLoop, ttl: float) -> None:
        self.core = core
        self.loop = loop
        self.ttl = ttl
        self.rtype = next(t for t in core.types if t.key == "events")
        self.ctx = Context(user="system:apiserver", manager="kube-apiserver")
        self._timer: asyncio.TimerHandle | None = loop.call_later(self._interval(), self.sweep)

    def _interval(self) -> float:
        return max(0.05, min(60.0, self.ttl / 4))

    def sweep(self) -> None:
        cutoff = (datetime.now(UTC) - timedelta(seconds=self.ttl)).strftime("%Y-%m-%dT%H:%M:%SZ")
        resource = self.core.storage(self.rtype)
        for event in self.core.store.items(self.rtype):
            stamp = event.get("lastTimestamp") or event["metadata"].get("creationTimestamp", "")
            # RFC 3339 in UTC with a fixed width: text order is time order.
            if stamp and stamp < cutoff:
                metadata = event["metadata"]
                with contextlib.suppress(ApiError):
                    self.core.delete(resource, metadata["namespace"], metadata["name"], self.ctx)
        self._timer = self.loop.call_later(self._interval(), self.sweep)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
