"""The cycle's two caches: workloads and configuration as domain values,
each fetched and parsed when its row changes, not every cycle.

Decoding each pending workload's JSON every second, or parsing three
Clusters' node inventories (which change only with a heartbeat), cost more
than the engine's whole cycle. One row the domain refuses is left out of the
cycle (and logged once per version) rather than stopping the fleet's admission.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.app.admission.convert import (
    CONFIG_VALUES,
    Units,
    admission_from_status,
    timestamp,
    units_of,
    workload_from_row,
)
from service.app.admission.repository import (
    ConfigKey,
    WorkloadRow,
    config_rows,
    config_stamps,
    workload_stamps,
    workloads_by_key,
)
from service.app.lifecycle import HOLDS_QUOTA, PENDING
from service.domain.jobs import runs_as_units
from service.domain.times import parse_time
from service.domain.workload import AdmittedWorkload, Workload

log = logging.getLogger("service.app.admission")

Obj = dict[str, Any]
_STATES = [PENDING, *sorted(HOLDS_QUOTA)]


@dataclass(frozen=True)
class CachedWorkload:
    row: WorkloadRow
    workload: Workload
    admitted: AdmittedWorkload | None
    #: A serving workload run as units (docs/serving.md): its admitted units
    #: (``status.replicaAdmissions``) and its missing ones, by index.
    units: Units | None = None


def cached_workload(row: WorkloadRow, workload: Workload | None = None) -> CachedWorkload:
    """``workload``: the row's domain value, if the caller knows it."""
    workload = workload or workload_from_row(row)
    if runs_as_units(row.spec):
        return CachedWorkload(row, workload, None, units_of(row, workload))
    raw = row.status.get("admission")
    admitted = None
    if row.status.get("state", PENDING) in HOLDS_QUOTA and raw:
        admitted = AdmittedWorkload(
            workload=workload,
            admission=admission_from_status(raw),
            admitted_at=timestamp(raw.get("admittedAt"), workload.creation_time),
            pods_ready=row.status.get("podsReady"),
            last_checkpoint=_checkpoint(row.status.get("lastCheckpoint")),
        )
    return CachedWorkload(row, workload, admitted)


def _checkpoint(value: Any) -> float | None:
    """``status.lastCheckpoint`` (RFC 3339, from the job's annotation) in seconds."""
    at = parse_time(value)
    return None if at is None else at.timestamp()


class WorkloadCache:
    """Workload rows and their domain values by key, valid for one (uid,
    version): a pending workload is fetched and parsed once, not per cycle."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[tuple[str, int], CachedWorkload]] = {}
        self._unreadable: set[tuple[str, tuple[str, int]]] = set()

    def refresh(self, conn: Any) -> list[CachedWorkload]:
        stamps = workload_stamps(conn, _STATES)
        for key, stamp in list(self._unreadable):
            if key in stamps and stamps[key][2] == stamp:
                del stamps[key]  # logged once already, at this version
            else:
                self._unreadable.discard((key, stamp))
        missing = [
            (ns, name)
            for key, (ns, name, stamp) in stamps.items()
            if (hit := self._items.get(key)) is None or hit[0] != stamp
        ]
        if missing:
            for row in workloads_by_key(conn, missing):
                try:
                    entry = cached_workload(row)
                except (ValueError, KeyError, TypeError):
                    log.exception("workload %s cannot be read; left out of the cycle", row.key)
                    stamps.pop(row.key, None)
                    self._unreadable.add((row.key, (row.uid, row.version)))
                    continue
                self._items[row.key] = ((row.uid, row.version), entry)
        for key in [k for k in self._items if k not in stamps]:
            del self._items[key]
        return [self._items[key][1] for key in stamps]

    def written(self, appends: Sequence[tuple[str, int, str, Obj]]) -> None:
        """The rows a committed cycle wrote, at the versions it wrote them:
        the next refresh finds them here instead of fetching and decoding
        again what this process just encoded (every admitted gang's row,
        once a cycle). A row changed since by someone else has another
        version, and is fetched as before."""
        for _, version, _, data in appends:
            key = f"{data['namespace']}/{data['name']}"
            hit = self._items.get(key)
            if hit is None or hit[0] != (str(data["uid"]), version):
                continue
            before = hit[1]
            row = WorkloadRow(
                before.row.namespace,
                before.row.name,
                before.row.uid,
                version + 1,
                int(data["generation"]),
                data["labels"],
                data["annotations"],
                data["spec"],
                data["status"],
                before.row.created_at,
            )
            # The domain value reads the spec, the requeue state and the
            # queue time: unchanged by an admission or a pending reason.
            same = row.spec == before.row.spec and all(
                row.status.get(k) == before.row.status.get(k) for k in ("requeueState", "queuedAt")
            )
            try:
                entry = cached_workload(row, before.workload if same else None)
            except (ValueError, KeyError, TypeError):
                del self._items[key]  # the next refresh reads it (and says why it cannot)
                continue
            self._items[key] = ((row.uid, row.version), entry)


_UNREADABLE = object()


class ConfigCache:
    """Configuration objects as domain values by (kind, namespace, name),
    valid for one (version, uid)."""

    def __init__(self) -> None:
        self._items: dict[ConfigKey, tuple[tuple[int, str], Any]] = {}

    def refresh(self, conn: Any) -> dict[str, list[Any]]:
        stamps = config_stamps(conn, list(CONFIG_VALUES))
        missing = [
            k for k, v in stamps.items() if (hit := self._items.get(k)) is None or hit[0] != v
        ]
        if missing:
            for row in config_rows(conn, missing):
                try:
                    value = CONFIG_VALUES[row.kind](row)
                except (ValueError, KeyError, TypeError):
                    log.exception("%s %s cannot be read; left out of the cycle", row.kind, row.name)
                    value = _UNREADABLE
                self._items[(row.kind, row.namespace, row.name)] = (
                    (int(row.resource_version), str(row.uid)),
                    value,
                )
        for key in [k for k in self._items if k not in stamps]:
            del self._items[key]
        by_kind: dict[str, list[Any]] = {}
        for key in sorted(stamps):
            hit = self._items.get(key)
            if hit is not None and hit[1] is not _UNREADABLE:
                by_kind.setdefault(key[0], []).append(hit[1])
        return by_kind
