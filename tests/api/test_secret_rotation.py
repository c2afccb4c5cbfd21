"""Rotating QM_SECRET_KEY: what is sealed names its key; a process opens
what its current or previous key sealed and seals with the current one;
``quartermaster secrets rotate`` re-seals every stored credential through
the usual write path (an event per Cluster), so the read model, the latest
event of every Cluster and a rebuild all hold the new ciphertext; and real
workers keep reconciling a stand-in member through the whole rotation."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from cryptography.fernet import Fernet

from service.app.bootstrap import Services, bootstrap
from service.app.crypto import SecretBox
from service.app.rotation import rotate_credentials
from service.app.uow import SqlUnitOfWork
from service.config import Settings
from service.domain.events import CLUSTER_CREDENTIALS_ROTATED
from service.eventstore.port import AppendResult
from sim.kubesim.testing import RunningCluster
from tests.waiting import wait_for
from tests.workers.conftest import ADMIN, celery_worker, worker_settings, workload_status
from tests.workers.members import cluster_body, gang, members, scheduling, settings, setup_central
from workers.celery_app import make_celery
from workers.tasks import sender

ROOT = Path(__file__).resolve().parents[2]
OLD = "the-old-secret-key-of-this-fleet-0001"
NEW = "the-new-secret-key-of-this-fleet-0002"
OTHER = "a-key-no-process-here-has-ever-had-03"
CREDENTIALS = {"token": "member-token-that-must-survive"}


# -- the sealed format ---------------------------------------------------------------------


def test_a_sealed_credential_names_its_key_and_opens_with_the_current_or_previous_one() -> None:
    old, new = SecretBox(OLD), SecretBox(NEW)
    rolled = SecretBox(NEW, OLD)
    sealed = old.seal(b"secret")
    assert sealed.startswith(b"qm1." + old.key_id.encode() + b".")
    assert old.key_id != new.key_id and rolled.key_id == new.key_id
    assert b"secret" not in sealed and OLD.encode() not in sealed
    assert rolled.open(sealed) == b"secret"  # the previous key still opens it
    assert not rolled.is_current(sealed)
    resealed = rolled.reseal(sealed)
    assert rolled.is_current(resealed) and new.is_current(resealed)
    assert new.open(resealed) == b"secret"
    with pytest.raises(ValueError, match=f"sealed under key id {old.key_id}"):
        new.open(sealed)  # once the previous key is dropped
    with pytest.raises(ValueError, match="QM_SECRET_KEY_PREVIOUS"):
        old.open(resealed)


def test_a_bare_token_from_before_key_ids_opens_with_the_key_that_made_it() -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    # What SecretBox sealed before its values named their key.
    derived = HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=None,
        info=b"quartermaster cluster credentials",
    ).derive(OLD.encode())
    bare = Fernet(base64.urlsafe_b64encode(derived)).encrypt(b"legacy")
    rolled = SecretBox(NEW, OLD)
    assert rolled.sealed_under(bare) is None and not rolled.is_current(bare)
    assert rolled.open(bare) == b"legacy"
    assert SecretBox(NEW).is_current(rolled.reseal(bare))
    with pytest.raises(ValueError, match="cannot be decrypted"):
        SecretBox(NEW).open(bare)


# -- the rotation, on the stored credentials -----------------------------------------------


def _services(database_url: str, key: str, previous: str | None = None) -> Services:
    return bootstrap(
        Settings(
            database_url=database_url,
            secret_key=key,
            secret_key_previous=previous,
            db_pool_size=2,
        )
    )


def _cluster(name: str, token: str = CREDENTIALS["token"]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"server": f"https://{name}.example:6443", "credentials": {"token": token}},
    }


def _rows(engine: sa.Engine) -> dict[str, bytes | None]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT name, secret FROM resources WHERE kind = 'Cluster' ORDER BY name"
        ).all()
    return {str(n): bytes(s) if s is not None else None for n, s in rows}


def _events(engine: sa.Engine, name: str) -> list[tuple[str, bytes | None]]:
    """Every event of a Cluster's stream: its type and the sealed credentials it carries."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT type, data->>'secret' FROM events WHERE stream = %(s)s ORDER BY version",
            {"s": f"cluster-{name}"},
        ).all()
    return [(str(t), base64.b64decode(s) if s else None) for t, s in rows]


def _rotate_cli(
    database_url: str, key: str, previous: str | None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QM_DATABASE_URL": database_url, "QM_SECRET_KEY": key}
    env.pop("QM_SECRET_KEY_PREVIOUS", None)
    if previous:
        env["QM_SECRET_KEY_PREVIOUS"] = previous
    return subprocess.run(
        [sys.executable, "-m", "service", "secrets", "rotate"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rotate_reseals_every_stored_credential_and_a_rebuild_keeps_the_new_ones(
    engine: sa.Engine, database_url: str
) -> None:
    before = _services(database_url, OLD)
    try:
        for name in ("east-1", "west-1", "gone-1"):
            before.resources.create(ADMIN, "clusters", "", _cluster(name))
        # A deleted Cluster keeps its credentials until its collection ends.
        before.resources.delete(ADMIN, "clusters", "", "gone-1", None)
    finally:
        before.close()
    old, new = SecretBox(OLD), SecretBox(NEW)
    assert all(old.is_current(s) for s in _rows(engine).values() if s)

    done = _rotate_cli(database_url, NEW, OLD)
    assert done.returncode == 0, done.stderr
    assert "3 re-sealed, 0 already current, 0 failed" in done.stdout
    rows = _rows(engine)
    assert set(rows) == {"east-1", "west-1", "gone-1"}
    for name, sealed in rows.items():
        assert sealed is not None and new.is_current(sealed), name
        assert json.loads(new.open(sealed)) == CREDENTIALS  # the new key alone opens it
        events = _events(engine, name)
        kind, latest = events[-1]
        assert kind == CLUSTER_CREDENTIALS_ROTATED and latest == sealed
        # Older events keep the old ciphertext: unreadable once the old key goes.
        assert all(old.is_current(s) for _, s in events[:-1] if s)
    # The deleted one is still deleted.
    with engine.connect() as conn:
        assert conn.exec_driver_sql(
            "SELECT deleted FROM resources WHERE kind = 'Cluster' AND name = 'gone-1'"
        ).scalar_one()

    again = _rotate_cli(database_url, NEW, OLD)
    assert again.returncode == 0 and "0 re-sealed, 3 already current" in again.stdout

    # The old key dropped: a rebuild from position 0 ends at the rotation.
    after = _services(database_url, NEW)
    try:
        after.projections.rebuild("resources")
        assert _rows(engine) == rows
        assert after.resources.secret("clusters", "east-1") == CREDENTIALS
    finally:
        after.close()


def test_a_credential_neither_key_opens_is_reported_and_left_as_it_was(
    engine: sa.Engine, database_url: str
) -> None:
    for key, name in ((OLD, "ours"), (OTHER, "foreign")):
        services = _services(database_url, key)
        try:
            services.resources.create(ADMIN, "clusters", "", _cluster(name))
        finally:
            services.close()
    foreign = _rows(engine)["foreign"]
    done = _rotate_cli(database_url, NEW, OLD)
    assert done.returncode == 1
    assert "1 re-sealed, 0 already current, 1 failed" in done.stdout
    assert "cluster/foreign not re-sealed" in done.stderr
    assert OTHER not in done.stderr + done.stdout and CREDENTIALS["token"] not in done.stderr
    assert _rows(engine)["foreign"] == foreign
    assert [k for k, _ in _events(engine, "foreign")] == ["ResourceChanged"]


def test_rotation_retries_a_cluster_whose_stream_moved_under_it(
    engine: sa.Engine, database_url: str
) -> None:
    """A writer that appends between the rotation's read and its commit (a
    heartbeat) makes that commit fail on the version; the rotation reads
    again and re-seals what is there then."""
    services = _services(database_url, OLD)
    try:
        services.resources.create(ADMIN, "clusters", "", _cluster("east-1"))

        class Raced(SqlUnitOfWork):
            """The first commit comes after an admin replaced the Cluster
            (its credentials too) in a transaction of its own."""

            raced = False

            def commit(self) -> list[AppendResult]:
                if not Raced.raced:
                    Raced.raced = True
                    body = _cluster("east-1", token="replaced-meanwhile")
                    services.resources.replace(ADMIN, "clusters", "", "east-1", body, None)
                return super().commit()

        report = rotate_credentials(engine, lambda: Raced(engine), SecretBox(NEW, OLD))
    finally:
        services.close()
    assert Raced.raced
    assert report.rotated == ["east-1"] and report.ok
    sealed = _rows(engine)["east-1"]
    assert sealed is not None
    assert json.loads(SecretBox(NEW).open(sealed)) == {"token": "replaced-meanwhile"}


# -- real workers, through the rotation ----------------------------------------------------


@contextmanager
def _workers(
    database_url: str, redis_url: str, engine: sa.Engine, key: str, previous: str | None
) -> Iterator[None]:
    """The admission leader with its fleet loop and relay, and a Celery
    worker, all with these keys (a roll of every worker process)."""
    env = {"QM_SECRET_KEY": key, "QM_SECRET_KEY_PREVIOUS": previous or ""}
    keys = {"secret_key": key, "secret_key_previous": previous}
    with ExitStack() as stack:
        celery = make_celery(worker_settings(database_url, redis_url))
        stack.callback(celery.close)
        stack.enter_context(celery_worker(database_url, redis_url, env))
        config = settings(database_url, redis_url, **keys)
        stack.enter_context(scheduling(engine, config, sender(celery), relay=True))
        yield


def _finished(engine: sa.Engine, name: str) -> None:
    wait_for(
        lambda: workload_status(engine, "team-a", name).get("state") == "Finished",
        120,
        f"{name} Finished",
        seen=lambda: workload_status(engine, "team-a", name),
    )


def _ready(services: Services, member: RunningCluster) -> bool:
    cluster = services.resources.get(ADMIN.principal, "clusters", "", member.name)
    return bool((cluster.get("status") or {}).get("state") == "Ready")


def test_workers_keep_reconciling_a_member_through_a_rotation(
    engine: sa.Engine, database_url: str, redis_url: str, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    with members(tmp_path) as (c1,):
        # Before: everything on the old key.
        services = _services(database_url, OLD)
        try:
            setup_central(services, [])
            services.resources.create(ADMIN, "clusters", "", cluster_body(c1))
            with _workers(database_url, redis_url, engine, OLD, None):
                wait_for(lambda: _ready(services, c1), 60, "the member Ready")
                services.submissions.submit(ADMIN, "team-a", gang("before", 1, duration="20s"))
                _finished(engine, "before")
        finally:
            services.close()
        # Every process rolled to the new key, the old one beside it; the
        # rotation runs while a gang is in flight and heartbeats are written.
        services = _services(database_url, NEW, OLD)
        try:
            with _workers(database_url, redis_url, engine, NEW, OLD):
                services.submissions.submit(ADMIN, "team-a", gang("during", 1, duration="1500s"))
                wait_for(
                    lambda: workload_status(engine, "team-a", "during").get("state") == "Running",
                    60,
                )
                done = _rotate_cli(database_url, NEW, OLD)
                assert done.returncode == 0 and "1 re-sealed" in done.stdout, done.stderr
                _finished(engine, "during")
        finally:
            services.close()
        sealed = _rows(engine)["c1"]
        assert sealed is not None and SecretBox(NEW).is_current(sealed)
        kinds = [k for k, _ in _events(engine, "c1")]
        assert CLUSTER_CREDENTIALS_ROTATED in kinds
        newest = [s for _, s in _events(engine, "c1")][kinds.index(CLUSTER_CREDENTIALS_ROTATED) :]
        assert all(s is not None and SecretBox(NEW).is_current(s) for s in newest)
        # The old key dropped everywhere; the read model rebuilt.
        services = _services(database_url, NEW)
        try:
            services.projections.rebuild("resources")
            with _workers(database_url, redis_url, engine, NEW, None):
                services.submissions.submit(ADMIN, "team-a", gang("after", 1, duration="20s"))
                _finished(engine, "after")
                assert _ready(services, c1)
        finally:
            services.close()
    redis.Redis.from_url(redis_url).flushdb()
