"""The parsed-YAML cache: the same documents as a parse, one file of JSON per
content, never a stale or a changed reading."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.yamlcache import CACHE_ENV, yaml_documents

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.example.com}
spec:
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
---
kind: Other
items: [1, 2.5, null, true, "08"]
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(where))
    return where


def test_a_file_is_parsed_once_and_read_back_the_same(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "crd.yaml"
    path.write_text(CRD)
    first = yaml_documents(path)
    assert first == list(yaml.safe_load_all(CRD))
    (entry,) = cache.iterdir()
    assert yaml_documents(path) == first
    # What is read the second time is the cache's: change it, and the reading follows.
    entry.write_text('[{"kind": "FromCache"}]')
    assert yaml_documents(path) == [{"kind": "FromCache"}]


def test_a_changed_file_is_read_anew(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "crd.yaml"
    path.write_text(CRD)
    yaml_documents(path)
    path.write_text(CRD.replace("things", "others"))
    assert yaml_documents(path)[0]["metadata"]["name"] == "others.example.com"
    assert len(list(cache.iterdir())) == 2


@pytest.mark.parametrize(
    "text", ["when: 2026-12-03\n", "{1: one}\n", "x: .nan\n"], ids=["date", "int-key", "nan"]
)
def test_what_json_would_change_is_never_cached(tmp_path: Path, cache: Path, text: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    assert repr(yaml_documents(path)) == repr(list(yaml.safe_load_all(text)))  # nan != nan
    assert not cache.exists() or not list(cache.iterdir())


def test_an_unwritable_cache_only_costs_the_parse(tmp_path: Path, cache: Path) -> None:
    cache.write_text("a file where the directory would be")
    path = tmp_path / "crd.yaml"
    path.write_text(CRD)
    assert yaml_documents(path) == list(yaml.safe_load_all(CRD))
