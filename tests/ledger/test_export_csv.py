"""The CSV export: one parseable row per entry, the filterable fields in
columns and the body intact."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime

from service.ledger.entries import ClusterLost, WorkloadAdmitted, new_entry
from service.ledger.export import CSV_COLUMNS, export_csv, records_of
from service.ledger.memory import InMemoryLedger

T0 = datetime(2026, 11, 29, tzinfo=UTC)


def test_rows_carry_the_fields_and_the_body() -> None:
    admitted = WorkloadAdmitted(
        namespace="team-a",
        workload='odd, "quoted"\nname',
        local_queue="lq",
        cluster_queue="cq",
        cluster="c1",
        flavors={"nvidia.com/gpu": "h100"},
        island=None,
        reserved={"h100": {"nvidia.com/gpu": 8}, "a100": {"cpu": 1000}},
        borrowed={},
        reason="fits",
    )
    lost = ClusterLost(cluster="c2", last_heartbeat=None, requeued=[])
    ledger = InMemoryLedger()
    entries = ledger.append(
        [new_entry(admitted, uuid.uuid4(), T0), new_entry(lost, uuid.uuid4(), T0)]
    )
    text = "".join(export_csv(entries))
    assert text == "".join(export_csv(records_of(entries)))
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert list(rows[0]) == list(CSV_COLUMNS) and len(rows) == 2
    first, second = rows
    assert first["workload"] == 'odd, "quoted"\nname'
    assert first["flavors"] == "a100;h100"
    assert json.loads(first["body"]) == dict(entries[0].body)
    assert first["entry_hash"] == entries[0].entry_hash.hex()
    assert (second["seq"], second["kind"], second["cluster"]) == ("2", "cluster.lost", "c2")
    assert second["namespace"] == "" and second["flavors"] == ""
