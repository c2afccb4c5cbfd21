"""Invariants every cycle result must satisfy, whatever the scenario.

Used by the scenario runner (on every scenario) and by the Hypothesis state
machine (after every step). Each check returns a list of human-readable
violations so that a failing test says what broke.
"""

from __future__ import annotations

from collections.abc import Mapping

from service.domain.inventory import Node
from service.domain.workload import AdmittedWorkload, PodSetAssignment, Workload
from service.engine import CycleResult, Snapshot
from service.engine.quota import QuotaTree
from service.engine.state import CycleState
from service.engine.types import DEFAULT_ACCELERATORS


def apply(snapshot: Snapshot, result: CycleResult, now: float) -> list[AdmittedWorkload]:
    """The admitted set after the cycle: old ones minus victims/evictions, plus admissions."""
    gone = {p.workload for p in result.preemptions} | {e.workload for e in result.evictions}
    pending = {w.key: w for w in snapshot.pending}
    kept = [a for a in snapshot.admitted if a.workload.key not in gone]
    for decision in result.admissions:
        kept.append(
            AdmittedWorkload(
                workload=pending[decision.workload],
                admission=decision.admission,
                admitted_at=now,
            )
        )
    return kept


def violations(snapshot: Snapshot, result: CycleResult, now: float) -> list[str]:
    problems: list[str] = []
    problems += _whole_gangs(snapshot, result)
    problems += _no_duplicates(snapshot, result)
    problems += _capacity(snapshot, result, now)
    problems += _quota(snapshot, result, now)
    problems += _accounted(snapshot, result)
    problems += _island_classes(snapshot, result, now)
    return problems


def _island_classes(snapshot: Snapshot, result: CycleResult, now: float) -> list[str]:
    """An island holds one class at a time, unless a ClusterQueue mixes
    (``service.engine.island_classes``): a gang of a plain ClusterQueue never
    shares an accelerator island with another plain gang of the other class,
    nor lands on an island labelled for it."""
    nodes = {n.name: n for n in snapshot.nodes}
    mixed = {cq.name for cq in snapshot.cluster_queues if cq.mixed_islands}
    held: dict[tuple[str, str], set[str]] = {}
    placed: list[tuple[str, str, tuple[str, str]]] = []
    for admitted in apply(snapshot, result, now):
        wl, admission = admitted.workload, admitted.admission
        for assignment in admission.pod_set_assignments:
            for node_name, _ in assignment.placement:
                node = nodes.get(node_name)
                if node is None:
                    continue
                island = (node.cluster, node.island)
                labelled = node.labels.get("quartermaster.dev/workload-class")
                plain = admission.cluster_queue not in mixed
                if plain and labelled is not None and labelled != wl.workload_class:
                    problems = f"{wl.key}: {wl.workload_class} on {labelled} island {island}"
                    return [problems]
                accelerated = any(node.allocatable.get(a, 0) > 0 for a in DEFAULT_ACCELERATORS)
                if plain and accelerated:
                    held.setdefault(island, set()).add(wl.workload_class)
                    placed.append((wl.key, wl.workload_class, island))
    return [
        f"{key}: {cls} shares island {island} with {sorted(held[island] - {cls})}"
        for key, cls, island in placed
        if held[island] - {cls}
    ]


def _whole_gangs(snapshot: Snapshot, result: CycleResult) -> list[str]:
    problems = []
    pending = {w.key: w for w in snapshot.pending}
    nodes = {n.name: n for n in snapshot.nodes}
    clusters = {c.name: c for c in snapshot.clusters}
    for decision in result.admissions:
        wl = pending.get(decision.workload)
        if wl is None:
            problems.append(f"{decision.workload} admitted but not pending")
            continue
        cluster = clusters.get(decision.admission.cluster)
        if cluster is None or not cluster.schedulable:
            problems.append(
                f"{wl.key} admitted to unschedulable cluster {decision.admission.cluster}"
            )
        by_name = {a.name: a for a in decision.admission.pod_set_assignments}
        problems += _groups_share_an_island(wl, by_name, nodes)
        for ps in wl.pod_sets:
            assignment = by_name.get(ps.name)
            if assignment is None:
                problems.append(f"{wl.key}: pod set {ps.name} missing")
                continue
            placed = sum(p for _, p in assignment.placement)
            if placed != ps.count:
                problems.append(f"{wl.key}/{ps.name}: {placed} of {ps.count} pods placed")
            islands = set()
            for node_name, _ in assignment.placement:
                node = nodes.get(node_name)
                if node is None or node.cluster != decision.admission.cluster:
                    problems.append(f"{wl.key}: pod on {node_name} outside its cluster")
                    continue
                if not node.schedulable:
                    problems.append(f"{wl.key}: pod on unschedulable node {node_name}")
                islands.add(node.island)
            if ps.topology_request and ps.topology_request.mode == "required" and len(islands) > 1:
                problems.append(f"{wl.key}/{ps.name}: required one island, got {sorted(islands)}")
    return problems


def _groups_share_an_island(
    wl: Workload, by_name: Mapping[str, PodSetAssignment], nodes: Mapping[str, Node]
) -> list[str]:
    """Pod sets of one ``podSetGroupName`` with a required topology: one island."""
    islands: dict[str, set[tuple[str, str]]] = {}
    for ps in wl.pod_sets:
        request = ps.topology_request
        assignment = by_name.get(ps.name)
        if request is None or request.group is None or request.mode != "required":
            continue
        for node_name, _ in assignment.placement if assignment else ():
            node = nodes.get(node_name)
            if node is not None:
                islands.setdefault(request.group, set()).add((node.cluster, node.island))
    return [
        f"{wl.key}: pod-set group {group} spans islands {sorted(found)}"
        for group, found in islands.items()
        if len(found) > 1
    ]


def _no_duplicates(snapshot: Snapshot, result: CycleResult) -> list[str]:
    problems = []
    keys = [d.workload for d in result.admissions]
    if len(keys) != len(set(keys)):
        problems.append(f"admitted twice: {keys}")
    already = {a.workload.key for a in snapshot.admitted}
    for key in keys:
        if key in already:
            problems.append(f"{key} admitted while already admitted")
    victims = [p.workload for p in result.preemptions]
    if len(victims) != len(set(victims)):
        problems.append(f"preempted twice: {victims}")
    for key in victims:
        if key not in already:
            problems.append(f"{key} preempted but was not admitted")
    for preemption in result.preemptions:
        if preemption.preemptor not in keys:
            problems.append(
                f"{preemption.workload} preempted for {preemption.preemptor}, not admitted"
            )
    return problems


def _capacity(snapshot: Snapshot, result: CycleResult, now: float) -> list[str]:
    """Per node, pods of admitted gangs never exceed allocatable minus reserved."""
    before: dict[str, dict[str, int]] = {}
    after: dict[str, dict[str, int]] = {}
    for target, admitted in (
        (before, list(snapshot.admitted)),
        (after, apply(snapshot, result, now)),
    ):
        for adm in admitted:
            requests = {ps.name: ps.requests for ps in adm.workload.pod_sets}
            for assignment in adm.admission.pod_set_assignments:
                for node_name, pods in assignment.placement:
                    bucket = target.setdefault(node_name, {})
                    for r, a in requests.get(assignment.name, {}).items():
                        bucket[r] = bucket.get(r, 0) + a * pods
    problems = []
    for node in snapshot.nodes:
        used = after.get(node.name, {})
        for r, a in used.items():
            limit = node.allocatable.get(r, 0) - node.reserved.get(r, 0)
            previously = before.get(node.name, {}).get(r, 0)
            if a > limit and a > previously:
                problems.append(f"node {node.name}: {r} {a} > {limit}")
    return problems


def _quota(snapshot: Snapshot, result: CycleResult, now: float) -> list[str]:
    """Every ClusterQueue that got an admission stays within what the tree allows."""
    state = CycleState(
        Snapshot(
            cluster_queues=snapshot.cluster_queues,
            resource_flavors=snapshot.resource_flavors,
            cohorts=snapshot.cohorts,
            local_queues=snapshot.local_queues,
            clusters=snapshot.clusters,
            nodes=snapshot.nodes,
            admitted=tuple(apply(snapshot, result, now)),
            config=snapshot.config,
        ),
        now,
    )
    tree: QuotaTree = state.tree
    problems = []
    touched = {d.cluster_queue for d in result.admissions}
    for name in sorted(touched):
        node = tree.cluster_queues[name]
        for fr in node.usage:
            if node.available(fr) < 0:
                problems.append(f"ClusterQueue {name}: {fr} over quota by {-node.available(fr)}")
    return problems


def _accounted(snapshot: Snapshot, result: CycleResult) -> list[str]:
    """Every pending workload is either admitted or has a pending reason, never both."""
    admitted = {d.workload for d in result.admissions}
    problems = []
    for wl in snapshot.pending:
        if wl.key in admitted and wl.key in result.pending:
            problems.append(f"{wl.key} both admitted and pending")
        if wl.key not in admitted and wl.key not in result.pending:
            problems.append(f"{wl.key} neither admitted nor given a pending reason")
    return problems
