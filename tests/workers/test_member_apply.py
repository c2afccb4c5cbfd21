"""Server-side apply through the member adapter (the body encoded by us,
sent through the client's REST layer), against a stand-in API server:
every kind's path, our field manager, and a refusal with its words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.workers.members import members
from workers.clusters import FIELD_MANAGER, Member, MemberError
from workers.plan import Ref

_NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
_FLAVOR = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "ResourceFlavor",
    "metadata": {"name": "qm-h100"},
    "spec": {"nodeLabels": {"example.com/gpu": "h100"}},
}


def _job(label: str = "1") -> dict[str, Any]:
    pod = {"containers": [{"name": "main", "image": "i"}], "restartPolicy": "Never"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "a", "namespace": "team-a", "labels": {"x": label}},
        "spec": {"parallelism": 1, "completions": 1, "template": {"spec": pod}},
    }


def _managers(obj: dict[str, Any] | None) -> list[str]:
    assert obj is not None
    return [m["manager"] for m in obj["metadata"].get("managedFields") or ()]


def test_apply_writes_each_kind_where_it_lives_as_our_field_manager(tmp_path: Path) -> None:
    with members(tmp_path) as (c1,):
        member = Member("c1", c1.configuration())
        try:
            for obj in (_NAMESPACE, _FLAVOR, _job()):
                member.apply(obj)
                member.apply(obj)  # again: nothing changes, nothing fails
            job = c1.get("batch/v1", "Job", "team-a", "a")
            assert job is not None and job["metadata"]["labels"]["x"] == "1"
            assert FIELD_MANAGER in _managers(job)
            flavor = c1.get("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "", "qm-h100")
            assert FIELD_MANAGER in _managers(flavor)
            assert member.exists(Ref("Namespace", "", "team-a"))
            member.apply(_job("2"))
            job = c1.get("batch/v1", "Job", "team-a", "a")
            assert job is not None and job["metadata"]["labels"]["x"] == "2"
        finally:
            member.close()


def test_a_field_the_member_does_not_know_is_refused_with_its_words(tmp_path: Path) -> None:
    with members(tmp_path) as (c1,):
        member = Member("c1", c1.configuration())
        try:
            unknown = {**_FLAVOR, "spec": {**_FLAVOR["spec"], "noSuchField": 1}}
            with pytest.raises(MemberError) as refused:
                member.apply(unknown)
            assert refused.value.refused and "noSuchField" in refused.value.body
            assert c1.get("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "", "qm-h100") is None
        finally:
            member.close()
