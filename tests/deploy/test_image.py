"""The image, without building it (no registry for base images here).

The Containerfile is read: its base pinned by digest, a numeric non-root
user, ``quartermaster`` as an exec-form entrypoint, nothing run with a shell
in the final stage, temporary files and HOME under /tmp. What it runs is run:
the wheel is built from exactly the sources its build stage copies, installed
into a fresh virtual environment, and its entry point answers ``--help`` and
applies the migrations it carries to a scratch database.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.app.floor import digest_problem
from service.app.migrate import head_revision
from tests.deploy.manifests import (
    OVERLAYS,
    ROOT,
    Stage,
    containerfile,
    containers,
    pods,
    render,
)
from tests.harness import scratch_database

BASE = re.compile(r"^docker\.io/library/python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}$")


def _stages() -> list[Stage]:
    stages = containerfile()
    assert len(stages) >= 2, "a multi-stage build: the run image holds no build tools"
    return stages


def test_every_stage_is_the_slim_python_311_base_pinned_by_digest() -> None:
    for stage in _stages():
        assert BASE.match(stage.base), stage.base
        assert digest_problem(stage.base) is None


def test_the_run_stage_is_a_numeric_non_root_user_with_quartermaster_as_entrypoint() -> None:
    final = _stages()[-1]
    users = final.all("USER")
    assert users, "the run stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER {users[-1]}: a numeric uid, not root"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    assert final.exec_form("ENTRYPOINT") == ["quartermaster"]
    cmd = final.all("CMD")
    assert not cmd or final.exec_form("CMD") is not None, "CMD in exec form (no shell)"
    assert not final.all("SHELL")
    assert not final.all("RUN"), "the run stage runs nothing at build time either"


def test_the_run_stage_writes_only_under_tmp() -> None:
    env = _stages()[-1].env()
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1", "no bytecode written beside the code"
    assert env.get("HOME") == "/tmp"
    assert env.get("TMPDIR") == "/tmp"
    assert env.get("PATH", "").startswith("/opt/quartermaster/bin:")


def test_the_manifests_run_as_the_images_user() -> None:
    uid = int(_stages()[-1].all("USER")[-1].partition(":")[0])
    for overlay in OVERLAYS.values():
        for workload, template in pods(render(overlay)):
            for _, container in containers(template):
                if "/quartermaster/quartermaster" not in container["image"]:
                    continue
                pod = template["spec"].get("securityContext") or {}
                own = container.get("securityContext") or {}
                assert own.get("runAsUser", pod.get("runAsUser")) == uid, workload["metadata"]


def _copied_sources(stage: Stage) -> list[Path]:
    """What the build stage COPYs from the build context (not --from another stage)."""
    sources = []
    for args in stage.all("COPY"):
        if args.startswith("--from"):
            continue
        *names, _ = args.split()
        sources += [ROOT / name for name in names]
    return sources


@pytest.fixture
def fresh_install() -> Iterator[Path]:
    """The wheel, built from the build stage's sources in a directory of its
    own, installed into a fresh venv (``--no-deps``: the dependencies are
    the development venv's, on the new one's path after its own packages, so
    that every module of ours comes from the wheel). Removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="qm-wheel-"))
    try:
        context = work / "context"
        context.mkdir()
        for source in _copied_sources(_stages()[0]):
            target = context / source.relative_to(ROOT)
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, target)
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        wheels = work / "wheels"
        subprocess.run(
            [*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), "."],
            cwd=context,
            check=True,
            capture_output=True,
            timeout=600,
        )
        venv = work / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        (wheel,) = wheels.glob("quartermaster-*.whl")
        subprocess.run(
            [*pip, "--python", str(python), "install", "--no-deps", str(wheel)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        purelib = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        (Path(purelib) / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        yield venv
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(venv: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QM_")}
    done = subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=venv,
        env={**clean, **(env or {})},
    )
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_wheel_installs_and_its_entry_point_runs(
    fresh_install: Path, postgres_server_url: str
) -> None:
    venv = fresh_install
    where = _run(
        venv, "python", "-c", "import service, workers, migrations; print(service.__file__)"
    )
    assert where.strip().startswith(str(venv)), f"service imported from {where!r}, not the wheel"
    for command in ("migrate", "wait-for-migrations", "api", "worker", "scheduler", "fence-agent"):
        assert "Usage: quartermaster" in _run(venv, "quartermaster", command, "--help"), command
    assert "Commands" in _run(venv, "quartermaster", "--help")
    # The wheel carries the migrations and the CRDs the API validates with.
    head = _run(
        venv, "python", "-c", "from service.app.migrate import head_revision as h; print(h())"
    )
    assert head.strip() == head_revision()
    data = (
        "import importlib.resources as r, sys; "
        "sys.exit(not all(r.files(p).joinpath(f).is_file() for p, f in ("
        "('service.app', 'crds/jobset.x-k8s.io_jobsets.yaml'), "
        "('sim', 'fleets/demo.yaml'), ('migrations', 'alembic.ini'))))"
    )
    _run(venv, "python", "-c", data)
    with scratch_database(postgres_server_url, "wheel") as url:
        _run(venv, "quartermaster", "migrate", env={"QM_DATABASE_URL": url})
        _run(
            venv,
            "quartermaster",
            "wait-for-migrations",
            "--timeout",
            "5",
            env={"QM_DATABASE_URL": url},
        )
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        finally:
            engine.dispose()
        assert version == head_revision()
