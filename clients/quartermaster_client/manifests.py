"""Manifests from files, directories or standard input: multi-document YAML
(or JSON), ``kind: List`` unpacked, empty documents skipped."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from quartermaster_client.errors import QuartermasterError

SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(QuartermasterError):
    """A file is missing, not YAML, or holds something that is not an object."""


@dataclass(frozen=True)
class Manifest:
    body: dict[str, Any]
    source: str

    @property
    def api_version(self) -> str:
        return str(self.body.get("apiVersion") or "")

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name", ""))


def _files(path: Path, recursive: bool) -> list[Path]:
    if path.is_dir():
        pattern = "**/*" if recursive else "*"
        return sorted(p for p in path.glob(pattern) if p.suffix in SUFFIXES and p.is_file())
    if not path.exists():
        raise ManifestError(f"{path}: no such file or directory")
    return [path]


def parse(text: str, source: str) -> list[Manifest]:
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: not valid YAML: {error}") from None
    found: list[Manifest] = []
    for index, document in enumerate(documents):
        where = f"{source}#{index}" if len(documents) > 1 else source
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ManifestError(f"{where}: expected an object, got {type(document).__name__}")
        if document.get("kind") == "List" and isinstance(document.get("items"), list):
            found += [Manifest(item, where) for item in document["items"] if item]
        else:
            found.append(Manifest(document, where))
    return found


def load(
    paths: Iterable[str], recursive: bool = False, stdin: TextIO | None = None
) -> list[Manifest]:
    """Every object in ``paths``, in order; ``-`` reads standard input."""
    found: list[Manifest] = []
    for raw in paths:
        if raw == "-":
            found += parse((stdin or sys.stdin).read(), "<stdin>")
            continue
        for file in _files(Path(raw).expanduser(), recursive):
            found += parse(file.read_text(), str(file))
    return found


__all__ = ["Manifest", "ManifestError", "load", "parse"]
