"""Where a gang fits: all of its pods at once, on nodes of one network-topology domain.

Pure functions over plain data. The gang plugin's rule (``pkg/scheduler/plugins/gang``)
is all ``minMember`` tasks or none; the allocate action's hard network topology
(``mode: hard``, ``highestTierAllowed: 1``) keeps a job inside one tier-1
HyperNode, tried in turn, the tightest fit first. Where the member has no
HyperNodes, the node's fabric-island label stands in for its tier-1 HyperNode.
Per pod, the fullest feasible node wins (binpack on GPUs), as the stand-in's
default scheduler packs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.kubesim.controllers.base import pod_requests
from sim.kubesim.controllers.scheduler import matches_node, node_ready, tolerates

__all__ = ["Domain", "NodeRoom", "Placement", "domains", "place_gang"]

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"


@dataclass(slots=True)
class NodeRoom:
    """A node and what is still free on it (``pods`` counts free pod slots)."""

    node: Obj
    free: dict[str, int]

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class Domain:
    """One tier-1 HyperNode (or island): a name and its nodes' names."""

    name: str
    nodes: frozenset[str]


@dataclass(slots=True)
class Placement:
    """A pod name → node name for every pod of the gang, or why it does not fit."""

    bound: dict[str, str] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)
    domain: str = ""

    @property
    def complete(self) -> bool:
        return not self.reasons


def _static_failure(node: Obj, spec: Obj) -> str | None:
    if (node.get("spec") or {}).get("unschedulable"):
        return "node(s) were unschedulable"
    tolerations = spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return "node(s) had untolerated taint"
    if not node_ready(node):
        return "node(s) were not ready"
    if not matches_node(spec, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def _shortfall(free: Mapping[str, int], requests: Mapping[str, int]) -> list[str]:
    missing = [n for n, amount in requests.items() if amount > 0 and amount > free.get(n, 0)]
    if free.get("pods", 0) < 1:
        missing.append("pods")
    return [("Too many pods" if n == "pods" else f"Insufficient {n}") for n in sorted(missing)]


def _place_one(pod: Obj, rooms: Sequence[NodeRoom], reasons: Counter[str]) -> NodeRoom | None:
    spec = pod.get("spec") or {}
    requests = pod_requests(spec)
    best: tuple[int, str] | None = None
    chosen: NodeRoom | None = None
    for room in rooms:
        failure = _static_failure(room.node, spec)
        problems = [failure] if failure else _shortfall(room.free, requests)
        if problems:
            reasons.update(problems)
            continue
        score = (room.free.get(GPU, 0) - requests.get(GPU, 0), room.name)
        if best is None or score < best:
            best, chosen = score, room
    if chosen is not None:
        for name, amount in requests.items():
            chosen.free[name] = chosen.free.get(name, 0) - amount
        chosen.free["pods"] = chosen.free.get("pods", 0) - 1
    return chosen


def _try(pods: Sequence[Obj], rooms: Sequence[NodeRoom], domain: str) -> Placement:
    trial = [NodeRoom(r.node, dict(r.free)) for r in rooms]
    placement = Placement(domain=domain)
    for pod in pods:
        reasons: Counter[str] = Counter()
        room = _place_one(pod, trial, reasons)
        if room is None:  # all or nothing: a gang that does not fit whole binds nothing
            return Placement(reasons=reasons or Counter({"no nodes": 1}), domain=domain)
        placement.bound[pod["metadata"]["name"]] = room.name
    return placement


def _slack(placement: Placement, rooms: Sequence[NodeRoom], pods: Sequence[Obj]) -> int:
    total = sum(r.free.get(GPU, 0) for r in rooms)
    return total - sum(pod_requests(p.get("spec") or {}).get(GPU, 0) for p in pods)


def place_gang(
    pods: Sequence[Obj], rooms: Sequence[NodeRoom], within: Sequence[Domain] | None
) -> Placement:
    """Every pod of ``pods`` on ``rooms`` — inside one of ``within`` when given — or a
    :class:`Placement` whose ``reasons`` say why not. Nothing in ``rooms`` changes."""
    if within is None:
        return _try(pods, rooms, "")
    best: Placement | None = None
    best_slack = 0
    last = Placement(reasons=Counter({"no network topology domain": 1}))
    for domain in within:
        members = [r for r in rooms if r.name in domain.nodes]
        placement = _try(pods, members, domain.name)
        if not placement.complete:
            last = placement
            continue
        slack = _slack(placement, members, pods)
        if best is None or slack < best_slack:
            best, best_slack = placement, slack
    return best or last


def _selected(member: Obj, node: Obj) -> bool:
    selector = member.get("selector") or {}
    name = str(node["metadata"]["name"])
    if "exactMatch" in selector:
        return bool(selector["exactMatch"].get("name") == name)
    if "regexMatch" in selector:
        return re.fullmatch(str(selector["regexMatch"].get("pattern", "")), name) is not None
    labels = node["metadata"].get("labels") or {}
    wanted = (selector.get("labelMatch") or {}).get("matchLabels") or {}
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def _hypernode_domains(hypernodes: Iterable[Obj], nodes: Sequence[Obj]) -> list[Domain]:
    found = []
    for hypernode in hypernodes:
        spec = hypernode.get("spec") or {}
        if int(spec.get("tier", 0)) != 1:
            continue
        members = [m for m in spec.get("members") or () if m.get("type", "Node") == "Node"]
        names = {n["metadata"]["name"] for n in nodes if any(_selected(m, n) for m in members)}
        found.append(Domain(hypernode["metadata"]["name"], frozenset(names)))
    return found


def _island_domains(nodes: Sequence[Obj], island_labels: Sequence[str]) -> list[Domain]:
    islands: dict[str, set[str]] = {}
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        island = next((labels[key] for key in island_labels if key in labels), None)
        if island is not None:
            islands.setdefault(island, set()).add(node["metadata"]["name"])
    return [Domain(name, frozenset(members)) for name, members in sorted(islands.items())]


def domains(
    hypernodes: Sequence[Obj], nodes: Sequence[Obj], island_labels: Sequence[str]
) -> list[Domain]:
    """The tier-1 domains: HyperNodes of tier 1, else the nodes' island label values."""
    return _hypernode_domains(hypernodes, nodes) or _island_domains(nodes, island_labels)
