"""The README's run command and its five-minute tour are a test.

The run command is carried out as written — a fresh virtual environment, the
project installed into it by pip, ``quartermaster standalone`` from it — and
the tour's every ``qmctl`` command runs from that environment as a program
against that live standalone, with every line of output the README claims:
tables up to their AGE column, other output line by line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service.runtime.embedded import steady_ports
from tests.standalone.test_standalone import OURS, REPO, Standalone, _stop_and_check_clean

README = REPO / "README.md"
#: What the tour runs, in order: a change to the README's tour must show here.
TOUR = [
    "apply",
    "get",
    "submit",
    "get",
    "submit",
    "submit",
    "wait",
    "get",
    "submit",
    "wait",
    "wait",
    "get",
    "ledger",
    "explain",
    # serving beside training: scale up, a reclaim down to minReplicas
    "submit",
    "wait",
    "wait",
    "scale",
    "wait",
    "get",
    "submit",
    "wait",
    "wait",
    "ledger",
    "submit",
    "wait",
    "explain",
    "get",
    "ledger",
    "ledger",
    "ledger",
]


@dataclass
class Step:
    command: list[str]
    claims: list[str] = field(default_factory=list)


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _blocks(section: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced code block."""
    return re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)


def _tour(section: str) -> list[Step]:
    """Each qmctl command of the tour with the output lines its comments claim."""
    steps: list[Step] = []
    for language, body in _blocks(section):
        if language != "sh":
            continue
        for line in body.splitlines():
            if line.startswith(".venv/bin/qmctl"):
                steps.append(Step(shlex.split(line.split("  #", 1)[0])))
            elif line.startswith("# ") and steps:
                steps[-1].claims.append(line[2:])
    return steps


def _expand(arg: str, standalone: Standalone) -> str:
    """The README's paths as the test's: the repo's files, the data directory,
    and ``$(cat FILE)`` read as the shell would."""
    arg = arg.replace("sim/", str(REPO / "sim") + "/").replace(".qm-data", str(standalone.data))
    if match := re.fullmatch(r"\$\(cat (.+)\)", arg):
        return Path(match.group(1)).read_text().strip()
    return arg


def _run_command() -> list[list[str]]:
    """The README's run command, split at ``&&``."""
    (block,) = [b for lang, b in _blocks(_section("Two commands")) if lang == "sh"][:1]
    return [shlex.split(part) for part in block.strip().split("&&")]


def _fresh_venv(where: Path, env: dict[str, str]) -> Path:
    """The run command's first two parts, as written, in ``where``: the
    virtual environment and pip installing the project (editable) into it."""
    create, install, start = _run_command()
    assert create == ["python3", "-m", "venv", ".venv"], create
    assert install == [".venv/bin/pip", "install", "-e", "."], install
    assert start == [".venv/bin/quartermaster", "standalone"], start
    venv = where / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: byte-compiling every dependency is the install's
    # longest part and checks nothing the tour does not.
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    pip.append("--no-compile")
    installed = subprocess.run(
        [*pip, "-e", str(REPO)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv / "bin"


@pytest.fixture
def standalone() -> Iterator[Standalone]:
    # A directory of our own, not pytest's tmp_path: another pytest session
    # on the machine prunes old tmp_path trees, and this one lives minutes.
    with tempfile.TemporaryDirectory(prefix="qm-tour-") as where:
        root = Path(where)
        env = {k: v for k, v in os.environ.items() if k not in OURS and k != "VIRTUAL_ENV"}
        env["QMCTL_CONFIG"] = str(root / "qmctl-config")
        bin = _fresh_venv(root, env)
        run = Standalone(root / "data", steady_ports(2), env, bin)
        try:
            yield run
        finally:
            if run.process.poll() is None:
                run.interrupt()


def _check(step: Step, stdout: str) -> None:
    if not step.claims:
        return
    if step.command[1] == "get":  # a table: the same header and rows, up to the AGE column
        got = [line.split()[:-1] for line in stdout.strip().splitlines()]
        want = [line.split()[:-1] for line in step.claims]
        assert got == want, stdout
        return
    printed = [line.strip() for line in stdout.splitlines()]
    for claim in step.claims:
        assert claim.strip() in printed, f"{step.command}: no line {claim!r} in\n{stdout}"


# A hang guard over the fixture's fresh venv and pip install (each bounded by
# its own subprocess timeout) and the tour: minutes on a busy machine.
@pytest.mark.timeout(2400)
def test_the_readme_run_command_and_tour(standalone: Standalone) -> None:
    printed = next(body for language, body in _blocks(_section("Standalone mode")) if not language)
    # Every line the README shows standalone printing, up to the values that vary.
    for claimed in printed.splitlines():
        label = re.split(r"\s{2,}|\d", claimed.strip())[0].strip()
        assert any(label and label in line for line in standalone.err + standalone.out), (
            f"README shows {claimed!r}; standalone printed:\n{standalone.transcript()}"
        )
    steps = _tour(_section("A five-minute tour"))
    assert [step.command[1] for step in steps] == TOUR
    for step in steps:
        args = [_expand(a, standalone) for a in step.command[1:]]
        ran = subprocess.run(
            [
                str(standalone.bin / "qmctl"),
                *args,
                *(["--timeout", "300"] if "--wait" in args else []),
            ],
            env=standalone.env,
            cwd=standalone.data.parent,
            capture_output=True,
            text=True,
            timeout=360,
            check=False,
        )
        assert ran.returncode == 0, f"{step.command}: {ran.stdout}{ran.stderr}"
        _check(step, ran.stdout)
        if args[:2] == ["ledger", "verify"]:
            assert "OK" in ran.stdout or "verified" in ran.stdout.lower(), ran.stdout
    _stop_and_check_clean(standalone)
