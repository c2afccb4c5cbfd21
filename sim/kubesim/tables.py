"""Server-side printing: ``meta.k8s.io/v1`` Tables for ``kubectl get``.

``kubectl get`` asks for ``application/json;as=Table``; the API server answers
with column definitions and one row of cells per object, from the CRD's
``additionalPrinterColumns`` (JSONPath) for custom resources and from built-in
printers for core kinds. The columns here follow ``pkg/printers/internalversion``
for the kinds we serve.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sim.kubesim.resources import ResourceType

__all__ = ["human_age", "jsonpath", "table"]

Obj = dict[str, Any]
Column = dict[str, Any]

_FILTER = re.compile(r"^\?\(@\.([\w.-]+)\s*==\s*['\"](.*)['\"]\)$")


def _steps(path: str) -> list[str]:
    steps: list[str] = []
    for match in re.finditer(r"\.([^.\[]+)|\[([^\]]*\)?)\]", path):
        steps.append(match[1] if match[1] is not None else f"[{match[2]}]")
    return steps


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Values at a kubectl-style JSONPath (``.a.b``, ``[0]``, ``[*]``, ``[?(@.k=='v')]``)."""
    current = [obj]
    for step in _steps(path.strip().strip("{}")):
        following: list[Any] = []
        for value in current:
            following.extend(_step(value, step))
        current = following
    return current


def _step(value: Any, step: str) -> list[Any]:
    if not step.startswith("["):
        return [value[step]] if isinstance(value, dict) and step in value else []
    inner = step[1:-1]
    if not isinstance(value, list):
        return []
    if inner == "*":
        return list(value)
    if inner.lstrip("-").isdigit():
        index = int(inner)
        return [value[index]] if -len(value) <= index < len(value) else []
    match = _FILTER.match(inner)
    if match:
        key, wanted = match[1], match[2]
        return [item for item in value if str(_dig(item, key)) == wanted]
    return []


def _dig(value: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d"


def _col(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> Column:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


_NAME = _col("Name", fmt="name")
_AGE = _col("Age")


def _pod_row(pod: Obj) -> list[Any]:
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in statuses)
    reason = status.get("reason") or status.get("phase", "Pending")
    for container in statuses:
        state = container.get("state") or {}
        detail = (state.get("waiting") or state.get("terminated") or {}).get("reason")
        if (detail and reason not in ("Succeeded", "Failed")) or detail in ("Completed", "Error"):
            reason = detail or reason
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        reason,
        restarts,
        human_age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP") or "<none>",
        (pod.get("spec") or {}).get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        "<none>",
    ]


def _job_row(job: Obj) -> list[Any]:
    status = job.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    if conditions.get("Complete") == "True":
        state = "Complete"
    elif conditions.get("Failed") == "True":
        state = "Failed"
    elif conditions.get("Suspended") == "True" or (job.get("spec") or {}).get("suspend"):
        state = "Suspended"
    else:
        state = "Running"
    completions = (job.get("spec") or {}).get("completions")
    done = status.get("succeeded", 0)
    shown = (
        f"{done}/{completions}"
        if completions is not None
        else f"{done}/1 of {job['spec'].get('parallelism', 1)}"
    )
    duration = ""
    if status.get("startTime"):
        end = status.get("completionTime")
        start = datetime.fromisoformat(status["startTime"].replace("Z", "+00:00"))
        stop = datetime.fromisoformat(end.replace("Z", "+00:00")) if end else datetime.now(UTC)
        duration = human_age(start.strftime("%Y-%m-%dT%H:%M:%SZ"), stop)
    return [
        job["metadata"]["name"],
        state,
        shown,
        duration,
        human_age(job["metadata"].get("creationTimestamp")),
    ]


def _node_row(node: Obj) -> list[Any]:
    conditions = {
        c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or ()
    }
    state = "Ready" if conditions.get("Ready") == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return [
        node["metadata"]["name"],
        state,
        "<none>",
        human_age(node["metadata"].get("creationTimestamp")),
        version,
    ]


def _namespace_row(ns: Obj) -> list[Any]:
    phase = (ns.get("status") or {}).get("phase", "Active")
    return [ns["metadata"]["name"], phase, human_age(ns["metadata"].get("creationTimestamp"))]


def _event_row(event: Obj) -> list[Any]:
    involved = event.get("involvedObject") or {}
    last = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event["metadata"].get("creationTimestamp")
    )
    return [
        human_age(last),
        event.get("type", ""),
        event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        event.get("message", ""),
    ]


_BUILTIN: dict[str, tuple[list[Column], Callable[[Obj], list[Any]]]] = {
    "pods": (
        [
            _NAME,
            _col("Ready"),
            _col("Status"),
            _col("Restarts", "string"),
            _AGE,
            _col("IP", priority=1),
            _col("Node", priority=1),
            _col("Nominated Node", priority=1),
            _col("Readiness Gates", priority=1),
        ],
        _pod_row,
    ),
    "jobs.batch": (
        [_NAME, _col("Status"), _col("Completions"), _col("Duration"), _AGE],
        _job_row,
    ),
    "nodes": ([_NAME, _col("Status"), _col("Roles"), _AGE, _col("Version")], _node_row),
    "namespaces": ([_NAME, _col("Status"), _AGE], _namespace_row),
    "events": (
        [_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")],
        _event_row,
    ),
}


def _crd_columns(
    rtype: ResourceType, version: str
) -> tuple[list[Column], Callable[[Obj], list[Any]]]:
    printer = list((rtype.version(version) or rtype.versions[-1]).printer_columns)
    if not printer:
        printer = [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    columns = [_NAME] + [
        _col(p["name"], p.get("type", "string"), p.get("priority", 0), p.get("format", ""))
        for p in printer
    ]

    def row(obj: Obj) -> list[Any]:
        cells: list[Any] = [obj["metadata"]["name"]]
        for column in printer:
            values = jsonpath(obj, column["jsonPath"])
            if column.get("type") == "date":
                cells.append(human_age(values[0]) if values else "<unknown>")
            elif not values:
                cells.append(None)
            elif column.get("type") in ("integer", "number", "boolean") and len(values) == 1:
                cells.append(values[0])
            else:
                cells.append(",".join(str(v) for v in values))
        return cells

    return [{**c, "type": "string" if c["type"] == "date" else c["type"]} for c in columns], row


def table(
    rtype: ResourceType,
    version: str,
    objects: list[Obj],
    resource_version: str,
    include: str = "Metadata",
    *,
    with_columns: bool = True,
    continue_token: str = "",
) -> Obj:
    columns, row = _BUILTIN.get(rtype.key) or _crd_columns(rtype, version)
    rows = []
    for obj in objects:
        entry: Obj = {"cells": row(obj)}
        if include == "Object":
            entry["object"] = obj
        elif include != "None":
            entry["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(entry)
    metadata: Obj = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns if with_columns else [],
        "rows": rows,
    }
