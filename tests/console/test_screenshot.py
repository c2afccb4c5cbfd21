"""The README tour's screenshot of the console: the Fleet page of two
stand-in members with gangs running on their islands, as the test suite's
browser shows it.

``QM_UPDATE_SCREENSHOTS=1`` writes ``docs/images/console-fleet.png``;
otherwise the committed image is compared loosely with a fresh one: both
PNG, of the same size (Pillow is no dependency of ours, so pixels are not
compared; the page's content is checked in the page itself)."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.api.conftest import ADMIN_TOKEN
from tests.console.conftest import sign_in
from tests.console.gangs import Fleet, fleet_that_ran

ROOT = Path(__file__).resolve().parents[2]
SHOT = ROOT / "docs" / "images" / "console-fleet.png"
VIEWPORT = {"width": 1280, "height": 800}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def fleet(
    _session_engine: sa.Engine,
    database_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("screenshot-fleet")
    with fleet_that_ran(
        _session_engine,
        database_url,
        redis_url,
        where,
        running=("llm-pretrain", "eval-sweep"),
        gangs=(("team-b", "tokenize", "60s"),),
    ) as ran:
        yield ran


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (PNG spec, section 11.2.2)."""
    assert data[:8] == PNG and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_fleet_page_screenshot_for_the_readme(fleet: Fleet, browse: Callable[[], Any]) -> None:
    page = browse()
    page.set_viewport_size(VIEWPORT)
    sign_in(page, fleet.base_url, ADMIN_TOKEN, start="/ui/fleet")
    running = page.locator('li[data-gang][data-state="Running"]')
    running.nth(1).wait_for()
    assert running.count() == 2
    page.locator("#live.on").wait_for()
    shot = page.screenshot(full_page=False, animations="disabled")
    assert png_size(shot) == (VIEWPORT["width"], VIEWPORT["height"])
    if os.environ.get("QM_UPDATE_SCREENSHOTS") == "1":
        SHOT.parent.mkdir(parents=True, exist_ok=True)
        SHOT.write_bytes(shot)
        return
    assert SHOT.exists(), f"no {SHOT}: run this test with QM_UPDATE_SCREENSHOTS=1"
    assert png_size(SHOT.read_bytes()) == png_size(shot)
