"""The console in a real browser against a live stack (API, worker,
scheduler, one stand-in member cluster): pages follow what happens through
the event stream, without a reload."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from service.app.migrate import upgrade
from tests.console.conftest import WAIT_MS, session_cookie, sign_in
from tests.harness import redis_database, redis_server, scratch_database
from tests.waiting import LONG_CEILING, wait_for
from tests.workers.stack import (
    FAST,
    TOKEN,
    Stack,
    base_manifests,
    gang,
    local_queue,
    team_queue,
    write_fleet,
)

TEAMS = {"team-a": "alpha", "team-b": "beta"}
#: Records, in the page, every state a gang's entry on an island tile shows.
SEEN_ON_TILES = """(key) => {
  window.__qmSeen = [];
  const note = () => {
    for (const el of document.querySelectorAll(`li[data-gang="${key}"]`)) {
      const state = el.getAttribute("data-state");
      if (window.__qmSeen[window.__qmSeen.length - 1] !== state) window.__qmSeen.push(state);
    }
  };
  new MutationObserver(note).observe(document.body, {subtree: true, childList: true});
  note();
}"""


@dataclass
class Live:
    stack: Stack
    url: str

    def admin(self) -> httpx.Client:
        return self.stack.client()

    def submit(self, namespace: str, body: dict[str, Any]) -> None:
        with self.admin() as api:
            response = api.post(f"/v1/namespaces/{namespace}/workloads", json=body)
            assert response.status_code == 201, response.text

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        with self.admin() as api:
            found: dict[str, Any] = (
                api.get(f"/v1/namespaces/{namespace}/workloads/{name}").json().get("status") or {}
            )
            return found

    def cancel(self, namespace: str, name: str) -> None:
        with self.admin() as api:
            api.post(f"/v1/namespaces/{namespace}/workloads/{name}/cancel")


@pytest.fixture(scope="module")
def live(postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One member of 2 islands of 2 nodes of 8 GPUs, on a database and a
    Redis db of this module's own; two teams in one cohort: alpha (16 GPUs,
    reclaims what it lends) and beta (16 GPUs, may borrow)."""
    with ExitStack() as stack:
        database = stack.enter_context(scratch_database(postgres_server_url, "console"))
        upgrade(database)
        server = stack.enter_context(redis_server(stack))
        broker = stack.enter_context(redis_database(server))
        workdir = tmp_path_factory.mktemp("console-stack")
        fleet = write_fleet(workdir / "fleet.yaml", {"m1": (2, 2)})
        running = Stack(workdir, database, broker, FAST)
        stack.callback(running.stop)
        manifests = [
            *base_manifests(),
            team_queue("alpha", 16, preemption={"reclaimWithinCohort": "Any"}),
            team_queue("beta", 16),
            *(local_queue(ns, cq) for ns, cq in TEAMS.items()),
        ]
        running.start(fleet, 1, manifests, time_scale=0.01)
        yield Live(running, running.api_url)


def _not_reloaded(*pages: Any) -> None:
    for page in pages:
        page.evaluate("window.__qmMark = 'kept'")


def _still_same(*pages: Any) -> None:
    for page in pages:
        assert page.evaluate("window.__qmMark") == "kept", f"{page.url} was reloaded"


def test_a_gang_appears_runs_on_its_island_and_finishes_without_a_reload(
    live: Live, browse: Any
) -> None:
    listing = browse()
    sign_in(listing, live.url, TOKEN, start="/ui/workloads?namespace=team-a")
    fleet = browse(beside=listing)
    fleet.goto(live.url + "/ui/fleet")
    fleet.locator("#live.on").wait_for()
    listing.locator("#live.on").wait_for()
    fleet.evaluate(SEEN_ON_TILES, "team-a/life")
    _not_reloaded(listing, fleet)

    live.submit("team-a", gang("life", 16, 1500))
    row = listing.locator('tr[data-workload="team-a/life"]')
    row.wait_for()
    detail = browse(beside=listing)
    detail.goto(live.url + "/ui/workloads/team-a/life")
    _not_reloaded(detail)
    on_tile = fleet.locator('li.tile li[data-gang="team-a/life"][data-state="Running"]')
    on_tile.wait_for()
    island = on_tile.locator("xpath=ancestor::li[contains(@class, 'tile')]").get_attribute(
        "data-island"
    )
    admission = live.status("team-a", "life")["admission"]
    assert island and island == admission.get("island", island)
    assert "16/16 GPUs used" in fleet.locator(f'li.tile[data-island="{island}"]').inner_text()
    row.locator(".state", has_text="Running").wait_for()

    row.locator(".state", has_text="Finished").wait_for(timeout=WAIT_MS * 2)
    fleet.locator('li[data-gang="team-a/life"]').wait_for(state="detached")
    timeline = detail.locator("#timeline")
    for kind in ("WorkloadSubmitted", "WorkloadAdmitted", "WorkloadRunning", "WorkloadFinished"):
        timeline.locator(f'li[data-type="{kind}"]').wait_for()
    assert "Admitted to cluster m1" in timeline.inner_text()
    detail.locator("#workload-state", has_text="Finished").wait_for()
    seen = fleet.evaluate("window.__qmSeen")
    assert seen[0] in ("Admitted", "Running") and "Running" in seen, seen
    _still_same(listing, fleet, detail)


def _stream(url: str, cookie: str) -> str:
    """What the console's live stream sends from the log's start until its
    first heartbeat, which it sends only once it has caught up."""
    seen = []
    timeout = httpx.Timeout(LONG_CEILING)
    with httpx.stream(
        "GET", url + "/ui/events?after=0", headers={"cookie": cookie}, timeout=timeout
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith(": heartbeat"):
                break
            seen.append(line)
    return "\n".join(seen)


def test_a_preemption_shows_on_both_timelines_and_to_the_other_team_unnamed(
    live: Live, browse: Any
) -> None:
    try:
        _preemption(live, browse)
    finally:
        for namespace, name in (("team-b", "b-one"), ("team-b", "b-two"), ("team-a", "claim")):
            live.cancel(namespace, name)


def _preemption(live: Live, browse: Any) -> None:
    # beta runs two gangs of 16: its own quota and the 16 alpha lends.
    for name in ("b-one", "b-two"):
        live.submit("team-b", gang(name, 16, 200_000))
    wait_for(
        lambda: all(live.status("team-b", n).get("state") == "Running" for n in ("b-one", "b-two")),
        LONG_CEILING,
        "beta's gangs running",
    )
    admin = browse()
    sign_in(admin, live.url, TOKEN, start="/ui/workloads/team-b/b-one")
    other = browse(beside=admin)
    other.goto(live.url + "/ui/workloads/team-b/b-two")
    for page in (admin, other):
        page.locator("#live.on").wait_for()
    _not_reloaded(admin, other)

    live.submit("team-a", gang("claim", 16, 200_000))  # alpha reclaims what it lent
    victim = wait_for(
        lambda: next(
            (
                n
                for n in ("b-one", "b-two")
                if (live.status("team-b", n).get("eviction") or {}).get("preemptor")
                == "team-a/claim"
            ),
            None,
        ),
        LONG_CEILING,
        "a beta gang preempted by team-a/claim",
    )
    page = admin if victim == "b-one" else other
    preempted = page.locator('#timeline li[data-type="WorkloadPreempted"]')
    preempted.wait_for()
    assert "Preempted by team-a/claim (InCohortReclamation)" in preempted.inner_text()
    _still_same(admin, other)

    preemptor = browse(beside=admin)
    preemptor.goto(live.url + "/ui/workloads/team-a/claim")
    admitted = preemptor.locator('#timeline li[data-type="WorkloadAdmitted"]')
    admitted.wait_for()
    assert f"preempting team-b/{victim}" in admitted.inner_text()

    # team-a's submitter sees its gang's preemption, and nothing of team-b.
    token = _submitter(live, "team-a")
    theirs = browse()
    sign_in(theirs, live.url, token, start="/ui/workloads/team-a/claim")
    mine = theirs.locator('#timeline li[data-type="WorkloadAdmitted"]')
    mine.wait_for()
    assert "preempting a workload of another namespace" in mine.inner_text()
    assert "team-b" not in theirs.content()
    for path in ("/ui/workloads/team-a/claim/detail", "/ui/workloads/rows", "/ui/queues/tree"):
        answer = theirs.request.get(live.url + path)
        assert answer.status == 200, path
        assert "team-b" not in answer.text(), path
    for path in (f"/ui/workloads/team-b/{victim}", "/ui/fleet/grid"):
        assert theirs.request.get(live.url + path).status == 403, path
    stream = _stream(live.url, session_cookie(theirs))
    assert "team-a" in stream and "team-b" not in stream
    assert "team-b" in _stream(live.url, session_cookie(admin))  # the check above can fail


def _submitter(live: Live, namespace: str) -> str:
    with live.admin() as api:
        body = {"name": f"console-{namespace}", "role": "submitter", "namespaces": [namespace]}
        issued = api.post("/v1/tokens", json=body)
        assert issued.status_code == 201, issued.text
        token: str = issued.json()["token"]
        return token
