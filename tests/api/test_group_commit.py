"""Group commit: submissions that wait together commit in one transaction,
and each still gets its own answer."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa

from service.api.group_commit import GroupCommit
from service.app.auth import Principal, Role
from service.app.errors import AlreadyExists, AppError, UnknownReference
from service.app.resources import Actor
from service.app.submissions import BULK_CHUNK, Outcome, Submission, Unstorable
from service.app.workloads import parse_submission
from tests.api.conftest import Api, setup_quota, workload
from tests.api.test_resources import _fields

ADMIN = Actor(Principal("bootstrap", frozenset({Role.ADMIN}), frozenset({"*"})))


def _submission(name: str, namespace: str = "team-a", **spec: object) -> Submission:
    return Submission(ADMIN, namespace, parse_submission(workload(name, **spec)))


def _refused(name: str) -> Submission:
    body = workload(name)
    body["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["image"] = "train:latest"
    return Submission(ADMIN, "team-a", parse_submission(body))


def test_each_submission_of_a_group_gets_its_own_outcome(api: Api, engine: sa.Engine) -> None:
    setup_quota(api.admin)
    setup_quota(api.admin, namespace="team-b")
    taken = api.admin.post("/v1/namespaces/team-a/workloads", json=workload("taken"))
    assert taken.status_code == 201
    group = [
        _submission("a1"),
        _submission("taken"),  # exists already
        _submission("a2"),
        _submission("a1"),  # earlier in the same group
        _submission("a3", queue="missing"),
        _refused("a4"),
        _submission("b1", namespace="team-b"),
    ]
    outcomes = api.services.submissions.submit_parsed(group)
    kinds = [
        type(o).__name__ if isinstance(o, AppError) else o["metadata"]["name"] for o in outcomes
    ]
    assert kinds == [
        "a1",
        "AlreadyExists",
        "a2",
        "AlreadyExists",
        "UnknownReference",
        "PolicyRefused",
        "b1",
    ]
    with engine.connect() as conn:
        # One transaction wrote every accepted workload.
        writers = conn.exec_driver_sql(
            "SELECT count(DISTINCT xmin::text) FROM resources "
            "WHERE kind = 'Workload' AND name IN ('a1', 'a2', 'b1')"
        ).scalar_one()
        submitted = conn.exec_driver_sql(
            "SELECT count(*) FROM ledger_entries WHERE kind = 'workload.submitted'"
        ).scalar_one()
        refusals = conn.exec_driver_sql(
            "SELECT count(*) FROM events WHERE type = 'SubmissionRefused'"
        ).scalar_one()
    assert writers == 1
    assert submitted == 4  # "taken" and the three accepted
    assert refusals == 1


def test_rival_groups_with_the_same_names_create_each_once(api: Api, engine: sa.Engine) -> None:
    """Groups that race for the same names: a group that loses a name at
    commit is retried, so only that name is refused and its own names commit."""
    setup_quota(api.admin)
    shared = [f"s{i}" for i in range(20)]
    start = threading.Barrier(4)

    def race(t: int) -> list[Outcome]:
        names = shared[t:] + shared[:t] + [f"own-{t}-{i}" for i in range(10)]
        start.wait()
        return api.services.submissions.submit_parsed([_submission(n) for n in names])

    with ThreadPoolExecutor(4) as pool:
        results = [o for outcomes in pool.map(race, range(4)) for o in outcomes]
    created = [o["metadata"]["name"] for o in results if not isinstance(o, AppError)]
    refused = [o for o in results if isinstance(o, AppError)]
    assert sorted(created) == sorted(shared + [f"own-{t}-{i}" for t in range(4) for i in range(10)])
    assert len(refused) == 3 * len(shared)
    assert all(isinstance(o, AlreadyExists) for o in refused)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT count(*) FROM resources WHERE kind = 'Workload'")
        assert rows.scalar_one() == len(created)


def test_concurrent_requests_share_a_transaction_and_answer_alone(
    api: Api, engine: sa.Engine
) -> None:
    setup_quota(api.admin)

    def post(name: str) -> int:
        return api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name)).status_code

    names = [f"w{i}" for i in range(40)] + ["dup"] * 8 + [f"q{i}" for i in range(4)]
    with ThreadPoolExecutor(24) as pool:
        statuses = dict(zip(range(len(names)), pool.map(post, names), strict=True))
    assert [statuses[i] for i in range(40)] == [201] * 40
    assert sorted(statuses[i] for i in range(40, 48)) == [201] + [409] * 7
    assert [statuses[i] for i in range(48, 52)] == [201] * 4
    with engine.connect() as conn:
        count = conn.exec_driver_sql(
            "SELECT count(*), count(DISTINCT xmin::text) FROM resources WHERE kind = 'Workload'"
        ).one()
    assert count[0] == 45
    assert count[1] < 45  # some requests rode in one transaction


def test_group_commit_gathers_what_waits_while_it_commits() -> None:
    batches: list[list[str]] = []
    first_entered, release = threading.Event(), threading.Event()

    def commit(group: Sequence[Submission]) -> list[Outcome]:
        names = [s.workload.metadata.name for s in group]
        batches.append(names)
        if len(batches) == 1:
            first_entered.set()
            release.wait(10)
        return [UnknownReference("no") if n == "bad" else {"metadata": {"name": n}} for n in names]

    committer = GroupCommit(commit, max_batch=3)

    async def main() -> list[Outcome]:
        first = asyncio.create_task(committer.submit(_submission("one")))
        await asyncio.to_thread(first_entered.wait, 10)
        rest = [
            asyncio.create_task(committer.submit(_submission(n)))
            for n in ("two", "bad", "four", "five")
        ]
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(first, *rest)

    outcomes = asyncio.run(main())
    assert batches == [["one"], ["two", "bad", "four"], ["five"]]
    assert isinstance(outcomes[2], UnknownReference)
    assert [o["metadata"]["name"] for o in outcomes if not isinstance(o, AppError)] == [
        "one",
        "two",
        "four",
        "five",
    ]


def test_a_failed_commit_fails_only_its_group() -> None:
    calls = 0

    def commit(group: Sequence[Submission]) -> list[Outcome]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database went away")
        return [{"metadata": {"name": s.workload.metadata.name}} for s in group]

    committer = GroupCommit(commit)

    async def main() -> tuple[BaseException | Outcome, Outcome]:
        failed = await asyncio.gather(committer.submit(_submission("x")), return_exceptions=True)
        return failed[0], await committer.submit(_submission("y"))

    failed, later = asyncio.run(main())
    assert isinstance(failed, RuntimeError)
    assert not isinstance(later, AppError) and later["metadata"]["name"] == "y"


def test_a_value_the_database_refuses_fails_only_its_own_submission(
    api: Api, engine: sa.Engine
) -> None:
    setup_quota(api.admin)
    odd = workload("odd")
    # Past validation when not sent over HTTP; jsonb holds no NUL.
    odd["spec"]["podSets"][0]["template"]["spec"]["hostname"] = "a\x00b"
    group = [_submission("fine-1"), Submission(ADMIN, "team-a", parse_submission(odd))]
    outcomes = api.services.submissions.submit_parsed([*group, _submission("fine-2")])
    assert isinstance(outcomes[1], Unstorable) and outcomes[1].status == 422
    assert [o["metadata"]["name"] for o in outcomes if not isinstance(o, AppError)] == [
        "fine-1",
        "fine-2",
    ]
    over_http = api.admin.post(
        "/v1/namespaces/team-a/workloads",
        content=json.dumps(odd),
        headers={"Content-Type": "application/json"},
    )
    assert over_http.status_code == 422, over_http.text
    assert _fields(over_http.json()) == ["spec.podSets[0].template.spec.hostname"]
    with engine.connect() as conn:
        names = conn.exec_driver_sql(
            "SELECT name FROM resources WHERE kind = 'Workload' ORDER BY name"
        ).scalars()
        assert list(names) == ["fine-1", "fine-2"]


def test_a_bulk_larger_than_a_chunk_answers_each_item_in_order(api: Api) -> None:
    setup_quota(api.admin)
    api.admin.post("/v1/namespaces/team-a/workloads", json=workload("exists"))
    size = BULK_CHUNK * 2 + 100
    items = [workload(f"c{i}") for i in range(size)]
    items[5] = workload("exists")
    items[BULK_CHUNK + 7] = workload("lost", queue="missing")
    items[size - 1] = workload("c3")  # a name twice: both refused
    results = api.services.submissions.bulk(ADMIN, "team-a", items)
    assert [r.index for r in results] == list(range(size))
    failed = {r.index: r.status for r in results if r.status != 201}
    assert failed == {3: 422, 5: 409, BULK_CHUNK + 7: 422, size - 1: 422}
    assert [r.name for r in results][BULK_CHUNK : BULK_CHUNK + 2] == [
        f"c{BULK_CHUNK}",
        f"c{BULK_CHUNK + 1}",
    ]
    with api.services.engine.connect() as conn:
        stored = conn.exec_driver_sql(
            "SELECT count(*) FROM resources WHERE kind = 'Workload' AND name LIKE 'c%%'"
        ).scalar_one()
    assert stored == size - 4


def test_a_second_unit_of_work_only_when_enough_wait() -> None:
    inside, peak = 0, 0
    lock = threading.Lock()
    one_in, both_in, release = threading.Event(), threading.Event(), threading.Event()

    def commit(group: Sequence[Submission]) -> list[Outcome]:
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
            one_in.set()
            if inside == 2:
                both_in.set()
        release.wait(10)
        with lock:
            inside -= 1
        return [{"metadata": {"name": s.workload.metadata.name}} for s in group]

    committer = GroupCommit(commit, committers=2, spill=3)

    async def main() -> list[Outcome]:
        first = asyncio.create_task(committer.submit(_submission("n0")))
        await asyncio.to_thread(one_in.wait, 10)
        tasks = [asyncio.create_task(committer.submit(_submission(f"n{i}"))) for i in range(1, 3)]
        await asyncio.sleep(0.05)
        assert peak == 1  # two waiting: fewer than ``spill``
        tasks += [asyncio.create_task(committer.submit(_submission(f"n{i}"))) for i in range(3, 6)]
        await asyncio.to_thread(both_in.wait, 10)
        later = [asyncio.create_task(committer.submit(_submission(f"n{i}"))) for i in range(6, 9)]
        await asyncio.sleep(0.05)  # a third unit of work would have started by now
        release.set()
        return await asyncio.gather(first, *tasks, *later)

    outcomes = asyncio.run(main())
    assert peak == 2
    assert [o["metadata"]["name"] for o in outcomes if not isinstance(o, AppError)] == [
        f"n{i}" for i in range(9)
    ]


def test_the_submitted_entry_is_what_the_ledger_schema_writes() -> None:
    from datetime import UTC, datetime
    from uuid import uuid4

    from service.app.submissions import Target, submitted_entry
    from service.ledger import entries as ledger

    submission = _submission("w", priorityClassName="high", workloadClass="inference")
    requests = {"cpu": 8000, "nvidia.com/gpu": 8}
    target = Target("cq-1", 7, requests)
    now = datetime.now(UTC)
    entry = submitted_entry(submission, target, uuid4(), now)
    expected = ledger.new_entry(
        ledger.WorkloadSubmitted(
            namespace="team-a",
            workload="w",
            local_queue=submission.workload.spec.queueName,
            cluster_queue="cq-1",
            actor=ADMIN.principal.name,
            workload_class="inference",
            priority=7,
            requests=requests,
        ),
        entry.entry_id,
        now,
    )
    assert entry == expected
    assert json.dumps(entry.body) == json.dumps(expected.body)  # the same keys, in order
    assert ledger.parse_body(entry.kind, entry.body).model_dump(mode="json") == entry.body


def test_new_uuids_are_version_4_and_distinct() -> None:
    from uuid import UUID

    from service.app.submissions import new_uuids

    ids = list(new_uuids(1000))
    assert len(set(ids)) == 1000
    assert all(i.version == 4 and i.variant == UUID(int=0, version=4).variant for i in ids)
