"""The admission cycle's application side: read models → engine snapshot, and
the engine's decisions → events, read-model rows and ledger entries, all in
one transaction. The engine (service/engine) decides; this package translates.

``repository`` (queries) → ``convert`` (rows to engine values) → ``caches``
→ ``snapshot`` → ``writes`` (decisions to writes) → ``cycle``.

Shapes it reads and writes (the sync and reconcile workers meet them):

* ``Cluster.status``: ``state`` (``Ready`` | ``Lost``; absent means Ready) and
  ``inventory.nodes``: a list of ``{name, flavor, island, allocatable:
  {resource: quantity}, reserved: {resource: quantity}, labels, taints:
  [{key, value, effect}], ready, unschedulable}``. ``reserved`` is what pods
  Quartermaster does not manage take; gangs it admitted are derived from the
  admissions. ``flavor`` and ``island`` are decided by whoever writes the
  inventory (the flavor whose nodeLabels the node carries; the value of the
  flavor topology's island level, or one island per cluster and flavor).
* ``Workload.status``: ``state`` is ``Pending`` → ``Admitted`` (this cycle) →
  ``Running`` / ``Finished`` (sync); ``Evicted`` when preempted or evicted by
  the engine (quota released at once; the reconciler deletes the job from
  ``status.eviction.cluster`` and then requeues it as ``Pending`` with
  ``queuedAt``); ``Cancelling`` holds quota until the member cluster has
  removed it. ``status.admission`` is ``{clusterQueue, cluster, island,
  podSetAssignments: [{name, count, flavors: {resource: flavor},
  resourceUsage: {resource: quantity}, placement: [{node, count}], islands}],
  borrowed: {flavor: {resource: quantity}}, preempted: [ns/name], admittedAt}``.
  A serving workload run as units (``service.domain.jobs.runs_as_units``)
  has no ``status.admission`` but ``replicaAdmissions``: ``[{replica,
  admission, admittedAt}]`` by replica, ``admission`` shaped as above, and
  ``admittedReplicas`` its length; it is Admitted while one unit is, and
  its lowest waiting unit's reason is written on it (docs/serving.md).
  A pending workload carries ``pendingReason`` (words), ``pendingReasonCode``
  (Kueue's reason), ``pendingReasonAt`` (when they were written: the same
  reason in other words is rewritten at most every 30 s) and a
  ``QuotaReserved=False`` condition saying the same; ``pendingCause`` when
  the engine names one (``TooBigForAnyIsland``, ``FragmentedAcrossIslands``,
  ...), and for fragmentation ``pendingFragmentation``: ``{flavor, resource,
  requested, freeInFleet, largestFreeIsland: {name, free}}`` (canonical amounts).
"""

from service.app.admission.caches import ConfigCache, WorkloadCache
from service.app.admission.convert import workload_from_row
from service.app.admission.cycle import AdmissionCycle, CycleReport
from service.app.admission.repository import WorkloadRow, workloads_by_key
from service.app.admission.snapshot import Loaded, flavors_without_nodes, fleet_snapshot, load
from service.app.admission.writes import PENDING_MESSAGE_REFRESH, CycleWrites, cycle_writes

__all__ = [
    "PENDING_MESSAGE_REFRESH",
    "AdmissionCycle",
    "ConfigCache",
    "CycleReport",
    "CycleWrites",
    "Loaded",
    "WorkloadCache",
    "WorkloadRow",
    "cycle_writes",
    "flavors_without_nodes",
    "fleet_snapshot",
    "load",
    "workload_from_row",
    "workloads_by_key",
]
