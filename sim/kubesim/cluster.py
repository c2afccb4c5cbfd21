"""One simulated member cluster: its API, its objects, its controllers and its faults.

:class:`SimCluster` is the composition root of the stand-in. It owns the store
and the :class:`~sim.kubesim.api.ApiCore`, the tokens, the discovery documents,
the fault switches, and — once :meth:`start` runs on an event loop — the
garbage collector and the controllers of its backend: Kueue-like (the default)
or, for a member started with ``backend="volcano"`` (or a fleet cluster with
``backend: volcano``), Volcano-like, serving Volcano's CRDs and not Kueue's. The HTTP server
(:mod:`sim.kubesim.server`) only adapts requests to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.fleet import BACKENDS, Fleet, load_fleet
from sim.kubesim import errors
from sim.kubesim.api import ApiCore, Context, now_rfc3339
from sim.kubesim.auth import Authorizer, User, groups_of
from sim.kubesim.discovery import Discovery
from sim.kubesim.faults import Faults
from sim.kubesim.gc import EventExpiry, GarbageCollector
from sim.kubesim.resources import (
    ResourceType,
    builtin_types,
    kueue_types,
    volcano_types,
    workload_types,
)
from sim.kubesim.seed import (
    SYSTEM_NAMESPACES,
    kueue_objects,
    namespace_objects,
    node_object,
    node_status,
    volcano_objects,
)
from sim.kubesim.store import Store, Watcher, clone

__all__ = ["ClusterOptions", "SimCluster"]

log = logging.getLogger("sim.kubesim")


@dataclass(slots=True)
class ClusterOptions:
    name: str = "kubesim"
    #: Fleet file (path or YAML text) whose nodes of ``name`` (or ``fleet_cluster``) are served.
    fleet: str | Path | None = None
    fleet_cluster: str | None = None
    #: Also create the fleet's namespaces and Kueue objects (no reconciler needed).
    seed_kueue: bool = False
    crds_dir: Path | None = None
    history_size: int = 10_000
    #: Multiplies every simulated duration (``0.01`` runs a "60s" job in 0.6 s).
    time_scale: float = 1.0
    bookmark_interval: float = 60.0
    max_watch_seconds: float = 1800.0
    default_field_validation: str = "Warn"
    #: Seconds an Event lives after its last occurrence (kube-apiserver ``--event-ttl``).
    event_ttl: float = 3600.0
    controllers: bool = True
    extra_objects: list[dict[str, Any]] = field(default_factory=list)
    #: ``kueue`` or ``volcano``; ``None``: the fleet cluster's ``backend`` (else ``kueue``).
    backend: str | None = None


class SimCluster:
    """State and behaviour of one member cluster (not yet bound to a socket)."""

    def __init__(self, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self.log = log
        self.fleet: Fleet | None = None
        self._fleet_data: dict[str, Any] = {}
        self._load_fleet()
        self.backend = self._backend()
        self.types: tuple[ResourceType, ...] = (
            builtin_types() + workload_types() + self._backend_types()
        )
        self.store = Store(self.types, self.options.history_size)
        self.core = ApiCore(
            self.types, self.store, default_field_validation=self.options.default_field_validation
        )
        self.auth = Authorizer()
        self.discovery = Discovery(self.types)
        self.faults = Faults()
        self.watchers: set[Watcher] = set()
        self.address = "127.0.0.1:0"
        self.system = Context(
            user="system:kube-controller-manager", manager="kube-controller-manager"
        )
        self.partition_hook: Callable[[float | None, str], None] | None = None
        self.heal_hook: Callable[[], None] | None = None
        self.controllers: list[Any] = []
        self._bootstrap()

    # -- set-up ----------------------------------------------------------------------------

    def _load_fleet(self) -> None:
        source = self.options.fleet
        if source is None:
            return
        text = Path(source).read_text(encoding="utf-8") if _is_path(source) else str(source)
        self.fleet = load_fleet(text)
        self._fleet_data = yaml.safe_load(text) or {}

    @property
    def fleet_cluster(self) -> str:
        return self.options.fleet_cluster or self.options.name

    def _backend(self) -> str:
        if self.options.backend is not None:
            if self.options.backend not in BACKENDS:
                raise ValueError(f"backend {self.options.backend!r}: not one of {BACKENDS}")
            return self.options.backend
        return self.fleet.backend(self.fleet_cluster) if self.fleet is not None else "kueue"

    def _backend_types(self) -> tuple[ResourceType, ...]:
        """A member serves its own backend's CRDs only, so discovery tells them apart."""
        if self.backend == "volcano":
            return volcano_types()
        return kueue_types(self.options.crds_dir)

    def _bootstrap(self) -> None:
        for name in SYSTEM_NAMESPACES:
            self.apply_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if self.fleet is not None:
            for node in self.fleet.nodes(self.fleet_cluster):
                created = self.apply_object(node_object(node))
                self.set_status(
                    "nodes", created, node_status(node, now_rfc3339(), ready=node.ready)
                )
        for obj in self._seed_objects():
            self.apply_object(obj)
        for obj in self.options.extra_objects:
            self.apply_object(obj)

    def _seed_objects(self) -> Iterable[dict[str, Any]]:
        """What the backend installs itself, then (``seed_kueue``) the fleet's queues."""
        if self.backend == "volcano":
            yield from volcano_objects()
            if self.options.seed_kueue:
                yield from namespace_objects(self._fleet_data)
        elif self.options.seed_kueue and self._fleet_data:
            yield from kueue_objects(self._fleet_data)

    def apply_object(self, obj: dict[str, Any], ctx: Context | None = None) -> dict[str, Any]:
        """Create ``obj`` (or return the existing one of that name) as the system."""
        resource = self.core.for_kind(obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"].get("namespace", "default") if resource.rtype.namespaced else ""
        existing = self.store.get(resource.rtype, namespace, obj["metadata"]["name"])
        if existing is not None:
            return existing
        return self.core.create(resource, namespace, obj, ctx or self.system)

    def set_status(
        self, plural: str, obj: dict[str, Any], status: dict[str, Any], group: str = ""
    ) -> dict[str, Any]:
        rtype = next(t for t in self.types if t.plural == plural and t.group == group)
        resource = self.core.storage(rtype)
        updated = clone(obj)
        updated["status"] = status
        metadata = obj["metadata"]
        return self.core.update(
            resource,
            metadata.get("namespace", ""),
            metadata["name"],
            updated,
            self.system,
            "status",
        )

    def add_user(
        self,
        name: str,
        rules: Iterable[dict[str, Any]] | None = None,
        *,
        token: str | None = None,
        admin: bool = False,
    ) -> str:
        """Register a bearer token; ``rules=None`` grants everything."""
        user = User(
            name=name,
            groups=groups_of(name),
            rules=None if rules is None else tuple(rules),
            admin=admin,
        )
        return self.auth.add(user, token)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the in-cluster controllers on ``loop`` (the server's loop)."""
        self.faults.set_blackhole(False)
        self.controllers.append(GarbageCollector(self.core, loop))
        self.controllers.append(EventExpiry(self.core, loop, self.options.event_ttl))
        if self.options.controllers:
            from sim.kubesim.controllers import start_controllers

            self.controllers.extend(start_controllers(self, loop))

    def stop(self) -> None:
        for watcher in list(self.watchers):
            watcher.close()
        self.faults.set_blackhole(False)
        for controller in self.controllers:
            stop = getattr(controller, "stop", None)
            if stop is not None:
                stop()
        self.controllers.clear()

    # -- admin -----------------------------------------------------------------------------

    async def admin(
        self, method: str, parts: list[str], body: dict[str, Any], query: dict[str, str]
    ) -> Any:
        """The ``/_admin/...`` endpoints: faults, partitions, node and pod failures, audit."""
        head = parts[0] if parts else ""
        if head == "faults":
            if method in ("PUT", "POST", "PATCH"):
                self.faults.update(body)
            elif method == "DELETE":
                self.faults.reset()
            return self.faults.as_dict()
        if head == "partition":
            return self._admin_partition(method, body)
        if head == "nodes" and len(parts) >= 3 and parts[2] == "ready":
            return self.set_node_ready(parts[1], bool(body.get("ready", True)))
        if head == "pods" and len(parts) >= 4 and parts[3] == "fail":
            return self.fail_pod(
                parts[1],
                parts[2],
                int(body.get("exitCode", 1)),
                body.get("reason", "Error"),
                body.get("message", ""),
            )
        if head == "audit":
            if method == "DELETE":
                self.auth.audit.clear()
                return {"cleared": True}
            user = query.get("user")
            return [vars(r) for r in self.auth.audit if user is None or r.user == user]
        if head == "rbac":
            return {"rules": self.auth.used_rules(query.get("user"))}
        if head == "tokens" and method == "POST":
            token = self.add_user(body["name"], body.get("rules"), admin=bool(body.get("admin")))
            return {"token": token}
        if head == "state":
            return self.summary()
        if head == "intervals":  # pods' running intervals, the kubelet's record
            hooks = (getattr(c, "running_intervals", None) for c in self.controllers)
            return next((hook() for hook in hooks if hook is not None), [])
        raise errors.ApiError(404, "NotFound", f"no admin endpoint {'/'.join(parts)}")

    def _admin_partition(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "DELETE":
            if self.heal_hook:
                self.heal_hook()
            return {"partitioned": False}
        if self.partition_hook is None:
            raise errors.ApiError(501, "NotImplemented", "this cluster is not served over TCP")
        seconds = body.get("seconds")
        self.partition_hook(
            float(seconds) if seconds is not None else None, body.get("mode", "refuse")
        )
        return {"partitioned": True, "seconds": seconds, "mode": body.get("mode", "refuse")}

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.options.name,
            "resourceVersion": self.store.rv,
            "objects": {
                key: len(c.objects) for key, c in self.store.collections.items() if c.objects
            },
            "watchers": len(self.watchers),
            "faults": self.faults.as_dict(),
        }

    # -- chaos -----------------------------------------------------------------------------

    def set_node_ready(self, name: str, ready: bool) -> dict[str, Any]:
        nodes = self.core.storage(next(t for t in self.types if t.key == "nodes"))
        node = self.core.get(nodes, "", name)
        for controller in self.controllers:
            hook = getattr(controller, "node_readiness_changed", None)
            if hook is not None:
                changed: dict[str, Any] = hook(node, ready)
                return changed
        return node

    def fail_pod(
        self, namespace: str, name: str, exit_code: int, reason: str, message: str
    ) -> dict[str, Any]:
        for controller in self.controllers:
            hook = getattr(controller, "fail_pod", None)
            if hook is not None:
                failed: dict[str, Any] = hook(namespace, name, exit_code, reason, message)
                return failed
        raise errors.ApiError(501, "NotImplemented", "controllers are not running")


def _is_path(source: str | Path) -> bool:
    if isinstance(source, Path):
        return True
    return "\n" not in source and Path(source).exists()
