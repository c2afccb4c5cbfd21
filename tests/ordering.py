"""The order the suite's tests are handed out in, under ``-n N --dist worksteal``.

Worksteal gives each of the N processes an equal, contiguous share of the
collected tests and lets an idle one take half of the longest queue. Left
in file order, the few modules that take minutes (a fault run, the README
tour's fresh venv, the API fuzzing) start late and in one share, and the
run ends with one process still busy while the others wait. Here each
share begins with its part of the long modules (longest first, each to the
share with the least so far) and is filled up with the rest in file order;
modules stay whole (their fixtures are module-scoped), but for the tests
:data:`LONG` names alone. A stale figure below costs speed, never a result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

_FUZZ = (
    "tests/api/test_schemathesis.py::test_schemathesis_finds_no_server_error_and_no_nonconformance"
)

#: Seconds each long module (or test, by node id) took on a quiet 2-core box
#: (``.ci/run --durations``, 2026-12-02, three processes); those changed since
#: scaled by what they took after the change over before it, alone and back
#: to back (2026-12-03).
LONG = {
    "tests/standalone/test_readme_tour.py": 160,
    "tests/standalone/test_restarts.py": 65,
    f"{_FUZZ}[suite-quota]": 80,
    f"{_FUZZ}[suite-fleet]": 50,
    f"{_FUZZ}[suite-namespaced]": 40,
    f"{_FUZZ}[suite-rest]": 20,
    "tests/workers/test_e2e_fleet.py": 55,
    "tests/standalone/test_standalone.py": 70,
    "tests/console/test_live.py": 70,
    "tests/clients/test_qmctl.py": 40,
    "tests/bench/test_kueue_perf_smoke.py": 50,
    "tests/deploy/test_manifests_run.py": 50,
    "tests/api/test_secret_rotation.py": 50,
    "tests/console/test_accessibility.py": 40,
    "tests/workers/test_outbox.py": 35,
    "tests/workers/test_fencing_partition.py": 26,
    "tests/workers/test_usage_invariant.py": 32,
    "tests/workers/test_chaos.py": 24,
    # Issue 22 to 24's modules (2026-12-02, measured on a loaded box, halved).
    "tests/workers/test_e2e_mixed_fleet.py": 70,
    "tests/workers/test_volcano_member.py": 45,
    "tests/workers/test_e2e_job_kinds.py": 35,
    "tests/engine/test_consolidation_machine.py": 30,
}

T = TypeVar("T")


def spread(
    items: Sequence[T], keys: Sequence[str], workers: int, long: Mapping[str, float] = LONG
) -> list[T]:
    """``items`` (each keyed by its module path, or its node id where ``long``
    names it) reordered into ``workers`` shares as worksteal cuts them, each
    led by its part of ``long``."""
    if workers < 2:
        return list(items)
    modules: dict[str, list[T]] = {}
    for item, key in zip(items, keys, strict=True):
        modules.setdefault(key, []).append(item)
    shares: list[list[T]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for path in sorted((p for p in modules if p in long), key=lambda p: -long[p]):
        lightest = loads.index(min(loads))
        shares[lightest] += modules[path]
        loads[lightest] += long[path]
    rest = [item for path, tests in modules.items() if path not in long for item in tests]
    ordered: list[T] = []
    left = len(items)
    for i, share in enumerate(shares):
        size = left // (workers - i)  # what worksteal hands the i-th process
        left -= size
        fill = max(0, size - len(share))
        ordered += share + rest[:fill]
        rest = rest[fill:]
    return ordered + rest
