"""The README's standalone tour is a test: every line it shows standalone
printing, and every ``qmctl`` command of its tour with the output it claims,
against a live ``quartermaster standalone`` started as a program."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from service.runtime.embedded import free_port
from tests.standalone.test_standalone import BIN, OURS, REPO, Standalone, _stop_and_check_clean

README = REPO / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _blocks(section: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced code block."""
    return re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)


def _tour(section: str) -> list[tuple[list[str], list[str]]]:
    """Each qmctl command of the tour with the output lines its comments claim."""
    steps: list[tuple[list[str], list[str]]] = []
    for language, body in _blocks(section):
        if language != "sh":
            continue
        for line in body.splitlines():
            if line.startswith(".venv/bin/qmctl"):
                command = shlex.split(line.split("#", 1)[0])
                steps.append((command, []))
            elif line.startswith("# ") and steps:
                steps[-1][1].append(line[2:])
    return steps


def _expand(arg: str, standalone: Standalone) -> str:
    """The README's paths as the test's: the repo's files, the data directory,
    and ``$(cat FILE)`` read as the shell would."""
    arg = arg.replace("sim/", str(REPO / "sim") + "/").replace(".qm-data", str(standalone.data))
    if match := re.fullmatch(r"\$\(cat (.+)\)", arg):
        return Path(match.group(1)).read_text().strip()
    return arg


@pytest.fixture
def standalone(tmp_path: Path) -> Standalone:
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env["QMCTL_CONFIG"] = str(tmp_path / "qmctl-config")
    return Standalone(tmp_path / "data", free_port(), env)


def test_the_readme_standalone_tour(standalone: Standalone) -> None:
    section = _section("Standalone mode")
    printed = next(body for language, body in _blocks(section) if language == "")
    # Every line the README shows standalone printing, up to the values that vary.
    for claimed in printed.splitlines():
        label = re.split(r"\s{2,}|\d", claimed.strip())[0].strip()
        assert any(label and label in line for line in standalone.err + standalone.out), (
            f"README shows {claimed!r}; standalone printed:\n{standalone.transcript()}"
        )
    tour = _tour(section)
    assert [c[1] for c, _ in tour] == ["get", "submit", "explain", "ledger", "ledger", "ledger"]
    for command, claims in tour:
        args = command[1:]
        args = [_expand(a, standalone) for a in args]
        ran = subprocess.run(
            [str(BIN / "qmctl"), *args, *(["--timeout", "150"] if "--wait" in args else [])],
            env=standalone.env,
            cwd=standalone.data.parent,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert ran.returncode == 0, f"{command}: {ran.stdout}{ran.stderr}"
        if claims:  # a table: the same header and rows, up to the AGE column
            got = [line.split()[:-1] for line in ran.stdout.strip().splitlines()]
            want = [line.split()[:-1] for line in claims]
            assert got == want, ran.stdout
        if args[0] == "explain":
            assert "island" in ran.stdout, ran.stdout
        if args[:2] == ["ledger", "verify"]:
            assert "OK" in ran.stdout or "verified" in ran.stdout.lower(), ran.stdout
    _stop_and_check_clean(standalone)
