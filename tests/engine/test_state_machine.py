"""A Hypothesis state machine over the engine: the fleet changes, cycles apply, invariants hold.

Rules submit, finish and cancel gangs, change a ClusterQueue's quota, add,
remove and cordon member clusters, and let time pass. After every rule an
admission cycle runs on the current state (as the service runs one after
every change): it must give the same result twice (determinism) and satisfy
every check of :mod:`tests.engine.invariants` (gangs whole, in one cluster and
one island when required; nothing admitted twice; node capacity; quota as the
cohort tree allows; every pending workload accounted for). Its decisions are
then applied, and the applied state is checked again: per node, pods within
allocatable; every running gang whole, on a live cluster, inside one island
when it asked for one; no workload both running and waiting. A removed
cluster's gangs are requeued whole.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from service.domain.inventory import Cluster, Node
from service.domain.quota import (
    ClusterQueue,
    Cohort,
    FlavorQuotas,
    LocalQueue,
    PreemptionPolicy,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Topology,
)
from service.domain.workload import AdmittedWorkload, PodSet, TopologyRequest, Workload
from service.engine import LocalQueueUsage, Snapshot, admission_cycle
from tests.engine.invariants import violations

GPU = "nvidia.com/gpu"
ISLAND = "example.com/block"
TEAMS = ("team-a", "team-b", "team-c")
FLAVOR = ResourceFlavor("gpu", topology_name="fabric")
TOPOLOGY = Topology("fabric", (ISLAND,))


def cluster_nodes(name: str) -> list[Node]:
    """2 islands x 2 nodes x 8 GPUs."""
    return [
        Node(
            name=f"{name}-i{i}-n{k}",
            cluster=name,
            flavor="gpu",
            island=f"{name}-i{i}",
            allocatable={GPU: 8},
            labels={ISLAND: f"{name}-i{i}"},
        )
        for i in range(2)
        for k in range(2)
    ]


def cluster_queue(team: str, nominal: int) -> ClusterQueue:
    group = ResourceGroup((GPU,), (FlavorQuotas("gpu", {GPU: ResourceQuota(nominal)}),))
    return ClusterQueue(
        name=team,
        resource_groups=(group,),
        cohort_name="all",
        preemption=PreemptionPolicy(
            within_cluster_queue="LowerPriority", reclaim_within_cohort="Any"
        ),
    )


class FleetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.serial = 0
        self.clusters: dict[str, Cluster] = {}
        self.nodes: dict[str, list[Node]] = {}
        self.quotas = {"team-a": 32, "team-b": 16, "team-c": 0}
        self.pending: dict[str, Workload] = {}
        self.running: dict[str, AdmittedWorkload] = {}
        self.usage: dict[str, LocalQueueUsage] = {}
        for _ in range(2):
            self._new_cluster()

    # --- the world ------------------------------------------------------------------------

    def _new_cluster(self) -> None:
        name = f"c{self.serial}"
        self.serial += 1
        self.clusters[name] = Cluster(name)
        self.nodes[name] = cluster_nodes(name)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            cluster_queues=tuple(cluster_queue(t, q) for t, q in sorted(self.quotas.items())),
            resource_flavors=(FLAVOR,),
            cohorts=(Cohort("all"),),
            local_queues=tuple(LocalQueue(t, "jobs", t) for t in TEAMS),
            topologies=(TOPOLOGY,),
            clusters=tuple(self.clusters[c] for c in sorted(self.clusters)),
            nodes=tuple(n for c in sorted(self.nodes) for n in self.nodes[c]),
            admitted=tuple(self.running[k] for k in sorted(self.running)),
            pending=tuple(self.pending[k] for k in sorted(self.pending)),
            namespaces={t: {} for t in TEAMS},
            local_queue_usage=dict(self.usage),
        )

    def cycle(self) -> None:
        snapshot = self.snapshot()
        result = admission_cycle(snapshot, self.now)
        assert admission_cycle(snapshot, self.now) == result, "not deterministic"
        problems = violations(snapshot, result, self.now)
        assert not problems, problems
        for preemption in result.preemptions:
            victim = self.running.pop(preemption.workload)
            self.pending[victim.workload.key] = dataclasses.replace(
                victim.workload, queued_at=self.now
            )
        for decision in result.admissions:
            wl = self.pending.pop(decision.workload)
            self.running[wl.key] = AdmittedWorkload(wl, decision.admission, admitted_at=self.now)
        self.usage = dict(result.local_queue_usage)

    # --- rules ----------------------------------------------------------------------------

    @rule(
        team=st.sampled_from(TEAMS),
        gpus=st.sampled_from((1, 2, 4, 8, 16, 24, 40)),
        priority=st.sampled_from((0, 100)),
        required=st.booleans(),
    )
    def submit(self, team: str, gpus: int, priority: int, required: bool) -> None:
        per_pod = min(gpus, 8)
        pods = gpus // per_pod
        topology = TopologyRequest("required" if required else "preferred") if pods > 1 else None
        name = f"w{self.serial}"
        self.serial += 1
        self.pending[f"{team}/{name}"] = Workload(
            namespace=team,
            name=name,
            queue_name="jobs",
            pod_sets=(PodSet("main", pods, {GPU: per_pod}, topology_request=topology),),
            creation_time=self.now,
            priority=priority,
        )
        self.cycle()

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[key]
        self.cycle()

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.pending)))
        del self.pending[key]
        self.cycle()

    @rule(team=st.sampled_from(TEAMS), nominal=st.sampled_from((0, 8, 16, 32, 48)))
    def change_quota(self, team: str, nominal: int) -> None:
        self.quotas[team] = nominal
        self.cycle()

    @precondition(lambda self: len(self.clusters) < 4)
    @rule()
    def add_cluster(self) -> None:
        self._new_cluster()
        self.cycle()

    @precondition(lambda self: bool(self.clusters))
    @rule(data=st.data())
    def remove_cluster(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.clusters)))
        del self.clusters[name]
        del self.nodes[name]
        for key in sorted(self.running):
            if self.running[key].admission.cluster == name:
                lost = self.running.pop(key)
                self.pending[key] = dataclasses.replace(lost.workload, queued_at=self.now)
        self.cycle()

    @precondition(lambda self: bool(self.clusters))
    @rule(data=st.data(), cordoned=st.booleans())
    def cordon(self, data: st.DataObject, cordoned: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.clusters)))
        self.clusters[name] = dataclasses.replace(self.clusters[name], cordoned=cordoned)
        self.cycle()

    @rule(seconds=st.sampled_from((1.0, 60.0, 3600.0)))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.cycle()

    # --- invariants of the applied state --------------------------------------------------

    @invariant()
    def nothing_twice(self) -> None:
        assert not set(self.running) & set(self.pending)

    @invariant()
    def nodes_within_allocatable(self) -> None:
        used: dict[str, int] = {}
        for admitted in self.running.values():
            for assignment in admitted.admission.pod_set_assignments:
                for node, pods in assignment.placement:
                    used[node] = used.get(node, 0) + pods * assignment.resource_usage[GPU] // (
                        assignment.count
                    )
        allocatable = {n.name: n.allocatable[GPU] for ns in self.nodes.values() for n in ns}
        for node, gpus in used.items():
            assert node in allocatable, f"{node} is gone but still runs pods"
            assert gpus <= allocatable[node], f"{node}: {gpus} GPUs"

    @invariant()
    def gangs_whole_on_live_clusters(self) -> None:
        for key, admitted in self.running.items():
            assert admitted.admission.cluster in self.clusters, key
            (pod_set,) = admitted.workload.pod_sets
            (assignment,) = admitted.admission.pod_set_assignments
            assert sum(p for _, p in assignment.placement) == pod_set.count, key
            request = pod_set.topology_request
            if request is not None and request.mode == "required":
                assert len(assignment.islands) == 1, (key, assignment.islands)


FleetMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFleetMachine = FleetMachine.TestCase
