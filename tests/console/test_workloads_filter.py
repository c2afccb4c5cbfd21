"""The Workloads page's filter form, as a person submits it: its empty
fields are no filter, and a state chosen from its list filters by it."""

from __future__ import annotations

import re
from typing import Any

from tests.api.conftest import ADMIN_TOKEN, Api, setup_quota, workload
from tests.console.conftest import sign_in


def test_the_filter_form_with_empty_fields_and_a_chosen_state(api: Api, browse: Any) -> None:
    setup_quota(api.admin)
    for name in ("kept", "gone"):
        created = api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name))
        assert created.status_code == 201, created.text
    cancelled = api.admin.post("/v1/namespaces/team-a/workloads/gone/cancel")
    assert cancelled.status_code in (200, 202), cancelled.text
    page = browse()
    sign_in(page, api.base_url, ADMIN_TOKEN, start="/ui/workloads")
    rows = page.locator("tbody tr[data-workload]")
    page.get_by_role("button", name="Filter").click()  # every field empty
    page.wait_for_url(re.compile(r".*/ui/workloads\?namespace=&queue=.*"))
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.workload)")) == [
        "team-a/gone",
        "team-a/kept",
    ]
    page.get_by_label("State").select_option("Cancelled")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*state=Cancelled.*"))
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.workload)") == ["team-a/gone"]
