"""Large YAML files read once per machine, not once per process.

The CRDs the API validates submissions against and the stand-in serves are
megabytes of YAML (Kueue's Workload, KubeRay's RayJob, LWS: 1.3-1.4 MB
each); libyaml takes seconds for them all, and the suite and standalone
start many processes that each read them. Parsed once, the documents are
kept as JSON in a cache directory, named by the SHA-256 of the file's bytes
(a changed file is a new name; nothing is ever stale), and read back with
orjson in milliseconds. A document JSON cannot hold as it is (a YAML date,
a non-string key) is never cached; an unwritable cache only costs the parse.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson
import yaml

#: Overrides where the parsed files are kept (else ``$XDG_CACHE_HOME`` or
#: ``~/.cache``, then ``quartermaster/yaml``).
CACHE_ENV = "QM_YAML_CACHE_DIR"
_FORMAT = "1"  # bump when what is stored changes shape
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def cache_dir() -> Path:
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "quartermaster" / "yaml"


def yaml_documents(path: Path) -> list[Any]:
    """Every document of the YAML file at ``path``, as ``yaml.safe_load_all`` reads them."""
    data = path.read_bytes()
    cached = cache_dir() / f"{hashlib.sha256(data).hexdigest()}.v{_FORMAT}.json"
    found = _read(cached)
    if found is not None:
        return found
    documents = list(yaml.load_all(data, Loader=_LOADER))
    _keep(cached, documents)
    return documents


def _read(cached: Path) -> list[Any] | None:
    """The cache entry's documents; ``None`` when there is none (or it is
    unreadable: then it is parsed again and written anew)."""
    try:
        found: list[Any] = orjson.loads(cached.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return found


def _plain(node: Any) -> bool:
    """Whether JSON reads ``node`` back as it is: strings as keys, JSON's
    scalars (``json.dumps`` would write an integer key as a string and a
    date as an error)."""
    if isinstance(node, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in node.items())
    if isinstance(node, list):
        return all(_plain(item) for item in node)
    if isinstance(node, float):
        return math.isfinite(node)
    return node is None or isinstance(node, str | int)


def _keep(cached: Path, documents: list[Any]) -> None:
    """Write the cache entry whole or not at all (a rename: a reader never
    sees half of one), and only what JSON reads back the same."""
    if not _plain(documents):
        return
    text = json.dumps(documents)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=cached.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temporary, cached)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError:
        return


__all__ = ["CACHE_ENV", "cache_dir", "yaml_documents"]
