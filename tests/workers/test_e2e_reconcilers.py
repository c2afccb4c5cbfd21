"""Two reconcilers of one member cluster (a Celery worker's and the fleet
loop's, as in production): a pass that read the centre before a gang was
admitted never takes that gang's job, dispatched meanwhile by the other
pass, for a stray. (Found by the 200-gang end-to-end test: the job was
deleted, and dispatched again, for the same admission.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from service.app.admission import AdmissionCycle
from service.app.bootstrap import Services
from tests.workers.conftest import ADMIN, workload_status
from tests.workers.members import gang, job, members, settings, setup_central
from workers.clusters import Member
from workers.fleet import Connector, reconcile_once, sync_once
from workers.records import ClusterRow
from workers.settings import WorkerSettings


class _WorldMovesDuringTheJobList(Connector):
    """A connector whose member runs ``meanwhile`` the first time it is
    asked for the Jobs it holds: what happens between a pass's reads."""

    def __init__(self, settings: WorkerSettings, meanwhile: Callable[[], None]) -> None:
        super().__init__(settings)
        self.meanwhile: Callable[[], None] | None = meanwhile

    def __call__(self, row: ClusterRow) -> Member:
        member = super().__call__(row)
        if getattr(member, "_hooked", False):
            return member
        real = member.list_objects

        def list_objects(kind: str, label_selector: str | None = None) -> list[dict[str, Any]]:
            if kind == "Job" and self.meanwhile is not None:
                meanwhile, self.meanwhile = self.meanwhile, None
                meanwhile()
            return real(kind, label_selector)

        member.list_objects = list_objects  # type: ignore[method-assign]
        member._hooked = True  # type: ignore[attr-defined]
        return member


def test_a_pass_never_deletes_a_job_dispatched_for_a_gang_admitted_while_it_ran(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    tmp_path: Path,
) -> None:
    config = settings(database_url, broker)
    now = lambda: datetime.now(UTC)  # noqa: E731
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        other = Connector(config)

        def admitted_and_dispatched_by_the_other_pass() -> None:
            services.submissions.submit(ADMIN, "team-a", gang("late", duration="100000s"))
            AdmissionCycle(engine, services.unit_of_work).run(lambda uow: None)
            assert reconcile_once(engine, "c1", other, config, now).dispatched

        this = _WorldMovesDuringTheJobList(config, admitted_and_dispatched_by_the_other_pass)
        try:
            assert sync_once(engine, "c1", other, config, now).heartbeat
            report = reconcile_once(engine, "c1", this, config, now)
            assert this.meanwhile is None  # it did happen in the middle of the pass
            assert report.deleted == [] and report.dispatched == []
            assert job(c1, "late") is not None
            again = reconcile_once(engine, "c1", other, config, now)
            assert again.deleted == [] and again.dispatched == []
        finally:
            this.close()
            other.close()
    assert workload_status(engine, "team-a", "late")["state"] == "Admitted"
