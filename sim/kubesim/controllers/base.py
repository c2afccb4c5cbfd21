"""What every in-cluster controller shares: a work queue fed by store events, timers,
writes through the API core, conditions, events and resource arithmetic.

Controllers are level-based like real ones: an event only names a key; the
reconcile reads the current state from the store and writes what differs.
Writes go through :class:`~sim.kubesim.api.ApiCore` (validation, managedFields,
resourceVersions, watch events) and no-op writes are dropped there, so a
reconcile that finds nothing to do emits nothing and the loop settles.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from service.domain.quantity import QuantityError, canonical_amount
from sim.kubesim.api import Admission, Context, Resource, now_rfc3339
from sim.kubesim.errors import ApiError
from sim.kubesim.resources import ResourceType
from sim.kubesim.store import Event, clone

if TYPE_CHECKING:
    from sim.kubesim.cluster import SimCluster

__all__ = [
    "EventRecorder",
    "Reconciler",
    "condition",
    "container_requests",
    "owner_reference",
    "parse_duration",
    "pod_requests",
    "set_condition",
]

log = logging.getLogger("sim.kubesim.controllers")
Obj = dict[str, Any]

#: Keys handled per loop iteration before yielding to the HTTP server.
_BATCH = 200
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


class Reconciler:
    """A keyed work queue drained on the event loop; subclasses implement :meth:`reconcile`."""

    name = "controller"
    manager = "kube-controller-manager"
    #: Resource keys (``pods``, ``jobs.batch``) whose events enqueue the object's own key.
    watches: tuple[str, ...] = ()

    def __init__(self, cluster: SimCluster, loop: asyncio.AbstractEventLoop) -> None:
        self.cluster = cluster
        self.core = cluster.core
        self.store = cluster.store
        self.loop = loop
        self.ctx = Context(user=f"system:{self.name}", manager=self.manager)
        self.types = {t.key: t for t in cluster.types}
        self.queue: dict[Hashable, None] = {}
        self.timers: dict[Hashable, asyncio.TimerHandle] = {}
        self.scheduled = False
        self.stopped = False
        self.events = EventRecorder(self)
        self.store.listeners.append(self._observe)
        self._webhooks: list[Admission] = []

    def serve_webhook(self, hook: Admission) -> None:
        """Admit every write (and delete) through ``hook`` while this controller runs,
        as its webhook would: registered with the API here, removed by :meth:`stop`."""
        self.core.admission.append(hook)
        self._webhooks.append(hook)

    # -- queue -----------------------------------------------------------------------------

    def _observe(self, rtype: ResourceType, event: Event) -> None:
        if self.stopped:
            return
        for key in self.keys_for(rtype.key, event):
            self.enqueue(key)

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key in self.watches:
            yield (resource_key, *event.key)

    def enqueue(self, key: Hashable) -> None:
        self.queue[key] = None
        if not self.scheduled and not self.stopped:
            self.scheduled = True
            self.loop.call_soon(self._drain)

    def enqueue_after(self, key: Hashable, delay: float) -> None:
        existing = self.timers.pop(key, None)
        if existing is not None:
            existing.cancel()
        self.timers[key] = self.loop.call_later(max(0.0, delay), self._fire, key)

    def _fire(self, key: Hashable) -> None:
        self.timers.pop(key, None)
        self.enqueue(key)

    def _drain(self) -> None:
        self.scheduled = False
        for _ in range(_BATCH):
            if not self.queue or self.stopped:
                return
            key = next(iter(self.queue))
            del self.queue[key]
            try:
                self.reconcile(key)
            except ApiError as error:
                if error.code not in (404, 409):
                    log.warning("%s: %s: %s", self.name, key, error)
                self.enqueue_after(key, 0.05)
            except Exception:
                log.exception("%s: reconciling %s failed", self.name, key)
                self.enqueue_after(key, 0.5)
        if self.queue and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._drain)

    def reconcile(self, key: Hashable) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopped = True
        for hook in self._webhooks:
            if hook in self.core.admission:
                self.core.admission.remove(hook)
        self._webhooks.clear()
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        if self._observe in self.store.listeners:
            self.store.listeners.remove(self._observe)

    # -- API helpers -----------------------------------------------------------------------

    def scaled(self, seconds: float) -> float:
        return seconds * self.cluster.options.time_scale

    def resource(self, key: str) -> Resource:
        return self.core.storage(self.types[key])

    def get(self, key: str, namespace: str, name: str) -> Obj | None:
        return self.store.get(self.types[key], namespace, name)

    def items(self, key: str, namespace: str = "") -> list[Obj]:
        return self.store.items(self.types[key], namespace)

    def create(self, key: str, obj: Obj) -> Obj:
        resource = self.resource(key)
        namespace = obj["metadata"].get("namespace", "") if resource.rtype.namespaced else ""
        return self.core.create(resource, namespace, obj, self.ctx)

    def update(self, key: str, obj: Obj, *, status: bool = False) -> Obj:
        metadata = obj["metadata"]
        return self.core.update(
            self.resource(key),
            metadata.get("namespace", ""),
            metadata["name"],
            obj,
            self.ctx,
            "status" if status else "",
        )

    def mutate(
        self, key: str, obj: Obj, change: Callable[[Obj], None], *, status: bool = False
    ) -> Obj:
        """Write ``change`` applied to a copy of ``obj`` (a no-op write changes nothing)."""
        updated = clone(obj)
        change(updated)
        return self.update(key, updated, status=status)

    def delete(self, key: str, obj: Obj, propagation: str = "Background") -> None:
        metadata = obj["metadata"]
        try:
            self.core.delete(
                self.resource(key),
                metadata.get("namespace", ""),
                metadata["name"],
                self.ctx,
                propagation=propagation,
            )
        except ApiError as error:
            if error.code != 404:
                raise


class EventRecorder:
    """Writes core/v1 Events about objects, aggregating repeats into ``count``."""

    def __init__(self, controller: Reconciler) -> None:
        self.controller = controller
        self.component = controller.name

    def emit(self, obj: Obj, kind: str, reason: str, message: str, type_: str = "Normal") -> None:
        metadata = obj["metadata"]
        namespace = metadata.get("namespace") or "default"
        digest = hashlib.sha1(f"{metadata.get('uid')}/{reason}/{message}".encode()).hexdigest()[:16]
        name = f"{metadata['name']}.{digest}"
        now = now_rfc3339()
        existing = self.controller.get("events", namespace, name)
        try:
            if existing is not None:
                self.controller.mutate(
                    "events",
                    existing,
                    lambda e: e.update(count=e.get("count", 1) + 1, lastTimestamp=now),
                )
                return
            self.controller.create(
                "events",
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": name, "namespace": namespace},
                    "involvedObject": {
                        "apiVersion": obj.get("apiVersion", ""),
                        "kind": kind,
                        "name": metadata["name"],
                        "namespace": metadata.get("namespace", ""),
                        "uid": metadata.get("uid", ""),
                        "resourceVersion": metadata.get("resourceVersion", ""),
                    },
                    "reason": reason,
                    "message": message,
                    "type": type_,
                    "source": {"component": self.component},
                    "reportingComponent": self.component,
                    "reportingInstance": self.component,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                },
            )
        except ApiError as error:
            log.debug("event %s/%s not recorded: %s", namespace, name, error)


# -- conditions ----------------------------------------------------------------------------


def condition(obj: Obj, type_: str) -> Obj | None:
    entry: Obj
    for entry in (obj.get("status") or {}).get("conditions") or ():
        if entry.get("type") == type_:
            return entry
    return None


def is_true(obj: Obj, type_: str) -> bool:
    entry = condition(obj, type_)
    return entry is not None and entry.get("status") == "True"


def set_condition(
    status: Obj,
    type_: str,
    value: str,
    reason: str,
    message: str,
    *,
    observed_generation: int | None = None,
    probe_times: bool = False,
) -> None:
    """Set a condition in ``status``, keeping ``lastTransitionTime`` when the status holds."""
    conditions = status.setdefault("conditions", [])
    now = now_rfc3339()
    for entry in conditions:
        if entry.get("type") == type_:
            if entry.get("status") != value:
                entry["lastTransitionTime"] = now
            entry.update(status=value, reason=reason, message=message)
            if probe_times:
                entry["lastProbeTime"] = now
            if observed_generation is not None:
                entry["observedGeneration"] = observed_generation
            return
    entry = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }
    if probe_times:
        entry["lastProbeTime"] = now
    if observed_generation is not None:
        entry["observedGeneration"] = observed_generation
    conditions.append(entry)


# -- resources -----------------------------------------------------------------------------


def _amounts(values: dict[str, Any] | None) -> dict[str, int]:
    result: dict[str, int] = {}
    for name, value in (values or {}).items():
        try:
            result[name] = canonical_amount(name, value)
        except QuantityError:
            continue
    return result


def container_requests(container: Obj) -> dict[str, int]:
    """Requests, a limit standing in for a missing request (a pod template keeps only
    the limit; the Pod made from it requests it too)."""
    resources = container.get("resources") or {}
    return _amounts({**(resources.get("limits") or {}), **(resources.get("requests") or {})})


def pod_requests(spec: Obj) -> dict[str, int]:
    """Effective requests of one pod: containers summed, init containers as a floor."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or ():
        for name, amount in container_requests(container).items():
            total[name] = total.get(name, 0) + amount
    for container in spec.get("initContainers") or ():
        for name, amount in container_requests(container).items():
            total[name] = max(total.get(name, 0), amount)
    for name, amount in _amounts(spec.get("overhead")).items():
        total[name] = total.get(name, 0) + amount
    return total


def owner_reference(owner: Obj, *, block: bool = True) -> Obj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": block,
    }


def controller_of(obj: Obj) -> Obj | None:
    ref: Obj
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return ref
    return None


def parse_duration(text: str | None) -> float | None:
    """Seconds in a Go duration (``90s``, ``1h30m``, ``250ms``) or a bare number.

    ``None`` when absent.
    """
    if text is None or str(text).strip() == "":
        return None
    value = str(text).strip()
    try:
        return float(value)
    except ValueError:
        pass
    total, consumed = 0.0, 0
    for match in _DURATION.finditer(value):
        number, unit = float(match[1]), match[2]
        total += number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
        consumed += len(match[0])
    return total if consumed == len(value) else None
