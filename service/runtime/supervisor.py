"""Child processes of standalone mode: started, restarted when they die, stopped.

Each child runs in a session, and so a process group, of its own: Ctrl-C at
the terminal reaches only us, and we stop the children in order — every group
gets its stop signal, and whatever is left of a group after the grace period
gets SIGKILL (a Celery worker's pool processes are in its group). On Linux a
child also gets SIGTERM should we die without stopping it
(``PR_SET_PDEATHSIG``). Each child writes to a log file of its own, appended
to across restarts.

Once :meth:`Supervisor.supervise` is called, a part whose process dies is
started again after a backoff (:class:`RestartPolicy`), once the parts it
needs are up; a part in a crash loop is given up on. A server we did not
start is only watched (:meth:`Supervisor.watch`): its outage and recovery are
reported. Every event is one line in ``supervisor.log`` and goes to the
``report`` callback (the console).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import psutil

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when we die."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # we died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class Child:
    """One run of a part's process."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    #: Where this run's output starts in the (appended) log file.
    log_offset: int
    began: float = field(default_factory=time.monotonic)
    #: The group members seen last, so that stragglers are found after the leader exits.
    members: set[psutil.Process] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        """What this run of the child has written so far."""
        with self.log.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode("utf-8", "replace")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def snapshot(self) -> None:
        """Remember the group's members (the leader and its descendants)."""
        try:
            leader = psutil.Process(self.pid)
            self.members |= {leader, *leader.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def stragglers(self) -> list[psutil.Process]:
        return [m for m in self.members if _running(m)]


def _running(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def exit_status(code: int | None) -> str:
    """``exit 1`` or ``signal SIGKILL``, from a Popen return code."""
    if code is None:
        return "running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit {code}"


@dataclass(frozen=True)
class RestartPolicy:
    """When a part that died is started again, and when it is given up on.

    The n-th restart in a row waits ``first_delay`` * 2**(n-1), at most
    ``max_delay`` (1, 2, 4, 8, 16, 30, 30 … s); a run that lasts
    ``reset_after`` starts the count over. A death within ``quick`` of its
    start is a quick one; after ``crash_loop`` quick deaths in a row the
    part is not started again. A death while a part it needs is down is not
    counted as quick: it waits for that part instead.
    """

    first_delay: float = 1.0
    max_delay: float = 30.0
    reset_after: float = 600.0
    quick: float = 60.0
    crash_loop: int = 5

    def delay(self, restarts: int) -> float:
        return float(min(self.first_delay * 2 ** max(restarts - 1, 0), self.max_delay))


def _always_ready(child: Child) -> str | None:
    return ""


@dataclass(frozen=True)
class Program:
    """A part as the supervisor runs it."""

    name: str
    #: The command, or a function that makes it afresh for every start.
    argv: Sequence[str] | Callable[[], Sequence[str]]
    env: Mapping[str, str] | None = None
    #: The part's ready line for this run, or None while it is not ready.
    ready: Callable[[Child], str | None] = _always_ready
    #: Parts (or watched servers) that must be up before it is restarted.
    needs: tuple[str, ...] = ()
    stop_signal: signal.Signals = signal.SIGTERM
    #: The system user to run as.
    user: str | None = None


class State(enum.Enum):
    STARTING = "starting"
    UP = "up"
    WAITING = "waiting to restart"
    GIVEN_UP = "given up"


@dataclass(frozen=True)
class Event:
    """Something that happened to a part, said in one line."""

    part: str
    kind: str  # died, restarting, back, given-up, down, recovered
    line: str
    #: Lines shown below it (the end of a log).
    detail: str = ""

    @property
    def good(self) -> bool:
        return self.kind in ("back", "recovered", "restarting")


@dataclass
class Part:
    """A part the supervisor started, with its current run."""

    program: Program
    child: Child
    state: State = State.STARTING
    #: Restarts in a row (reset by a run of ``reset_after``), for the backoff.
    restarts: int = 0
    #: Quick deaths in a row, for the crash-loop limit.
    quick_deaths: int = 0
    due: float = 0.0
    died_at: float = 0.0
    #: Whether it died since it was last up (so that coming up is "back").
    down: bool = False

    @property
    def name(self) -> str:
        return self.program.name

    def check(self) -> str | None:
        """This run's ready line once it is ready (and remembers that it is)."""
        detail = self.program.ready(self.child)
        if detail is not None:
            self.state = State.UP
        return detail


@dataclass
class Watch:
    """A server we did not start: probed, never restarted."""

    name: str
    #: None while it answers, else why not.
    probe: Callable[[], str | None]
    every: float = 2.0
    up: bool = True
    since: float = 0.0
    next_probe: float = 0.0


class Supervisor:
    """Starts children, restarts the ones that die, and stops them all,
    politely first."""

    def __init__(
        self,
        logs: Path,
        env: Mapping[str, str],
        policy: RestartPolicy | None = None,
        report: Callable[[Event], None] = lambda event: None,
    ) -> None:
        self.logs = logs
        self.env = dict(env)
        self.policy = policy or RestartPolicy()
        self.report = report
        self.parts: list[Part] = []
        self.watches: list[Watch] = []
        self.supervising = False
        self._preexec = _die_with_parent()

    @property
    def children(self) -> list[Child]:
        return [p.child for p in self.parts]

    # -- starting ----------------------------------------------------------------------

    def add(self, program: Program) -> Part:
        """Start ``program`` and keep it running from :meth:`supervise` on."""
        part = Part(program, self._spawn(program))
        self.parts.append(part)
        return part

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        return self.add(Program(name, argv, env)).child

    def watch(self, name: str, probe: Callable[[], str | None]) -> Watch:
        watch = Watch(name, probe)
        self.watches.append(watch)
        return watch

    def supervise(self) -> None:
        """Restart parts that die from now on (before, a death is the caller's
        to report: a part that cannot start at all is not retried)."""
        self.supervising = True

    def _spawn(self, program: Program) -> Child:
        self.logs.mkdir(parents=True, exist_ok=True)
        argv = list(program.argv() if callable(program.argv) else program.argv)
        log = self.logs / f"{program.name}.log"
        with log.open("ab") as out:
            out.write(f"--- {_now()} {' '.join(argv)}\n".encode())
            offset = out.tell()
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **(program.env or {})},
                start_new_session=True,
                user=program.user,
                preexec_fn=self._preexec,  # noqa: PLW1509 - only prctl, before exec
            )
        return Child(program.name, process, log, offset)

    def dead(self) -> Child | None:
        """The first child that has exited and is not (yet) being restarted."""
        running = (State.STARTING, State.UP)
        return next((p.child for p in self.parts if p.state in running and not p.child.alive), None)

    def up(self, name: str) -> bool:
        """Whether the part or watched server ``name`` is up (unknown names are)."""
        for part in self.parts:
            if part.name == name:
                return part.state is State.UP
        return all(w.up for w in self.watches if w.name == name)

    # -- supervising -------------------------------------------------------------------

    def poll(self) -> list[Event]:
        """Look at every part and watched server once: reap, restart, report."""
        now = time.monotonic()
        events: list[Event] = []
        for watch in self.watches:
            events += self._probe(watch, now)
        if self.supervising:
            for part in self.parts:  # deaths first, so that a dependent sees them
                if part.state in (State.STARTING, State.UP) and not part.child.alive:
                    events.append(self._died(part, now))
            for part in self.parts:
                events += self._advance(part, now)
        for event in events:
            self._record(event)
        return events

    def _died(self, part: Part, now: float) -> Event:
        child, policy = part.child, self.policy
        self._kill_group(child)
        ran = now - child.began
        status = exit_status(child.process.returncode)
        waiting = [n for n in part.program.needs if not self.up(n)]
        if ran >= policy.reset_after:
            part.restarts = 0
        if ran >= policy.quick:
            part.quick_deaths = 0
        elif not waiting:
            part.quick_deaths += 1
        part.died_at, part.down = now, True
        tail = child.tail(10)
        _append(child.log, f"--- {_now()} exited ({status}) after {ran:.1f} s\n")
        said = f"{part.name} died ({status}) after {_seconds(ran)}"
        if part.quick_deaths >= policy.crash_loop:
            part.state = State.GIVEN_UP
            return Event(
                part.name,
                "given-up",
                f"{said}; given up: it died {part.quick_deaths} times in a row within "
                f"{_seconds(policy.quick)} of starting; the rest keeps running. "
                f"Its log ({child.log}) ends:",
                tail,
            )
        part.restarts += 1
        part.state, part.due = State.WAITING, now + policy.delay(part.restarts)
        when = f"restarting in {_seconds(part.due - now)}"
        if waiting:
            when += f", once {', '.join(waiting)} {'is' if len(waiting) == 1 else 'are'} up"
        return Event(part.name, "died", f"{said}; {when} (log: {child.log})")

    def _advance(self, part: Part, now: float) -> list[Event]:
        if part.state is State.WAITING:
            if now < part.due or not all(self.up(n) for n in part.program.needs):
                return []
            part.child, part.state = self._spawn(part.program), State.STARTING
            return [
                Event(
                    part.name,
                    "restarting",
                    f"{part.name} restarting (restart {part.restarts}, pid {part.child.pid})",
                )
            ]
        if part.state is State.STARTING and part.child.alive:
            detail = part.check()
            if detail is not None and part.down:
                part.down = False
                took = _seconds(now - part.died_at)
                return [
                    Event(
                        part.name, "back", f"{part.name} back after {took}: {detail}".rstrip(": ")
                    )
                ]
        return []

    def _probe(self, watch: Watch, now: float) -> list[Event]:
        if now < watch.next_probe:
            return []
        watch.next_probe = now + watch.every
        why = watch.probe()
        if watch.up and why is not None:
            watch.up, watch.since = False, now
            return [
                Event(watch.name, "down", f"{watch.name} unreachable: {why} (not ours to restart)")
            ]
        if not watch.up and why is None:
            watch.up = True
            return [
                Event(
                    watch.name,
                    "recovered",
                    f"{watch.name} reachable again after {_seconds(now - watch.since)}",
                )
            ]
        return []

    def _record(self, event: Event) -> None:
        text = f"{_now()} {event.line}\n"
        if event.detail:
            text += "".join(f"    {line}\n" for line in event.detail.splitlines())
        _append(self.logs / "supervisor.log", text)
        self.report(event)

    def _kill_group(self, child: Child) -> None:
        """What is left of a dead leader's group (a Celery worker's pool, a
        Postgres server's backends) goes with it: a new run must not share
        the port, the data or the shared memory with them."""
        self._signal(child, signal.SIGKILL)
        for member in child.stragglers():
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(list(child.members), timeout=5)

    # -- stopping ----------------------------------------------------------------------

    def stop(
        self,
        grace: float = 10.0,
        hurry: Callable[[], bool] = lambda: False,
        only: Collection[str] | None = None,
    ) -> list[str]:
        """Send every group (of the parts named ``only``, default all) its stop
        signal, wait up to ``grace`` seconds (or until ``hurry()``), SIGKILL
        what is left; forget those parts; return the names of the children
        that had to be killed."""
        parts = [p for p in self.parts if only is None or p.name in only]
        children = [p.child for p in parts]
        for part in parts:
            part.child.snapshot()
            self._signal(part.child, part.program.stop_signal)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not hurry() and self._remaining(children):
            time.sleep(0.05)
        killed = []
        for child in self._remaining(children):
            killed.append(child.name)
            self._signal(child, signal.SIGKILL)
            for member in child.members:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(5)
            psutil.wait_procs(list(child.members), timeout=5)
        self.parts = [p for p in self.parts if p not in parts]
        return killed

    @staticmethod
    def _remaining(children: list[Child]) -> list[Child]:
        for child in children:
            if child.alive:
                child.snapshot()
        return [c for c in children if c.alive or c.stragglers()]

    @staticmethod
    def _signal(child: Child, signum: int) -> None:
        # The group outlives its leader while members remain (and its id is
        # not reused meanwhile); pgid == pid because every child leads a
        # session of its own.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(text)
