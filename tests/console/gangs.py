"""A fleet that has run gangs, for the console's browser tests of the ledger,
usage, accessibility and the README's screenshot.

Two stand-in member clusters (HTTPS, through the official client), a Celery
worker process, the scheduler in a thread, and the API — console included —
serving the same database with a ledger signing key. Gangs of two teams are
submitted through the API and run to Finished; once every admission's
``workload.ran`` is in the ledger, a checkpoint is signed (``POST
/v1/ledger/checkpoints``, as ``qmctl ledger checkpoint --publish`` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
import sqlalchemy as sa

from service.app.bootstrap import Services
from service.ledger.checkpoint import DEFAULT_ORIGIN, NoteSigner, open_checkpoint
from tests.api.conftest import ADMIN_TOKEN, serve
from tests.harness import reset_database
from tests.waiting import LONG_CEILING, wait_for
from tests.workers.conftest import ADMIN, celery_worker, worker_settings
from tests.workers.members import gang, members, scheduling, settings, setup_central
from workers.celery_app import make_celery
from workers.tasks import sender

#: (namespace, name, simulated duration): they finish in seconds of real time.
GANGS = (
    ("team-a", "pretrain", "300s"),
    ("team-a", "finetune", "150s"),
    ("team-b", "eval", "200s"),
)


@dataclass
class Fleet:
    base_url: str
    services: Services
    admin: httpx.Client
    signer: NoteSigner
    note: str
    """The checkpoint signed once the gangs had run."""
    size: int

    def entries(self, kind: str) -> list[dict[str, Any]]:
        found = self.admin.get("/v1/ledger/entries", params={"kind": kind, "limit": 1000})
        assert found.status_code == 200, found.text
        items: list[dict[str, Any]] = found.json()["items"]
        return items


def _state(admin: httpx.Client, namespace: str, name: str) -> str | None:
    found = admin.get(f"/v1/namespaces/{namespace}/workloads/{name}")
    return (found.json().get("status") or {}).get("state") if found.status_code == 200 else None


@contextmanager
def fleet_that_ran(
    engine: sa.Engine,
    database_url: str,
    redis_url: str,
    tmp_path: Path,
    running: tuple[str, ...] = (),
    gangs: tuple[tuple[str, str, str], ...] = GANGS,
) -> Iterator[Fleet]:
    """The fleet once ``gangs`` have finished and a checkpoint covers them;
    ``running`` names gangs of team-a left running (for as long as it lasts)."""
    reset_database(engine)
    redis.Redis.from_url(redis_url).flushdb()
    signer, seed = NoteSigner.generate(DEFAULT_ORIGIN)
    with ExitStack() as stack:
        clusters = stack.enter_context(members(tmp_path, ("c1", "c2")))
        stack.enter_context(celery_worker(database_url, redis_url))
        celery = make_celery(worker_settings(database_url, redis_url))
        stack.callback(celery.close)
        base_url, services = stack.enter_context(serve(database_url, ledger_signing_key=seed))
        setup_central(services, clusters, gpu_quota=32)
        queue = {"metadata": {"name": "train"}, "spec": {"clusterQueue": "cq"}}
        services.resources.create(ADMIN, "localqueues", "team-b", queue)
        stack.enter_context(
            scheduling(engine, settings(database_url, redis_url), sender(celery), relay=True)
        )
        admin = stack.enter_context(
            httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        )
        for namespace, name, duration in gangs:
            created = admin.post(
                f"/v1/namespaces/{namespace}/workloads", json=gang(name, duration=duration)
            )
            assert created.status_code == 201, created.text
        for namespace, name, _ in gangs:
            wait_for(
                lambda: _state(admin, namespace, name) == "Finished",  # noqa: B023
                LONG_CEILING,
                f"{namespace}/{name} Finished",
            )
        fleet = Fleet(base_url, services, admin, signer, "", 0)
        wait_for(
            lambda: len(fleet.entries("workload.ran")) == len(fleet.entries("workload.admitted")),
            LONG_CEILING,
            "what every admission ran, in the ledger",
        )
        published = admin.post("/v1/ledger/checkpoints")
        assert published.status_code == 201, published.text
        fleet.note = published.text
        fleet.size = open_checkpoint(fleet.note, signer.verifier()).size
        for name in running:
            created = admin.post(
                "/v1/namespaces/team-a/workloads", json=gang(name, duration="1000000s")
            )
            assert created.status_code == 201, created.text
        for name in running:
            wait_for(
                lambda: _state(admin, "team-a", name) == "Running",  # noqa: B023
                LONG_CEILING,
                f"team-a/{name} Running",
            )
        yield fleet
