"""What the hot paths keep between passes and cycles, and how they decode:
caches that must follow every change, JSON that must read and write as the
standard library does, a collector that must stay quiet."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator
from typing import Any

import psycopg.types.json
import pytest
import sqlalchemy as sa

from service.app.admission import AdmissionCycle
from service.app.bootstrap import Services
from service.app.uow import SqlUnitOfWork
from service.jsonio import read_fast
from tests.workers.conftest import ADMIN, set_cluster_status, setup_fleet, workload
from workers import jsonio
from workers.cli import GC_THRESHOLD, quiet_gc
from workers.records import RowCache


def _no_guard(uow: SqlUnitOfWork) -> None:
    return None


def _cluster_value(cycle: AdmissionCycle) -> Any:
    items = cycle._configuration._items  # what the cache holds, by (kind, namespace, name)
    return items[("Cluster", "", "c1")][1]


def test_the_cycle_parses_a_cluster_once_per_version_and_sees_each_change(
    services: Services,
) -> None:
    setup_fleet(services, gpu_quota=64, islands=1, nodes_per_island=2)
    cycle = AdmissionCycle(services.engine, services.unit_of_work)
    services.submissions.submit(ADMIN, "team-a", workload("a", count=1, gpus=8))
    assert cycle.run(_no_guard).writes.admitted == 1
    first = _cluster_value(cycle)
    services.submissions.submit(ADMIN, "team-a", workload("b", count=1, gpus=8))
    assert cycle.run(_no_guard).writes.admitted == 1
    assert _cluster_value(cycle) is first, "an unchanged Cluster is not parsed again"
    # The cluster is lost: the same cycle object must see it at once.
    set_cluster_status(services, "c1", {"state": "Lost", "inventory": {"nodes": []}})
    services.submissions.submit(ADMIN, "team-a", workload("c", count=1, gpus=8))
    report = cycle.run(_no_guard)
    assert report.writes.admitted == 0
    cluster, nodes = _cluster_value(cycle)
    assert cluster is not first[0] and not cluster.healthy and nodes == []


def test_a_deleted_queue_leaves_the_cycle_cache(services: Services) -> None:
    setup_fleet(services, gpu_quota=64)
    services.resources.create(
        ADMIN,
        "localqueues",
        "team-a",
        {"metadata": {"name": "other"}, "spec": {"clusterQueue": "cq"}},
    )
    cycle = AdmissionCycle(services.engine, services.unit_of_work)
    cycle.run(_no_guard)
    assert ("LocalQueue", "team-a", "other") in cycle._configuration._items
    services.resources.delete(ADMIN, "localqueues", "team-a", "other", None)
    services.submissions.submit(ADMIN, "team-a", workload("a", count=1, gpus=8))
    report = cycle.run(_no_guard)
    assert ("LocalQueue", "team-a", "other") not in cycle._configuration._items
    assert report.writes.admitted == 1


def test_the_cycle_keeps_the_rows_it_wrote_and_reads_them_as_a_fetch_would(
    services: Services,
) -> None:
    from service.app.admission import WorkloadCache

    setup_fleet(services, gpu_quota=8)
    cycle = AdmissionCycle(services.engine, services.unit_of_work)
    services.submissions.submit(ADMIN, "team-a", workload("a", count=1, gpus=8))
    services.submissions.submit(ADMIN, "team-a", workload("b", count=1, gpus=8))
    assert cycle.run(_no_guard).writes.admitted == 1  # b waits: no quota left
    kept = dict(cycle._cache._items)
    report = cycle.run(_no_guard)
    assert report.writes.admitted == 0 and report.admitted_before == 1
    for key in ("team-a/a", "team-a/b"):
        assert cycle._cache._items[key][1] is kept[key][1], f"{key} was fetched again"
    with services.engine.connect() as conn:
        fetched = {e.row.key: e for e in WorkloadCache().refresh(conn)}
    for key, (_, entry) in cycle._cache._items.items():
        assert entry.row == fetched[key].row
        assert entry.workload == fetched[key].workload
        assert entry.admitted == fetched[key].admitted


_ADMIT = sa.text(
    "UPDATE resources SET status = CAST(:status AS jsonb), "
    "resource_version = resource_version + 1 WHERE kind = 'Workload' AND name = :name"
)


def _rows(engine: sa.Engine, cache: RowCache) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r.name: r for r in cache.rows(conn, "c1")}


def test_row_cache_reuses_unchanged_rows_and_rereads_changed_ones(services: Services) -> None:
    setup_fleet(services, gpu_quota=64)
    for name in ("a", "b"):
        services.submissions.submit(ADMIN, "team-a", workload(name, count=1, gpus=8))
    engine = services.engine
    cache = RowCache()
    assert _rows(engine, cache) == {}

    def admit(name: str, state: str = "Admitted") -> None:
        status = {"state": state, "admission": {"cluster": "c1", "clusterQueue": "cq"}}
        with engine.begin() as conn:
            conn.execute(_ADMIT, {"status": json.dumps(status), "name": name})

    admit("a")
    admit("b")
    first = _rows(engine, cache)
    assert sorted(first) == ["a", "b"]
    admit("b", "Running")
    second = _rows(engine, cache)
    assert second["a"] is first["a"], "an unchanged row is not read again"
    assert second["b"] is not first["b"] and second["b"].status["state"] == "Running"
    admit("a", "Finished")  # no longer this cluster's business
    assert sorted(_rows(engine, cache)) == ["b"]


_WHOLE = sa.text(
    "SELECT namespace, name, uid, resource_version, generation, labels, annotations, spec, "
    "status, created_at FROM resources WHERE kind = 'Workload' AND name = :name"
)


def test_row_cache_reads_every_column_as_a_whole_row_reads(services: Services) -> None:
    """Workload rows are read with their JSON columns as one document
    (WORKLOAD_ROWS): each must land where a whole row's read puts it."""
    from service.app.admission import WorkloadRow

    setup_fleet(services, gpu_quota=64)
    manifest = workload("a", count=1, gpus=8)
    manifest["metadata"] |= {"labels": {"team": "x"}, "annotations": {"note": "y"}}
    services.submissions.submit(ADMIN, "team-a", manifest)
    status = {"state": "Admitted", "admission": {"cluster": "c1", "clusterQueue": "cq"}}
    with services.engine.begin() as conn:
        conn.execute(_ADMIT, {"status": json.dumps(status), "name": "a"})
    (cached,) = _rows(services.engine, RowCache()).values()
    with services.engine.connect() as conn:
        r = conn.execute(_WHOLE, {"name": "a"}).one()
    whole = WorkloadRow(
        r.namespace,
        r.name,
        str(r.uid),
        r.resource_version,
        r.generation,
        r.labels,
        r.annotations,
        r.spec,
        r.status,
        r.created_at,
    )
    assert cached == whole
    assert cached.labels["team"] == "x" and cached.annotations["note"] == "y"
    assert cached.status == status and cached.spec["queueName"] == "train"


@pytest.mark.parametrize(
    "text",
    [
        b'{"a": [1, 2.5, "x", null, true], "b": {"c": "\\u00e9"}}',
        b'{"big": 123456789012345678901234567890}',  # past 64 bits: orjson refuses
        b'{"n": NaN, "i": Infinity}',  # not JSON, but json.loads reads it
    ],
)
def test_loads_reads_what_json_loads_reads(text: bytes) -> None:
    expected = json.loads(text)
    got = jsonio.loads(text)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert jsonio.loads(memoryview(text)) == got or any(
        isinstance(v, float) and math.isnan(v) for v in got.values()
    )


@pytest.mark.parametrize(
    ("text", "fast"),
    [
        (b'{"n": 1234567890123456789}', False),  # 19 digits: may be past 64 bits
        (b'{"n": -12345678901234567890}', False),
        (b'{"s": "id-1234567890123456789"}', False),  # in a string too: only slower
        (b'{"n": 123456789012345678, "m": 1.5e300}', True),  # 18 digits: exact in orjson
        (rb'{"s": "\u00b2\u00b3 12345678 9012345678901"}', True),  # runs broken
        (b'{"n": NaN}', False),  # orjson refuses: json.loads says
    ],
)
def test_read_fast_leaves_long_digit_runs_to_json_loads(text: bytes, fast: bool) -> None:
    ok, document = read_fast(text)
    assert ok is fast
    if ok:
        assert document == json.loads(text)


def test_loads_refuses_what_json_loads_refuses() -> None:
    with pytest.raises(json.JSONDecodeError):
        jsonio.loads(b'{"a": ')


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, 2.5, "é", None, True], "b": {}},
        {"big": 123456789012345678901234567890},
        {1: "a non-string key"},
    ],
)
def test_dumps_writes_what_json_dumps_writes(value: Any) -> None:
    assert json.loads(jsonio.dumps(value)) == json.loads(json.dumps(value))


@pytest.fixture
def postgres_json() -> Iterator[None]:
    jsonio.postgres_json()
    try:
        yield
    finally:
        psycopg.types.json.set_json_loads(json.loads)
        psycopg.types.json.set_json_dumps(json.dumps)


def test_postgres_json_round_trips_through_orjson(postgres_json: None, engine: sa.Engine) -> None:
    value = {"big": 2**70, "text": "é", "list": [1, {"x": None}]}
    with engine.connect() as conn:
        got = conn.exec_driver_sql(
            "SELECT %(v)s::jsonb", {"v": psycopg.types.json.Jsonb(value)}
        ).scalar_one()
    assert got == value


def test_quiet_gc_freezes_what_start_up_made_and_collects_less_often() -> None:
    before = gc.get_threshold()
    try:
        quiet_gc()
        assert gc.get_threshold() == GC_THRESHOLD
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class _Recording:
    """A unit of work that records what ``records.append`` asks of it."""

    def __init__(self) -> None:
        self.recorded: list[list[Any]] = []
        self.events = self
        self.published: list[Any] = []

    def append(self, *args: Any) -> None:
        return None

    def defer(self, *args: Any) -> None:
        return None

    def record(self, entries: list[Any]) -> list[Any]:
        self.recorded.append(list(entries))
        return []

    def publish(self, messages: list[Any]) -> None:
        self.published += messages


def test_one_ledger_append_chains_a_batchs_entries_in_one_record_in_order() -> None:
    from datetime import UTC, datetime
    from uuid import uuid4

    from workers.records import append, one_ledger_append

    uow: Any = _Recording()
    now = datetime.now(UTC)
    data = {
        "kind": "Workload",
        "namespace": "ns",
        "name": "w",
        "uid": str(uuid4()),
        "generation": 1,
    }
    data |= {"labels": {}, "annotations": {}, "spec": {}, "status": {}}
    data |= {"created_at": now.isoformat()}
    with one_ledger_append(uow):
        for entry in ("e1", "e2", "e3"):
            append(uow, "workload-ns-w", 1, "WorkloadFinished", data, "t", now, [entry])  # type: ignore[list-item]
        assert uow.recorded == []
    assert uow.recorded == [["e1", "e2", "e3"]]
    append(uow, "workload-ns-w", 1, "WorkloadFinished", data, "t", now, ["e4"])  # type: ignore[list-item]
    assert uow.recorded[-1] == ["e4"]  # outside a batch: at once
