"""The Usage page in a real browser, after gangs of two teams ran on two
members: its totals, its per-period rows, its CSV and its stacked bars equal
what the real ``qmctl usage`` prints for the same grouping, granularity and
time, to the second; a chosen period keeps only its own rows; the figures
follow the ledger live."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.api.conftest import ADMIN_TOKEN
from tests.console.conftest import WAIT_MS, sign_in
from tests.console.gangs import Fleet, fleet_that_ran
from tests.console.test_live import _not_reloaded, _still_same
from tests.workers.members import gang

QMCTL = [sys.executable, "-m", "quartermaster_client.cli"]
GPU = "nvidia.com/gpu"
#: One GPU-second, in GPU-hours: "to the second".
SECOND = 1 / 3600
GROUPS = ("namespace", "cluster_queue", "flavor", "cluster")


@pytest.fixture(scope="module")
def fleet(
    _session_engine: sa.Engine,
    database_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("usage-fleet")
    with fleet_that_ran(_session_engine, database_url, redis_url, where) as ran:
        yield ran


def qmctl_usage(fleet: Fleet, tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    """``qmctl usage ... -o json``, the real CLI in a process of its own."""
    env = {
        "QMCTL_CONFIG": str(tmp_path / "qmctl"),
        "QMCTL_SERVER": fleet.base_url,
        "QMCTL_TOKEN": ADMIN_TOKEN,
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [*QMCTL, "usage", *args, "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def totals(rows: list[dict[str, Any]], group: str, measure: str) -> dict[str, float]:
    summed: dict[str, float] = {}
    for row in rows:
        summed[row[group]] = summed.get(row[group], 0.0) + row[measure]
    return summed


def shown_totals(page: Any, group: str, measure: str) -> dict[str, float]:
    section = page.locator(f'section[data-dimension="{group}"]')
    cells = section.locator(f'table.totals td[data-measure="{measure}"]')
    found = cells.evaluate_all(
        "cells => cells.map(c => [c.closest('tr').dataset.group, c.dataset.value])"
    )
    return {name: float(value) for name, value in found}


@pytest.fixture
def as_of(fleet: Fleet) -> str:
    """A second after the ledger's last entry (every gang has finished)."""
    newest = fleet.admin.get("/v1/ledger/entries", params={"limit": 1000}).json()["items"][-1]
    moment = datetime.fromisoformat(newest["recordedAt"]) + timedelta(seconds=1)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def test_usage_totals_rows_and_csv_equal_qmctl_usage(
    fleet: Fleet, browse: Callable[[], Any], tmp_path: Path, as_of: str
) -> None:
    page = browse()
    sign_in(page, fleet.base_url, ADMIN_TOKEN, start=f"/ui/usage?granularity=hour&asOf={as_of}")
    assert page.title() == "Usage · Quartermaster"
    for group in GROUPS:
        expected = [
            r
            for r in qmctl_usage(
                fleet, tmp_path, "--by", group, "--granularity", "hour", "--as-of", as_of + "Z"
            )
            if r["resource"] == GPU
        ]
        assert expected, group
        for measure in ("held", "ran"):
            want = totals(expected, group, measure)
            got = shown_totals(page, group, measure)
            assert got.keys() == want.keys(), (group, measure)
            for name in want:
                assert abs(got[name] - want[name]) < SECOND / 1000, (group, name, measure)
        # The download: every row as qmctl has it, every number exact.
        link = page.locator(f'section[data-dimension="{group}"] a[download]')
        answer = page.request.get(fleet.base_url + str(link.get_attribute("href")))
        assert answer.status == 200
        rows = list(csv.DictReader(io.StringIO(answer.text())))
        assert [(r["period"], r[group], float(r["held"]), float(r["ran"])) for r in rows] == [
            (datetime.fromisoformat(e["period"]).isoformat(), e[group], e["held"], e["ran"])
            for e in expected
        ]
        # The bars hold the same hours, segment by segment.
        segments = page.locator(f'section[data-dimension="{group}"] svg.chart rect[data-group]')
        drawn = segments.evaluate_all(
            "rs => rs.map(r => [r.closest('g').dataset.period, r.dataset.group, r.dataset.value])"
        )
        assert sorted((p, g, float(v)) for p, g, v in drawn) == sorted(
            (datetime.fromisoformat(e["period"]).isoformat(), e[group], e["held"])
            for e in expected
            if e["held"] > 0
        )
    # Both teams ran, on both members.
    assert shown_totals(page, "namespace", "held").keys() == {"team-a", "team-b"}
    assert shown_totals(page, "cluster", "held").keys() <= {"c1", "c2"}


def test_a_chosen_period_keeps_its_own_rows(
    fleet: Fleet, browse: Callable[[], Any], as_of: str
) -> None:
    page = browse()
    sign_in(page, fleet.base_url, ADMIN_TOKEN, start=f"/ui/usage?asOf={as_of}")
    today = as_of[:10]
    page.get_by_label("Granularity").select_option("day")
    page.get_by_label("From (UTC)").fill("2000-01-01")
    page.get_by_label("Until, inclusive (UTC)").fill("2000-01-31")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(lambda url: "until=2000-01-31" in url)
    section = page.locator('section[data-dimension="namespace"]')
    assert section.locator("p.empty").inner_text() == f"No {GPU} usage in this period."
    page.get_by_label("From (UTC)").fill(today)
    page.get_by_label("Until, inclusive (UTC)").fill(today)
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(lambda url: f"until={today}" in url)
    periods = section.locator("table.periods tr[data-period]").evaluate_all(
        "rows => rows.map(r => r.dataset.period)"
    )
    assert periods and {p[:10] for p in periods} == {today}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("/ui/usage?granularity=week", "granularity"),
        ("/ui/usage?asOf=soon", "asOf"),
        ("/ui/usage?since=2026-02-30", "since"),
        ("/ui/usage?resource=GPU%20please", "resource"),
        ("/ui/usage.csv?by=planet", "by"),
        ("/ui/usage/body?granularity=week", "granularity"),
        ("/ui/usage/body?asOf=soon", "asOf"),
        ("/ui/usage/body?resource=GPU%20please", "resource"),
    ],
)
def test_bad_input_is_an_error_page_naming_the_field(
    fleet: Fleet, browse: Callable[[], Any], query: str, field: str
) -> None:
    page = browse()
    sign_in(page, fleet.base_url, ADMIN_TOKEN, start="/ui/usage")
    answer = page.request.get(fleet.base_url + query)
    assert answer.status == 422, answer.text()
    assert f"<code>{field}</code>" in answer.text()


#: Whether team-b's held total in the Team table has grown past ``was``.
GREW = """(was) => {
  const cell = document.querySelector('section[data-dimension="namespace"] table.totals'
    + ' tr[data-group="team-b"] td[data-measure="held"]');
  return cell !== null && parseFloat(cell.dataset.value) > was;
}"""


def test_the_figures_follow_a_gang_that_runs_without_a_reload(
    fleet: Fleet, browse: Callable[[], Any], as_of: str
) -> None:
    """Last in this module: the gang it submits adds to the usage."""
    day = as_of[:10]
    page = browse()
    sign_in(page, fleet.base_url, ADMIN_TOKEN, start=f"/ui/usage?granularity=hour&since={day}")
    page.locator("#live.on").wait_for()
    held = shown_totals(page, "namespace", "held")["team-b"]
    links = page.locator("section a[download]").evaluate_all("as => as.map(a => a.href)")
    page.locator("#periods-namespace summary").click()
    _not_reloaded(page)

    created = fleet.admin.post("/v1/namespaces/team-b/workloads", json=gang("metered"))
    assert created.status_code == 201, created.text
    page.wait_for_function(GREW, arg=held, timeout=WAIT_MS * 2)
    grown = shown_totals(page, "namespace", "held")["team-b"]
    segments = page.locator(
        'section[data-dimension="namespace"] svg.chart rect[data-group="team-b"]'
    ).evaluate_all("rs => rs.map(r => r.dataset.value)")
    assert abs(sum(float(v) for v in segments) - grown) < SECOND / 1000  # the bars redrawn
    periods = page.locator("table.periods tr[data-period]").evaluate_all(
        "rows => rows.map(r => r.dataset.period)"
    )
    assert periods and all(p[:10] >= day and p[13:] == ":00:00+00:00" for p in periods)
    assert page.locator("#periods-namespace").evaluate("d => d.open")  # kept open
    assert page.get_by_label("Granularity").input_value() == "hour"
    assert page.get_by_label("From (UTC)").input_value() == day
    assert page.locator("section a[download]").evaluate_all("as => as.map(a => a.href)") == links
    _still_same(page)
