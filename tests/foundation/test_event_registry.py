"""The event registry (service/domain/events.py) against the code: every
event type the service and workers append is declared, the unit of work
refuses one that is not, and each read model applies every type the
registry gives it."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa

from service.app.kinds import ADMIN_KINDS, BY_KIND
from service.app.uow import SqlUnitOfWork
from service.domain.events import (
    API_TOKENS,
    EVENTS,
    OBJECT_STREAMS,
    RESOURCES,
    TOPICS,
    UnregisteredEvent,
)
from service.eventstore.port import EventMetadata, NewEvent
from service.eventstore.postgres import PostgresEventStore
from service.projections import all_projections
from service.projections.schema import api_tokens, resources
from tests.foundation.rebuild import rebuild_all

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "service" / "domain" / "events.py"
META = EventMetadata(actor="test", occurred_at=datetime(2025, 1, 1, tzinfo=UTC))
#: CamelCase of two words or more whose last word reads as an event's.
_EVENT_SHAPE = re.compile(r"^([A-Z][a-z]+)(?:[A-Z][a-z]+)*([A-Z][a-z]+)$")
#: Strings of that shape that name no event (a requeue reason, a pending reason).
NOT_EVENTS = frozenset({"ClusterDeleted", "ClusterQueueStopped"})


def _sources() -> Iterator[tuple[str, ast.Module]]:
    """Every module of the service and the workers, but the registry."""
    for top in ("service", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path != REGISTRY:
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                yield module.removesuffix(".__init__"), ast.parse(path.read_text(), str(path))


def _looks_like_an_event(value: str) -> bool:
    """Of the registry's vocabulary: its first word starts a registered
    type's name (Workload, Cluster, Token, ...) and its last ends like one."""
    match = _EVENT_SHAPE.match(value)
    if match is None or value in NOT_EVENTS:
        return False
    first, last = match.groups()
    subjects = {m.group(1) for m in map(_EVENT_SHAPE.match, EVENTS) if m is not None}
    return first in subjects and (last.endswith(("ed", "ing")) or last in {"Lost", "Pending"})


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _constant(module: str, node: ast.expr | None) -> str | None:
    """A string literal, or a module-level string constant of ``module``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        value = getattr(importlib.import_module(module), node.id, None)
        return value if isinstance(value, str) else None
    return None


def _calls(tree: ast.Module, name: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called == name:
                yield node


def test_every_event_type_the_code_names_is_registered() -> None:
    unregistered = set()
    for module, tree in _sources():
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and _looks_like_an_event(text) and text not in EVENTS:
                unregistered.add(f"{module}: {text}")
        for call in _calls(tree, "NewEvent"):
            event_type = _constant(module, _argument(call, 1, "type"))
            if event_type is not None and event_type not in EVENTS:
                unregistered.add(f"{module}:{call.lineno}: NewEvent({event_type!r})")
    assert not unregistered, "declare these in service/domain/events.py"


def test_only_the_registry_declares_the_services_events() -> None:
    declaring = [
        f"{module}:{call.lineno}"
        for module, tree in _sources()
        for name in ("declare", "declare_topic")
        for call in _calls(tree, name)
    ]
    assert declaring == []


def test_every_topic_published_is_registered_and_consumed() -> None:
    from workers.consumers import HANDLERS
    from workers.tasks import deliver_task  # noqa: F401 - registers the consumers

    published = {
        _constant(module, _argument(call, 1, "topic")) or f"{module}:{call.lineno}"
        for module, tree in _sources()
        for call in _calls(tree, "OutboxMessage")
    }
    assert published <= set(TOPICS)
    assert set(TOPICS) <= set(HANDLERS), "a topic without a consumer is dead-lettered"
    ours = {t for t, handler in HANDLERS.items() if handler.__module__.startswith("workers.")}
    assert ours <= set(TOPICS)


def test_events_on_an_objects_stream_go_to_its_read_model() -> None:
    """They carry the object's whole state: a type the read model skipped
    would leave a rebuild at the object's state before it."""
    assert {k.kind.lower() for k in ADMIN_KINDS} | {"workload"} == OBJECT_STREAMS
    for event in EVENTS.values():
        if event.streams & OBJECT_STREAMS:
            assert event.streams <= OBJECT_STREAMS, event
            assert RESOURCES in event.read_models, event
        if "token" in event.streams:
            assert API_TOKENS in event.read_models, event
    tables = [t.name for p in all_projections() for t in p.tables]
    owned = {model for event in EVENTS.values() for model in event.read_models}
    assert owned <= set(tables) and len(tables) == len(set(tables))


def test_the_unit_of_work_refuses_an_unregistered_event(engine: sa.Engine) -> None:
    appends = [
        ("workload-team-a/w", "WorkloadSuspended"),  # not declared at all
        ("workload-team-a/w", "ClusterCollected"),  # declared for cluster- streams only
    ]
    for stream, event_type in appends:
        with SqlUnitOfWork(engine) as uow, pytest.raises(UnregisteredEvent, match=event_type):
            uow.events.append(stream, 0, [NewEvent(uuid4(), event_type, {}, META)])
    with SqlUnitOfWork(engine) as uow:
        uow.events.append("workload-team-a/w", 0, [NewEvent(uuid4(), "WorkloadPending", {}, META)])
        uow.commit()
    assert PostgresEventStore(engine).head_position() == 1


def _object(category: str, name: str, event_type: str) -> tuple[str, dict[str, Any]]:
    kind = next(k for k in BY_KIND if k.lower() == category)
    namespace = "team-a" if kind in ("Workload", "LocalQueue") else ""
    stream = f"{category}-{namespace}/{name}" if namespace else f"{category}-{name}"
    data = {
        "kind": kind,
        "namespace": namespace,
        "name": name,
        "uid": str(uuid4()),
        "spec": {},
        "status": {"by": event_type},
        "created_at": META.occurred_at.isoformat(),
    }
    return stream, data


def _token(event_type: str) -> tuple[str, dict[str, Any]]:
    token_id = uuid4()
    data = {
        "id": str(token_id),
        "name": event_type,
        "role": "admin",
        "token_hash": uuid4().hex,
        "created_at": META.occurred_at.isoformat(),
    }
    return f"token-{token_id}", data


def test_each_read_model_applies_every_event_the_registry_gives_it(engine: sa.Engine) -> None:
    """One event of every registered type on each stream it may go to,
    then a rebuild: each shows in the read model the registry names."""
    store, expected_objects, expected_tokens = PostgresEventStore(engine), set(), set()
    for n, event in enumerate(EVENTS.values()):
        for category in sorted(event.streams):
            if RESOURCES in event.read_models:
                stream, data = _object(category, f"n{n}", event.name)
                expected_objects.add((data["kind"], data["name"], event.name))
            elif API_TOKENS in event.read_models:
                stream, data = _token(event.name)
                expected_tokens.add(event.name)
            else:
                continue
            store.append(stream, 0, [NewEvent(uuid4(), event.name, data, META)])
    assert len(expected_objects) > 20 and expected_tokens

    rebuild_all(engine)

    with engine.connect() as conn:
        shown = {
            (kind, name, status.get("by"))
            for kind, name, status in conn.execute(
                sa.select(resources.c.kind, resources.c.name, resources.c.status)
            )
        }
        tokens = set(conn.execute(sa.select(api_tokens.c.name)).scalars())
    assert expected_objects - shown == set()
    assert expected_tokens - tokens == set()
