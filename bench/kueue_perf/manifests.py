"""A config's objects as Quartermaster takes them: the central quotas
(Kueue's shapes, through the API), each workload's body, and the stand-ins'
fleet file, whose nodes hold more than the total quota so that quota decides.

Where Kueue's generator and our API differ, said here and in the results:

* priorities: Kueue's generator sets ``spec.priority`` on each Workload; our
  API takes a ``priorityClassName``, so each priority value is a
  WorkloadPriorityClass ``priority-<value>`` of that value;
* the flavor: Kueue's ``rf`` has no node labels (its run has no nodes); our
  inventory counts only nodes that carry a flavor's labels, so ``rf`` (and
  ``tas-flavor``, as in Kueue's TAS config) asks for ``tas-node-group: tas``
  and every stand-in node carries it;
* TAS ``balanced`` (Kueue's ``podSetSliceRequiredTopology`` with
  ``podSetSliceSize``): our API has no slices; those workloads ask for
  ``required`` at the rack level, which is stricter (every slice then lies in
  one rack) — :data:`UNSUPPORTED` says so in the results.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from bench.kueue_perf.configs import (
    BLOCK_LABEL,
    HOSTNAME_LABEL,
    RACK_LABEL,
    Arrival,
    Config,
    cq_name,
)
from tests.workers.stack import local_queue, manifest, pod_template

NODE_LABEL = {"tas-node-group": "tas"}
TOPOLOGY = "default-topology"
NODE_CPU = 96
NODE_MEMORY = "256Gi"
PODS_PER_NODE = 110  # the stand-in's default allocatable pods (sim/kubesim/seed.py)

UNSUPPORTED = {
    "balanced": (
        "Kueue's podSetSliceRequiredTopology + podSetSliceSize (slices of sliceSize pods, "
        "each in one rack) has no counterpart in our API; submitted as required at the "
        "rack level, which is stricter (the whole pod set in one rack)"
    )
}


def priority_class(value: int) -> str:
    return f"priority-{value}"


def central_objects(config: Config) -> list[dict[str, Any]]:
    """Topology, flavor, cohorts, priority classes, ClusterQueues and
    LocalQueues, in the order they refer to one another."""
    objects: list[dict[str, Any]] = []
    flavor_spec: dict[str, Any] = {"nodeLabels": dict(NODE_LABEL)}
    if config.topology is not None:
        levels = [{"nodeLabel": x} for x in (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)]
        objects.append(manifest("Topology", TOPOLOGY, {"levels": levels}))
        flavor_spec["topologyName"] = TOPOLOGY
    objects.append(manifest("ResourceFlavor", config.flavor, flavor_spec))
    objects += [manifest("Cohort", f"cohort-{c}", {}) for c in range(config.cohorts)]
    for value in sorted({c.priority for c in config.classes}):
        objects.append(
            {
                "apiVersion": "quartermaster.dev/v1",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": priority_class(value)},
                "value": value,
            }
        )
    for cohort in range(config.cohorts):
        for queue in range(config.queues):
            name = cq_name(queue, cohort)
            objects.append(cluster_queue(config, name, f"cohort-{cohort}"))
            objects.append(local_queue(name, name, name))
    return objects


def cluster_queue(config: Config, name: str, cohort: str) -> dict[str, Any]:
    cpu = {
        "name": "cpu",
        "nominalQuota": f"{config.nominal_milli}m",
        "borrowingLimit": f"{config.borrowing_limit_milli}m",
    }
    return manifest(
        "ClusterQueue",
        name,
        {
            "cohortName": cohort,
            "namespaceSelector": {},
            "preemption": {
                "reclaimWithinCohort": config.reclaim_within_cohort,
                "withinClusterQueue": config.within_cluster_queue,
            },
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": config.flavor, "resources": [cpu]}],
                }
            ],
        },
    )


def workload(arrival: Arrival) -> dict[str, Any]:
    """The Workload Kueue's generator creates, with the stand-in's run time
    (``quartermaster.dev/sim-duration``) for its pods."""
    cls = arrival.cls
    pod_set: dict[str, Any] = {
        "name": "main",
        "count": cls.pods,
        "template": pod_template({"cpu": f"{cls.request_milli}m"}, f"{cls.runtime_ms}ms"),
    }
    if cls.tas is not None:
        mode = "preferred" if cls.tas == "preferred" else "required"
        pod_set["topologyRequest"] = {mode: cls.tas_level}
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {
            "name": arrival.name,
            "labels": {"kueue.x-k8s.io/performance-scheduler-class": cls.name},
        },
        "spec": {
            "queueName": arrival.namespace,
            "priorityClassName": priority_class(cls.priority),
            "podSets": [pod_set],
        },
    }


def member_names(members: int) -> list[str]:
    return [f"m{i + 1}" for i in range(members)]


def node_count(config: Config, capacity_factor: float) -> int:
    """Nodes of 96 cpu for ``capacity_factor`` times the total nominal quota
    (Kueue's own topology for TAS), and pods enough for its smallest pods."""
    if config.topology is not None:
        t = config.topology
        return t.blocks * t.racks * t.nodes_per_rack
    quota_cpu = config.cluster_queues * config.nominal_milli / 1000
    smallest = min(c.request_milli for c in config.classes) / 1000
    by_cpu = math.ceil(capacity_factor * quota_cpu / NODE_CPU)
    by_pods = math.ceil(quota_cpu / smallest / PODS_PER_NODE)
    return max(by_cpu, by_pods)


def fleet_yaml(config: Config, members: int, nodes: int) -> str:
    """The stand-ins' fleet file (sim/fleet.py): ``nodes`` nodes split evenly
    over ``members`` (TAS: Kueue's racks, whole racks to a member)."""
    flavor: dict[str, Any] = {"name": config.flavor, "nodeLabels": dict(NODE_LABEL)}
    data: dict[str, Any] = {"resourceFlavors": [flavor]}
    per_member, racks = math.ceil(nodes / members), 1
    if config.topology is not None:
        t = config.topology
        data["topologies"] = [
            {"name": TOPOLOGY, "levels": [BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL]}
        ]
        flavor["topologyName"] = TOPOLOGY
        racks = max(1, math.ceil(t.racks * t.blocks / members))
        per_member = racks * t.nodes_per_rack

    def group() -> dict[str, Any]:
        return {
            "flavor": config.flavor,
            "islands": 1,
            "nodesPerIsland": per_member,
            "racksPerIsland": racks,
            "allocatable": {"cpu": NODE_CPU, "memory": NODE_MEMORY},
        }

    data["clusters"] = [{"name": n, "nodeGroups": [group()]} for n in member_names(members)]
    return yaml.safe_dump(data, sort_keys=False)
