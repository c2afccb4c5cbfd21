"""What the planner reads (a cluster's admitted workloads, flavors and
topologies) and what it returns (the actions, in order)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, order=True)
class Ref:
    """Names one object on a member: what the planner compares and acts on."""

    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Ref:
        meta = obj.get("metadata") or {}
        return cls(str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}".replace(" /", " ")


@dataclass(frozen=True)
class WorkloadView:
    """A central workload as the reconciler sees it (its read-model row)."""

    namespace: str
    name: str
    uid: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, Any] = field(default_factory=dict)
    #: The row's resource version: with the uid it names one content of the
    #: row (every event moves it), so what :func:`desired` makes of the
    #: workload is kept between passes; ``None``: nothing kept.
    version: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def state(self) -> str:
        return str(self.status.get("state", "Pending"))

    @property
    def admission(self) -> Mapping[str, Any]:
        return self.status.get("admission") or {}


@dataclass(frozen=True)
class ClusterView:
    """What the centre wants of one cluster: workloads admitted to it (or
    leaving it), and the flavors and topologies they name."""

    cluster: str
    workloads: Sequence[WorkloadView]
    flavors: Mapping[str, Mapping[str, Any]]
    topologies: Mapping[str, Mapping[str, Any]]
    #: Central ClusterQueue specs by name: their resource groups are mirrored.
    cluster_queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The Cluster's uid, labelled on every object written (none if empty).
    cluster_uid: str = ""
    #: ``kueue`` or ``volcano``: which admission objects mirror the centre there.
    backend: str = "kueue"
    #: A Volcano member's islands that are tier-1 HyperNodes, with their
    #: nodes (the inventory's): pods are pinned to them by hostname.
    hyper_islands: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass
class Actions:
    """In order: delete jobs (and wait until gone), apply queue objects,
    dispatch new jobs, collect unused queue objects, then record."""

    delete: list[Ref] = field(default_factory=list)
    #: Admission ids of the jobs deleted or still terminating: their pods
    #: (labelled with it) must be gone before anything new is dispatched.
    draining: list[str] = field(default_factory=list)
    apply: list[Obj] = field(default_factory=list)
    dispatch: list[Obj] = field(default_factory=list)
    #: On a Volcano member, the PodGroup of each job dispatched (by the
    #: job's ``str(Ref)``): applied just before it.
    groups: dict[str, Obj] = field(default_factory=dict)
    collect: list[Ref] = field(default_factory=list)
    #: Serving member objects whose replica count the centre lowered, with
    #: the new count: scaled in place before anything is dispatched.
    scale_down: list[tuple[Ref, int]] = field(default_factory=list)
    #: ... and raised: scaled with the dispatch, once the queues hold them.
    scale_up: list[tuple[Ref, int]] = field(default_factory=list)
    #: The pods each scaled-down object may keep (by admission label): what
    #: it ran beyond that must be gone before anything new is dispatched.
    shrinking: dict[str, int] = field(default_factory=dict)
    #: Workloads evicted from this cluster whose job is gone: back to Pending.
    requeue: list[str] = field(default_factory=list)
    #: Workloads cancelled while here whose job is gone: Cancelled.
    cancelled: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any(
            (
                self.delete,
                self.draining,
                self.apply,
                self.dispatch,
                self.collect,
                self.scale_down,
                self.scale_up,
                self.requeue,
                self.cancelled,
            )
        )
