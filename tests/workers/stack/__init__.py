"""The whole of Quartermaster as processes, for end-to-end tests and bench/e2e.py.

What standalone mode runs (service/runtime/standalone.py), started with its
supervisor (service/runtime/supervisor.py): the API (``python -m service
api``), Celery workers and the scheduler (``python -m workers.cli worker |
scheduler``) and stand-in member clusters (``python -m sim.cli cluster``,
their simulated time scaled so that jobs run for seconds). Quotas and the
stand-ins' Cluster objects go in through the API, as standalone seeds them.

Besides: a private Postgres (``pg_ctl`` on a data directory of ours) and a
private ``redis-server``, on free ports, that a chaos test may stop and start
without touching the servers other tests share; and :class:`MemberWatch`,
which follows the stand-ins' Jobs, Pods and Nodes through the official
client's watches, so that a test checks what the member clusters really
ran, where and when.
"""

from tests.workers.stack.fleets import (
    base_manifests,
    fleet_yaml,
    gang,
    local_queue,
    manifest,
    pod_template,
    team_queue,
    write_fleet,
)
from tests.workers.stack.names import ADMISSION_LABEL, GPU, ISLAND, ROOT, TOKEN, WORKLOAD_LABEL
from tests.workers.stack.processes import FAST, Stack
from tests.workers.stack.servers import (
    PrivatePostgres,
    PrivateRedis,
    private_postgres,
    private_redis,
)
from tests.workers.stack.watch import JobRecord, MemberWatch, PodRecord

__all__ = [
    "ADMISSION_LABEL",
    "FAST",
    "GPU",
    "ISLAND",
    "ROOT",
    "TOKEN",
    "WORKLOAD_LABEL",
    "JobRecord",
    "MemberWatch",
    "PodRecord",
    "PrivatePostgres",
    "PrivateRedis",
    "Stack",
    "base_manifests",
    "fleet_yaml",
    "gang",
    "local_queue",
    "manifest",
    "pod_template",
    "private_postgres",
    "private_redis",
    "team_queue",
    "write_fleet",
]
