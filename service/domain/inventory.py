"""The fleet's physical inventory: member clusters and their nodes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from service.domain.quota import Taint

__all__ = ["HOSTNAME_LABEL", "Cluster", "Node"]

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class Cluster:
    """A member cluster. Unhealthy (lease expired) or cordoned clusters take no new gangs."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    healthy: bool = True
    cordoned: bool = False

    @property
    def schedulable(self) -> bool:
        return self.healthy and not self.cordoned


@dataclass(frozen=True, slots=True)
class Node:
    """One node of a member cluster, in one flavor and one fabric island.

    ``island`` is the value of the flavor topology's island level label (or a
    synthetic per-cluster group id when the flavor has no topology).
    ``reserved`` is capacity taken by pods Quartermaster does not manage
    (daemon sets, system pods); capacity of admitted gangs is *not* reported
    here: the engine derives it from the admissions in the snapshot.
    """

    name: str
    cluster: str
    flavor: str
    island: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    reserved: Mapping[str, int] = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable
