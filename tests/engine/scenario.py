"""Scenario files: the engine's specification, one YAML file per case.

A scenario holds a fleet in the format of :mod:`sim.fleet` (``topologies``,
``resourceFlavors``, ``clusters``, ``cohorts``, ``clusterQueues``,
``localQueues``, ``workloadPriorityClasses``, ``namespaces``), optional
``config`` (``fairSharing``, ``admissionFairSharing``, ``waitForPodsReady``,
``maxHeadsPerClusterQueue``, ``spreadPacking``, ``servingIslandsFirst``) and
``now``, the ``admitted`` and ``pending`` workloads, and what must come out under ``expect``.

Conveniences so that files stay short and read like the spec:

* no ``clusters``: one cluster ``c1`` with one huge node per flavor, so only
  quota matters (the upstream Kueue cases);
* no ``resourceFlavors``: every flavor named by a ClusterQueue, without labels;
* a ClusterQueue without ``namespaceSelector`` admits every namespace
  (``{}``), unlike a bare Kueue manifest — write ``namespaceSelector: null``
  to get Kueue's nil;
* a workload may name ``clusterQueue: X`` instead of ``queue``: a LocalQueue
  ``X`` pointing to it is created in the workload's namespace;
* a serving workload's replica is a unit of its own: ``replica`` (its index;
  its key is ``name#index``) and ``minReplicas``;
* ``requests`` + ``count`` (+ ``topology``) describe a single pod set ``main``;
  a ``topology`` may name a ``group`` (Kueue's ``podSetGroupName``);
* an admitted workload may give ``admittedAt`` and ``lastCheckpoint`` (seconds,
  like ``now``; none: it never saved its work);
* an admitted workload's ``admission`` gives ``cluster`` (default: the first),
  ``flavors`` (resource → flavor) and optionally ``nodes`` (node → pods); when
  nodes are omitted the pods are placed first-fit on nodes of that flavor.

``nodeOverrides`` (node → ``ready`` / ``unschedulable``),
``localQueueUsage`` (``ns/lq`` → ``consumed``, ``lastUpdate``) and
``preemptionBudgets`` (ClusterQueue → ``tokens``, ``lastUpdate``) set node state,
admission fair-sharing history and preemption token buckets; ``config`` may
also hold ``consolidation`` (``enable``, ``victimPlacement``) and
``reservation`` (``enable``, ``minAccelerators``, ``minWaitSeconds``),
``spareIslandGangs`` and ``protectIslandGangs``.

``expect`` keys: ``admitted`` (key → optional ``cluster``, ``flavors``,
``islands``, ``nodes``, ``borrowed``), ``preempted`` (list of ``workload``,
``reason``, optional ``preemptor``), ``evicted`` (``workload``, ``reason``,
optional ``requeueAt``, ``deactivated``), ``pending`` (key → optional
``reason``, ``message`` (substring), ``position``, ``localPosition``, ``cause``
(``null``: none), ``fragmentation`` (``requested``, ``fleetFree``, ``largestFree``,
``largestIsland``)), ``preemptionBudgets`` (ClusterQueue → tokens after the
cycle); a ``preempted`` entry may give ``workDestroyed`` and ``budgeted``.
Workload keys may omit the ``default/`` namespace.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from service.domain.manifests import label_selector_from_manifest, toleration_from_manifest
from service.domain.quantity import canonical_resources
from service.domain.quota import LocalQueue
from service.domain.workload import (
    Admission,
    AdmittedWorkload,
    PodSet,
    PodSetAssignment,
    RequeueState,
    TopologyRequest,
    Workload,
)
from service.engine import (
    AdmissionFairSharingConfig,
    ConsolidationConfig,
    EngineConfig,
    FairSharingConfig,
    LocalQueueUsage,
    PreemptionBudgetState,
    ReservationConfig,
    Snapshot,
    WaitForPodsReadyConfig,
)
from sim.fleet import Fleet, fleet_from_mapping

SCENARIOS = Path(__file__).parent / "scenarios"
HUGE = "1P"  # effectively unbounded; within the int64 milli-units Kubernetes can count


@dataclass
class Scenario:
    path: Path
    name: str
    data: dict[str, Any]
    snapshot: Snapshot
    now: float
    expect: dict[str, Any] = field(default_factory=dict)


def _name(name: object) -> str:
    if not isinstance(name, str):
        # YAML 1.1 reads bare on/off/yes/no as booleans: quote such names.
        raise TypeError(f"workload name {name!r} is not a string (quote it in the YAML)")
    return name


def key_of(name: str) -> str:
    name = _name(name)
    return name if "/" in name else f"default/{name}"


def _all_resources(data: dict[str, Any]) -> set[str]:
    resources: set[str] = set()
    for section in ("clusterQueues", "cohorts"):
        for obj in data.get(section) or []:
            for group in obj.get("resourceGroups") or []:
                resources.update(group.get("coveredResources") or [])
                for flavor in group.get("flavors") or []:
                    resources.update(r["name"] for r in flavor.get("resources") or [])
    for section in ("admitted", "pending"):
        for wl in data.get(section) or []:
            resources.update((wl.get("requests") or {}).keys())
            for ps in wl.get("podSets") or []:
                resources.update((ps.get("requests") or {}).keys())
    return resources


def _flavor_names(data: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for section in ("clusterQueues", "cohorts"):
        for obj in data.get(section) or []:
            for group in obj.get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    if flavor["name"] not in names:
                        names.append(flavor["name"])
    return names


def _fleet_data(data: dict[str, Any]) -> dict[str, Any]:
    fleet = {
        k: copy.deepcopy(data[k])
        for k in (
            "topologies",
            "resourceFlavors",
            "clusters",
            "cohorts",
            "clusterQueues",
            "localQueues",
            "workloadPriorityClasses",
            "namespaces",
        )
        if k in data
    }
    if "resourceFlavors" not in fleet:
        fleet["resourceFlavors"] = [{"name": n} for n in _flavor_names(data)]
    if "clusters" not in fleet:
        allocatable = dict.fromkeys(sorted(_all_resources(data)), HUGE)
        fleet["clusters"] = [
            {
                "name": "c1",
                "nodeGroups": [
                    {
                        "flavor": f["name"],
                        "islands": 1,
                        "nodesPerIsland": 1,
                        "allocatable": allocatable,
                    }
                    for f in fleet["resourceFlavors"]
                ],
            }
        ]
    for cq in fleet.get("clusterQueues") or []:
        spec = cq.get("spec", cq)
        spec.setdefault("namespaceSelector", {})
    queues = {(lq.get("namespace"), lq["name"]) for lq in fleet.get("localQueues") or []}
    for section in ("admitted", "pending"):
        for wl in data.get(section) or []:
            if "clusterQueue" in wl:
                ns = wl.get("namespace", "default")
                if (ns, wl["clusterQueue"]) not in queues:
                    queues.add((ns, wl["clusterQueue"]))
                    fleet.setdefault("localQueues", []).append(
                        {
                            "namespace": ns,
                            "name": wl["clusterQueue"],
                            "clusterQueue": wl["clusterQueue"],
                        }
                    )
    return fleet


def _pod_sets(wl: dict[str, Any]) -> tuple[PodSet, ...]:
    specs = wl.get("podSets") or [
        {
            "name": "main",
            "count": wl.get("count", 1),
            "requests": wl.get("requests") or {},
            "topology": wl.get("topology"),
            "tolerations": wl.get("tolerations"),
            "nodeSelector": wl.get("nodeSelector"),
        }
    ]
    result = []
    for ps in specs:
        topology = None
        if ps.get("topology"):
            t = ps["topology"]
            mode = next(m for m in ("required", "preferred", "unconstrained") if m in t)
            level = t[mode] if isinstance(t[mode], str) else None
            topology = TopologyRequest(mode=mode, level=level, group=t.get("group"))
        result.append(
            PodSet(
                name=ps.get("name", "main"),
                count=int(ps.get("count", 1)),
                requests=canonical_resources(ps.get("requests") or {}),
                topology_request=topology,
                tolerations=tuple(toleration_from_manifest(t) for t in ps.get("tolerations") or ()),
                node_selector={str(k): str(v) for k, v in (ps.get("nodeSelector") or {}).items()},
            )
        )
    return tuple(result)


def _workload(wl: dict[str, Any], index: int) -> Workload:
    requeue = wl.get("requeueState")
    return Workload(
        namespace=wl.get("namespace", "default"),
        name=_name(wl["name"]),
        queue_name=wl.get("queue") or wl.get("clusterQueue") or "main",
        pod_sets=_pod_sets(wl),
        creation_time=float(wl.get("created", index)),
        priority=wl.get("priority"),
        priority_class_name=wl.get("priorityClass"),
        workload_class=wl.get("class", "training"),
        cluster_selector=label_selector_from_manifest(wl.get("clusterSelector")),
        active=wl.get("active", True),
        requeue_state=RequeueState(
            count=requeue.get("count", 0), requeue_at=requeue.get("requeueAt")
        )
        if requeue
        else None,
        queued_at=wl.get("queuedAt"),
        replica=wl.get("replica"),
        min_replicas=int(wl.get("minReplicas", 0)),
    )


def _admitted(
    wl_data: dict[str, Any], wl: Workload, fleet: Fleet, used: dict[str, dict[str, int]]
) -> AdmittedWorkload:
    admission = wl_data["admission"]
    lq = next(
        (q for q in fleet.local_queues if q.namespace == wl.namespace and q.name == wl.queue_name),
        None,
    )
    cq = admission.get("clusterQueue") or (lq.cluster_queue if lq else wl_data.get("clusterQueue"))
    cluster = admission.get("cluster") or fleet.clusters[0].cluster.name
    assignments = []
    for ps in wl.pod_sets:
        per_ps = (admission.get("podSets") or {}).get(ps.name, admission)
        flavors = per_ps.get("flavors") or {}
        if isinstance(flavors, str):
            flavors = dict.fromkeys(ps.requests, flavors)
        flavors = {r: flavors.get(r) or next(iter(flavors.values())) for r in ps.requests}
        nodes = per_ps.get("nodes")
        if nodes is None:
            nodes = _first_fit(fleet, cluster, set(flavors.values()), ps, used)
        else:
            for name, pods in nodes.items():
                bucket = used.setdefault(name, {})
                for r, a in ps.requests.items():
                    bucket[r] = bucket.get(r, 0) + a * pods
        placement = tuple((str(n), int(p)) for n, p in nodes.items())
        islands = tuple(dict.fromkeys(_island_of(fleet, n) for n, _ in placement))
        assignments.append(
            PodSetAssignment(
                name=ps.name,
                count=ps.count,
                flavors=flavors,
                resource_usage={r: a * ps.count for r, a in ps.requests.items()},
                placement=placement,
                islands=islands,
            )
        )
    return AdmittedWorkload(
        workload=wl,
        admission=Admission(
            cluster_queue=cq, cluster=cluster, pod_set_assignments=tuple(assignments)
        ),
        admitted_at=float(wl_data.get("admittedAt", 0)),
        pods_ready=wl_data.get("podsReady"),
        last_checkpoint=_optional_float(wl_data.get("lastCheckpoint")),
    )


def _island_of(fleet: Fleet, node_name: str) -> str:
    for node in fleet.nodes():
        if node.name == node_name:
            return node.island
    return ""


def _first_fit(
    fleet: Fleet, cluster: str, flavors: set[str], ps: PodSet, used: dict[str, dict[str, int]]
) -> dict[str, int]:
    result: dict[str, int] = {}
    need = ps.count
    for node in fleet.nodes(cluster):
        if node.flavor not in flavors:
            continue
        bucket = used.setdefault(node.name, {})
        while need and all(
            node.allocatable.get(r, 0) - bucket.get(r, 0) >= a for r, a in ps.requests.items()
        ):
            for r, a in ps.requests.items():
                bucket[r] = bucket.get(r, 0) + a
            result[node.name] = result.get(node.name, 0) + 1
            need -= 1
        if not need:
            return result
    raise ValueError(f"cannot place admitted pod set {ps.name} in {cluster}")


def _config(data: dict[str, Any]) -> EngineConfig:
    cfg = data.get("config") or {}
    fs = cfg.get("fairSharing") or {}
    afs = cfg.get("admissionFairSharing") or {}
    ready = cfg.get("waitForPodsReady") or {}
    return EngineConfig(
        fair_sharing=FairSharingConfig(
            enable=bool(fs.get("enable", False)),
            preemption_strategies=tuple(fs.get("preemptionStrategies") or ())
            or FairSharingConfig().preemption_strategies,
            prioritize_non_borrowing=bool(fs.get("prioritizeNonBorrowing", True)),
        ),
        admission_fair_sharing=AdmissionFairSharingConfig(
            enable=bool(afs.get("enable", True)),
            usage_half_life_seconds=float(afs.get("usageHalfLifeSeconds", 7 * 24 * 3600)),
            usage_sampling_interval_seconds=float(afs.get("usageSamplingIntervalSeconds", 300)),
            resource_weights=afs.get("resourceWeights") or {},
        ),
        wait_for_pods_ready=WaitForPodsReadyConfig(
            enable=bool(ready.get("enable", False)),
            timeout_seconds=float(ready.get("timeoutSeconds", 300)),
            backoff_base_seconds=float(ready.get("backoffBaseSeconds", 60)),
            backoff_max_seconds=float(ready.get("backoffMaxSeconds", 3600)),
            backoff_limit_count=ready.get("backoffLimitCount"),
        ),
        max_heads_per_cluster_queue=cfg.get("maxHeadsPerClusterQueue"),
        spread_packing=cfg.get("spreadPacking", "IslandFirst"),
        consolidation=ConsolidationConfig(
            enable=bool((cfg.get("consolidation") or {}).get("enable", False)),
            victim_placement=(cfg.get("consolidation") or {}).get("victimPlacement", "Immediate"),
        ),
        serving_islands_first=bool(cfg.get("servingIslandsFirst", True)),
        reservation=_reservation(cfg.get("reservation") or {}),
        spare_island_gangs=bool(cfg.get("spareIslandGangs", False)),
    )


def _reservation(cfg: dict[str, Any]) -> ReservationConfig:
    return ReservationConfig(
        enable=bool(cfg.get("enable", False)),
        min_accelerators=int(cfg.get("minAccelerators", 1)),
        min_wait_seconds=float(cfg.get("minWaitSeconds", 0)),
    )


def build(data: dict[str, Any], path: Path | None = None) -> Scenario:
    fleet = fleet_from_mapping(_fleet_data(data))
    namespaces = dict(fleet.namespaces)
    for section in ("admitted", "pending"):
        for wl in data.get(section) or []:
            namespaces.setdefault(wl.get("namespace", "default"), {})
    used: dict[str, dict[str, int]] = {}
    admitted = []
    for i, wl in enumerate(data.get("admitted") or []):
        workload = _workload(wl, -1000 + i)
        admitted.append(_admitted(wl, workload, fleet, used))
    pending = [_workload(wl, i) for i, wl in enumerate(data.get("pending") or [])]
    lqs: list[LocalQueue] = list(fleet.local_queues)
    overrides = data.get("nodeOverrides") or {}
    nodes = tuple(
        dataclasses.replace(
            n,
            ready=overrides.get(n.name, {}).get("ready", n.ready),
            unschedulable=overrides.get(n.name, {}).get("unschedulable", n.unschedulable),
        )
        for n in fleet.nodes()
    )
    usage = {
        key_of(k): LocalQueueUsage(
            consumed=canonical_resources(v.get("consumed") or {}),
            last_update=float(v.get("lastUpdate", data.get("now", 1000))),
        )
        for k, v in (data.get("localQueueUsage") or {}).items()
    }
    snapshot = Snapshot(
        cluster_queues=fleet.cluster_queues,
        resource_flavors=fleet.resource_flavors,
        cohorts=fleet.cohorts,
        local_queues=lqs,
        priority_classes=fleet.priority_classes,
        topologies=fleet.topologies,
        clusters=fleet.cluster_objects(),
        nodes=nodes,
        admitted=tuple(admitted),
        pending=tuple(pending),
        namespaces=namespaces,
        local_queue_usage=usage,
        config=_config(data),
        preemption_budgets={
            name: PreemptionBudgetState(
                tokens=float(v["tokens"]), last_update=float(v.get("lastUpdate", 0))
            )
            for name, v in (data.get("preemptionBudgets") or {}).items()
        },
    )
    return Scenario(
        path=path or Path("<inline>"),
        name=str(data.get("name") or (path.stem if path else "inline")),
        data=data,
        snapshot=snapshot,
        now=float(data.get("now", 1000)),
        expect=data.get("expect") or {},
    )


def load(path: Path) -> Scenario:
    with path.open(encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    return build(data, path)


def all_scenario_paths() -> list[Path]:
    return sorted(SCENARIOS.glob("*.yaml"))


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
