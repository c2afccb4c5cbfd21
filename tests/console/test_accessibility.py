"""Every console page, in a real browser, against a fleet that has run gangs
and has one running and one waiting: axe-core (vendored under
``tests/console/vendor/``) finds no serious or critical violation, every page
has its own title, and Tab walks the page in reading order from the skip
link, reaching every control once.

axe is evaluated into the page rather than added as a ``<script>`` tag: the
console's CSP forbids inline scripts, and bypassing it would stop these
tests from seeing a page break its own policy."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.api.conftest import ADMIN_TOKEN
from tests.console.conftest import WAIT_MS, Watched, sign_in
from tests.console.gangs import Fleet, fleet_that_ran
from tests.workers.members import gang

AXE = Path(__file__).parent / "vendor" / "axe.min.js"
BLOCKING = ("serious", "critical")


@pytest.fixture(scope="module")
def fleet(
    _session_engine: sa.Engine,
    database_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("a11y-fleet")
    with fleet_that_ran(_session_engine, database_url, redis_url, where, running=("serve",)) as ran:
        # Larger than the ClusterQueue's quota: it waits, and says why.
        too_big = gang("waiting", count=6)
        created = ran.admin.post("/v1/namespaces/team-a/workloads", json=too_big)
        assert created.status_code == 201, created.text
        yield ran


def pages(fleet: Fleet) -> list[str]:
    return [
        "/ui/fleet",
        "/ui/queues",
        "/ui/workloads",
        "/ui/workloads/team-a/pretrain",
        "/ui/workloads/team-a/serve",
        "/ui/workloads/team-a/waiting",
        "/ui/ledger",
        "/ui/ledger/entries/1",
        f"/ui/ledger/entries/{fleet.size}",
        "/ui/ledger/checkpoints",
        "/ui/usage",
        "/ui/usage?granularity=hour",
    ]


def axe(page: Any) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is now."""
    page.evaluate(AXE.read_text() + "\n;0")
    found: list[dict[str, Any]] = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
            .map(v => ({id: v.id, impact: v.impact, help: v.help,
                        nodes: v.nodes.slice(0, 5).map(n => n.target.join(" "))}))"""
    )
    return found


def settled(page: Any) -> None:
    """Wait for what the page's scripts still do: the ledger's check in the browser."""
    if page.locator("#verdict").count():
        page.locator('#verdict:not([data-result="pending"])').wait_for()
    if page.locator("td.signature").count():
        page.locator('td.signature[data-result="pending"]').first.wait_for(state="detached")


TABBABLE = """() => {
  const all = document.querySelectorAll(
    'a[href], button:not([disabled]), input:not([type="hidden"]):not([disabled]),' +
    ' select:not([disabled]), textarea:not([disabled]), summary, [tabindex]');
  const shown = [...all].filter(e => e.tabIndex >= 0 && e.checkVisibility());
  shown.forEach((e, i) => { e.dataset.qmTab = String(i); });
  return shown.map(e => (e.getAttribute('aria-label') || e.textContent || e.name || e.id)
    .trim().slice(0, 40));
}"""


def tab_order(page: Any, count: int) -> list[int]:
    """The tabbables Tab reaches, in order, by their place in the document (a
    date input's fields are one stop: Tab moves through them in turn)."""
    reached: list[int] = []
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); }")
    for _ in range(8 * count):
        page.keyboard.press("Tab")
        at = page.evaluate("() => document.activeElement.dataset.qmTab ?? null")
        here = -1 if at is None else int(at)
        if reached and here == reached[-1]:
            continue
        if here in (-1, 0) and reached:
            break  # past the last one: the browser's own controls, or the top again
        reached.append(here)
    return reached


STILL = """async () => {
  for (const el of document.querySelectorAll('[sse-connect]')) {
    const source = (el['htmx-internal-data'] || {}).sseEventSource;
    if (source) { source.close(); }
  }
  const pause = () => new Promise(done => setTimeout(done, 100));
  for (let quiet = 0; quiet < 2; ) {
    await pause();
    quiet = document.querySelector('.htmx-request') ? 0 : quiet + 1;
  }
}"""


def visit(page: Any, url: str) -> None:
    """Leave the page as a person would, but only once its live stream is
    closed and no fragment is on its way (one cut short by the navigation
    would count as a failed request), then open ``url``."""
    page.evaluate(STILL)
    page.goto(url)
    settled(page)


def test_every_page_has_a_title_and_no_serious_violation(
    fleet: Fleet, browse: Callable[[], Any]
) -> None:
    page = browse()
    sign_in(page, fleet.base_url, ADMIN_TOKEN, start="/ui/ledger")
    nav = page.locator("header nav a").evaluate_all("links => links.map(a => a.pathname)")
    assert set(nav) <= {p.split("?")[0] for p in pages(fleet)}, "a page this test does not open"
    titles: dict[str, str] = {}
    problems = {}
    for path in pages(fleet):
        visit(page, fleet.base_url + path)
        titles[path] = page.title()
        blocking = [v for v in axe(page) if v["impact"] in BLOCKING]
        if blocking:
            problems[path] = blocking
    assert problems == {}, problems
    assert all(re.fullmatch(r".+ · Quartermaster", t) for t in titles.values()), titles
    assert len(set(titles.values())) >= len(titles) - 1  # the two usage views share one


def test_the_sign_in_and_error_pages_have_no_serious_violation(
    fleet: Fleet, browser: Any, browse: Callable[[], Any]
) -> None:
    page = browse()
    page.goto(fleet.base_url + "/ui/ledger")
    page.wait_for_url(re.compile(r".*/ui/signin.*"))
    assert page.title() == "Sign in · Quartermaster"
    assert [v for v in axe(page) if v["impact"] in BLOCKING] == []
    # An error page answers 404, which a watched page counts as a failed request.
    context = browser.new_context()
    context.set_default_timeout(WAIT_MS)
    try:
        missing = context.new_page()
        watched = Watched()
        watched.attach(missing)
        sign_in(missing, fleet.base_url, ADMIN_TOKEN, start="/ui/ledger")
        answer = missing.goto(fleet.base_url + "/ui/ledger/entries/999999")
        assert answer is not None and answer.status == 404
        assert missing.title() == "Not found · Quartermaster"
        assert [v for v in axe(missing) if v["impact"] in BLOCKING] == []
        assert [p for p in watched.problems if "404" not in p] == []
    finally:
        context.close()


def test_tab_walks_every_page_in_reading_order_from_the_skip_link(
    fleet: Fleet, browse: Callable[[], Any]
) -> None:
    page = browse()
    sign_in(page, fleet.base_url, ADMIN_TOKEN, start="/ui/ledger")
    for path in pages(fleet):
        visit(page, fleet.base_url + path)
        page.evaluate(STILL)  # no live refresh while Tab walks it
        names = page.evaluate(TABBABLE)
        assert names[0] == "Skip to content", path
        reached = tab_order(page, len(names))
        assert reached == list(range(len(names))), (path, reached, names)
    # The skip link takes the keyboard past the navigation, into the page.
    visit(page, fleet.base_url + "/ui/ledger/checkpoints")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    inside = page.evaluate("() => document.activeElement.closest('main') !== null")
    assert inside
