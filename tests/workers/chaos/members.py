"""The stand-in members, each a process of its own with its fence agent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes

from service.runtime.demo import StandIn, stand_ins
from service.runtime.supervisor import Child
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until
from tests.workers.chaos.config import ADMISSION_LABEL, MEMBERS, SETTINGS, Size
from tests.workers.stack import (
    Stack,
)


@dataclass
class Member:
    """One stand-in member cluster: its own process, kubeconfig and agent."""

    name: str
    child: Child
    kubeconfig: Path
    stand_in: StandIn
    admin: tuple[str, str]
    agent: Child | None = None
    #: Its intervals as read just before it was killed, and when.
    final: list[dict[str, Any]] | None = None
    killed_at: float | None = None

    def intervals(self) -> list[dict[str, Any]]:
        if self.final is not None:
            return self.final
        url, token = self.admin
        answer = httpx.get(
            f"{url}/_admin/intervals", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        answer.raise_for_status()
        records: list[dict[str, Any]] = answer.json()
        return records

    def api(self) -> Any:
        new_client: Any = kubernetes.config.new_client_from_config
        return new_client(config_file=str(self.kubeconfig), context=self.name)

    def ours(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Jobs and pods of ours on it now (a fresh list)."""
        with self.api() as api:
            jobs: Any = kubernetes.client.BatchV1Api(api).list_job_for_all_namespaces(
                label_selector=ADMISSION_LABEL, _preload_content=False
            )
            pods: Any = kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces(
                label_selector=ADMISSION_LABEL, _preload_content=False
            )
            return json.loads(jobs.data)["items"], json.loads(pods.data)["items"]


def start_members(stack: Stack, fleet: Path, size: Size) -> dict[str, Member]:
    """Each member a ``sim cluster`` process of its own (so that one can be
    killed alone), started together and then waited for."""
    (stack.workdir / "clusters").mkdir(parents=True, exist_ok=True)
    started = {}
    for name in MEMBERS:
        kubeconfig = stack.workdir / "clusters" / f"{name}.kubeconfig"
        started[name] = (
            stack.supervisor.start(
                f"member-{name}",
                [
                    *(sys.executable, "-m", "sim.cli", "cluster", "--fleet", str(fleet)),
                    *("--cluster", name, "--port", "0", "--time-scale", str(size.time_scale)),
                    *("--kubeconfig-out", str(kubeconfig)),
                ],
            ),
            kubeconfig,
        )
    members = {}
    for name, (child, kubeconfig) in started.items():

        def up(child: Child = child) -> bool:
            return "kubeconfig written" in child.output() or not child.alive

        wait_until(up, LONG_CEILING, f"member {name}")
        if not child.alive:
            raise RuntimeError(f"member {name} exited:\n{child.tail(30)}")
        (stand_in,) = stand_ins(kubeconfig)
        line = next(x for x in child.output().splitlines() if '"adminToken"' in x)
        entry = json.loads(line)
        members[name] = Member(
            name, child, kubeconfig, stand_in, (entry["admin"], entry["adminToken"])
        )
    return members


def start_agent(stack: Stack, member: Member) -> None:
    member.agent = stack.supervisor.start(
        f"fence-{member.name}",
        [
            *(sys.executable, "-m", "workers.cli", "fence-agent"),
            *("--kubeconfig", str(member.kubeconfig), "--context", member.name),
            *("--poll-interval", SETTINGS["QM_FENCE_POLL_INTERVAL"]),
        ],
    )


def kill(child: Child) -> None:
    """SIGKILL the child's whole process group (a Celery worker's pool,
    uvicorn's workers) and reap it."""
    child.snapshot()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        child.process.wait(10)
    for straggler in child.stragglers():
        with contextlib.suppress(Exception):
            straggler.kill()
