"""The timeline's plain words for a run that saves its work: each checkpoint
named with its time, a row of them shown as the latest, a held kind's
reason in words rather than its code, and a serving unit's events by its
replica."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from service.app.auth import Principal, Role
from service.app.overview import TimelineEvent
from service.console.words import reason_words, timeline

READER = Principal("alice", frozenset({Role.SUBMITTER}), frozenset({"team-a"}))
START = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _event(position: int, kind: str, **status: Any) -> TimelineEvent:
    at = START + timedelta(minutes=position)
    return TimelineEvent(position, kind, at, "system:sync", status, {"queueName": "train"})


def test_checkpoints_in_a_row_are_shown_as_the_latest() -> None:
    events = [
        _event(1, "WorkloadSubmitted"),
        _event(2, "WorkloadRunning", state="Running"),
        *(
            _event(3 + i, "WorkloadCheckpointed", lastCheckpoint=f"2026-12-02T12:0{3 + i}:00Z")
            for i in range(4)
        ),
        _event(8, "WorkloadFinished", state="Finished", outcome="Succeeded"),
        _event(9, "WorkloadCheckpointed", lastCheckpoint="2026-12-02T12:09:00Z"),
    ]
    moments = timeline(events, READER)
    assert [m.type for m in moments] == [
        "WorkloadSubmitted",
        "WorkloadRunning",
        "WorkloadCheckpointed",
        "WorkloadFinished",
        "WorkloadCheckpointed",
    ]
    saved = moments[2]
    assert saved.words == "Checkpointed: its work is saved as of 2026-12-02T12:06:00Z"
    assert saved.at == START + timedelta(minutes=6)


def test_a_held_kind_waits_in_words() -> None:
    assert reason_words("KindNotRunnable") == "its kind cannot run on member clusters yet"
    (held,) = timeline([_event(1, "WorkloadPending", pendingReasonCode="KindNotRunnable")], READER)
    assert held.words == "Pending: its kind cannot run on member clusters yet"


def test_a_serving_units_events_name_their_replicas() -> None:
    units = [
        {"replica": r, "admission": {"cluster": "c1", "preempted": ["team-b/x"] if r else []}}
        for r in (0, 1)
    ]
    status = {"replicaAdmissions": units}
    admitted = TimelineEvent(1, "WorkloadAdmitted", START, "system:admission", status, {}, (1,))
    released = TimelineEvent(2, "WorkloadFinished", START, "alice", {}, {}, (1, 0))
    words = [m.words for m in timeline([admitted, released], READER)]
    assert words == [
        "Replica 1: Admitted to cluster c1; preempting a workload of another namespace",
        "Replicas 1, 0 released by a scale down",
    ]
