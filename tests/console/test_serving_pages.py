"""A serving workload in the console, in a real browser: the Workloads list
counts every admitted replica's GPUs and names their clusters and islands
(shortened past two, all in the title), the workload's page lists its
replicas and says how many are admitted of those asked and why the rest
wait, the Fleet page shows each replica on its island, and the Queues page
counts the replicas' GPUs in their ClusterQueue's usage."""

from __future__ import annotations

from typing import Any

from service.app.admission import AdmissionCycle
from tests.api.conftest import ADMIN_TOKEN, Api
from tests.api.test_serving_units import (
    _cycle,
    _deployment,
    _fleet,
    _local_queue,
    _queue,
    _scale,
    _submit,
)
from tests.console.conftest import sign_in


def rows(page: Any) -> list[str]:
    listed = page.locator("tbody tr[data-workload]")
    return list(listed.evaluate_all("rs => rs.map(r => r.dataset.workload)"))


def test_a_serving_workloads_replicas_in_the_list_its_page_and_the_fleet(
    api: Api, browse: Any
) -> None:
    _fleet(api, islands=3)
    queue = _queue("cq-serve", 24, workloadClass="inference")
    assert api.admin.post("/v1/clusterqueues", json=queue).status_code == 201
    _local_queue(api, "serve", "serve", "cq-serve")
    _submit(api, _deployment("web", 3, gpus=8))
    cycle = AdmissionCycle(api.services.engine, api.services.unit_of_work)
    assert _cycle(api, cycle).writes.admitted == 3
    _scale(api, "web", 4)  # the fourth has no room in 24 GPUs: it waits
    _cycle(api, cycle)
    page = browse()
    sign_in(page, api.base_url, ADMIN_TOKEN, start="/ui/workloads")
    row = page.locator('tbody tr[data-workload="serve/web"]')
    cells = row.locator("td").all_inner_texts()
    # Namespace, Name, Queue, State, Cluster, Island, Priority, GPUs, Age.
    assert cells[4] == "c1"
    assert cells[5] == "c1-i0, c1-i1, +1"
    assert row.locator("td").nth(5).get_attribute("title") == "c1-i0, c1-i1, c1-i2"
    assert cells[7] == "24"
    # Filtered by cluster, a serving workload is found by its replicas' cluster.
    page.goto(api.base_url + "/ui/workloads?namespace=serve&cluster=c1")
    assert rows(page) == ["serve/web"]
    page.goto(api.base_url + "/ui/workloads?namespace=serve&cluster=c2")
    assert rows(page) == []
    page.goto(api.base_url + "/ui/workloads?namespace=serve")
    page.get_by_role("link", name="web").click()
    page.wait_for_url("**/ui/workloads/serve/web")
    assert page.locator("#workload-replicas").inner_text() == "3 of 4 admitted"
    section = page.get_by_role("region", name="Replicas")
    assert "1 waiting: " in section.inner_text()
    table = page.get_by_role("table", name="Admitted replicas")
    replicas = table.locator("tbody tr").evaluate_all(
        "rs => rs.map(r => [...r.cells].slice(0, 3).map(c => c.innerText))"
    )
    assert replicas == [["0", "c1", "c1-i0"], ["1", "c1", "c1-i1"], ["2", "c1", "c1-i2"]]
    page.goto(api.base_url + "/ui/fleet")
    for island in ("c1-i0", "c1-i1", "c1-i2"):
        tile = page.locator(f'li.tile[data-island="{island}"]')
        assert "8/8 GPUs used" in tile.inner_text()
        assert tile.locator('li[data-gang="serve/web"]').inner_text().endswith("8 GPUs")
    page.goto(api.base_url + "/ui/queues")
    queue = page.locator('article[data-cluster-queue="cq-serve"]')
    assert "1 admitted" in queue.locator("p.counts").inner_text()
    used = queue.locator('tr[data-resource="nvidia.com/gpu"] td').nth(4).inner_text()
    assert used == "24"
