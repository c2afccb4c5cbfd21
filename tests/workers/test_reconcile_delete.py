"""How a pass deletes the jobs it no longer wants: those its listing tells
apart by their admission label in one request per kind and namespace, any
other one by name (a fake member records the requests)."""

from __future__ import annotations

from typing import Any

from workers import reconcile
from workers.plan import ADMISSION_LABEL, MANAGED, Actions, Ref
from workers.reconcile import Report


class Recorder:
    def __init__(self) -> None:
        self.by_name: list[Ref] = []
        self.by_label: list[tuple[str, str, str]] = []

    def delete(self, ref: Ref) -> None:
        self.by_name.append(ref)

    def delete_labelled(self, kind: str, namespace: str, selector: str) -> None:
        self.by_label.append((kind, namespace, selector))


def _job(name: str, admission: str | None, namespace: str = "team-a", kind: str = "Job") -> Any:
    labels = {ADMISSION_LABEL: admission} if admission else {}
    return {"kind": kind, "metadata": {"name": name, "namespace": namespace, "labels": labels}}


def test_jobs_told_apart_by_their_admission_go_in_one_request_per_kind_and_namespace() -> None:
    actual = [
        _job("a", "id-a"),
        _job("b", "id-b"),
        _job("c", "id-c", namespace="team-b"),
        _job("d", "id-d", kind="JobSet"),
        _job("kept", "id-kept"),
        _job("stray", None),  # no admission label: by name
        _job("twin-1", "id-twin"),  # two objects with one label: by name
        _job("twin-2", "id-twin"),
    ]
    doomed = [Ref.of(o) for o in actual if o["metadata"]["name"] != "kept"]
    member = Recorder()
    report = Report("c1")
    reconcile._delete(member, Actions(delete=doomed), report, actual)  # type: ignore[arg-type]
    assert member.by_label == [
        ("Job", "team-a", f"{MANAGED},{ADMISSION_LABEL} in (id-a,id-b)"),
        ("Job", "team-b", f"{MANAGED},{ADMISSION_LABEL} in (id-c)"),
        ("JobSet", "team-a", f"{MANAGED},{ADMISSION_LABEL} in (id-d)"),
    ]
    assert sorted(r.name for r in member.by_name) == ["stray", "twin-1", "twin-2"]
    assert sorted(report.deleted) == sorted(str(r) for r in doomed)


def test_a_long_batch_is_split(monkeypatch: Any) -> None:
    monkeypatch.setattr(reconcile, "DELETE_BATCH", 2)
    actual = [_job(f"j{i}", f"id-{i}") for i in range(5)]
    member = Recorder()
    reconcile._delete(  # type: ignore[arg-type]
        member, Actions(delete=[Ref.of(o) for o in actual]), Report("c1"), actual
    )
    assert [s.rsplit("(", 1)[1] for _, _, s in member.by_label] == [
        "id-0,id-1)",
        "id-2,id-3)",
        "id-4)",
    ]
