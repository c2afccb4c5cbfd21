"""A repeatable fault run (issue 18, "Must show"): the whole stack as
processes, under a steady load of submissions, through one fault after
another, then checked from the ledger and from what the members ran.

Used by ``bench/chaos.py`` (the full run, figures committed) and by
``tests/workers/test_chaos_run.py`` (sized down). What runs:

* a private Postgres (``pg_ctl``, commits durable as the service asks) and
  a private ``redis-server`` (no persistence), on free ports;
* two API processes, a Celery worker, two schedulers (a leader and one
  standing by), three stand-in members ``m1`` to ``m3``, each a process of its
  own with a fence agent (``quartermaster fence-agent``) beside it; the
  centre reaches each member through a TCP relay that the run may cut
  (tests/workers/tcp_cut.py), while the member's agent still reaches it;
* a client that submits gangs at a steady rate, each with its
  ``Idempotency-Key``, to either API process (the other when one refuses
  connections), and retries what it was not told the outcome of with the
  same key until it is.

The faults, in order, each under that load: a Celery worker SIGKILLed (a
new one started), the admission leader SIGKILLed (the standby takes over; a
new standby started), an API process SIGKILLed (the other serves; it is
started again on its port), Redis killed and started empty, Postgres
crashed (``pg_ctl stop -m immediate``) and started; the centre's link to
the member running the most long gangs that began lately cut (its agent
runs on: it must stop them) until the centre has requeued its gangs and
they run elsewhere, then healed; the member running the most gangs
SIGKILLed with its agent, for good, until its gangs run elsewhere
(admission packs gangs, so the busiest member is the one whose loss moves
the most; a fault waits until its member runs what it is aimed at). Then
the load stops, every in-doubt submission is settled, and every
acknowledged gang is waited for until it has finished.

The checks (:func:`check`), from the ledger, the read model and the
members' kubelets' record of every pod's running intervals
(``/_admin/intervals``; the killed member's read just before it is killed,
the pods still running then ended at the kill):

* lost = ∅: every acknowledged submission has its ``workload.submitted``
  entry and has finished (or runs, where the members say it does);
* unexpected = ∅: every gang in the ledger, on a member or in the read
  model is one a client submitted (acknowledged or in doubt), submitted
  once; a gang ran on a member under no more admissions than the ledger
  admitted it there;
* no gang admitted twice without a release (finish, eviction, preemption,
  requeue) between, and no admission closed twice (``double_closes``);
* no gang's pods running in two clusters at one instant (nor under two
  admissions in one);
* besides: the ledger verifies, matches the events, its open usage equals
  what the members run (``audit``), and the live members are left holding
  no job of ours.
"""

from tests.workers.chaos.checks import (
    CheckResult,
    Evidence,
    PodRun,
    check,
    check_admitted_twice,
    check_lost,
    check_members_match,
    check_two_places,
    check_unexpected,
    table,
)
from tests.workers.chaos.config import FAULTS, MEMBERS, SETTINGS, Size
from tests.workers.chaos.runner import Run, Runner

__all__ = [
    "FAULTS",
    "MEMBERS",
    "SETTINGS",
    "CheckResult",
    "Evidence",
    "PodRun",
    "Run",
    "Runner",
    "Size",
    "check",
    "check_admitted_twice",
    "check_lost",
    "check_members_match",
    "check_two_places",
    "check_unexpected",
    "table",
]
