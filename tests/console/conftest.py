"""The console's fixtures: one headless Chromium per test process while it
runs the console's tests (Debian's ``chromium`` through Playwright, never a
browser Playwright downloads), pages that fail their test on any JavaScript
error or failed request."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import api, api_server  # noqa: F401 (fixtures reused here)

CHROMIUM = os.environ.get("QM_TEST_CHROMIUM", "/usr/bin/chromium")
#: Generous: a busy CI machine is several times slower than a quiet one.
WAIT_MS = 90_000


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Package-scoped, not per session: Playwright's sync API runs an event
    loop in this thread while it lives, and a later test elsewhere that calls
    ``asyncio.run`` in the same process would fail."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: .ci/run installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            # Root in CI: Chromium's sandbox needs user namespaces it may not have.
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        yield launched
        launched.close()


@dataclass
class Watched:
    """Everything a page said went wrong: console errors, uncaught
    exceptions, requests that failed."""

    problems: list[str] = field(default_factory=list)
    #: Requests the browser itself ends when a page is left: a live stream
    #: open at navigation is aborted, which is no failure of the page.
    left_streams: list[str] = field(default_factory=list)
    #: Set while a test cuts the connection on purpose: the live stream's
    #: failures to reconnect are then what is tested, not a fault.
    streams_may_fail: bool = False

    def attach(self, page: Any) -> None:
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("requestfailed", self._failed)

    def _console(self, message: Any) -> None:
        where = str((message.location or {}).get("url", ""))
        if self.streams_may_fail and "/ui/events" in message.text + where:
            self.left_streams.append(message.text)
            return
        if message.type == "error":
            self.problems.append(f"console error: {message.text} ({message.location})")

    def _failed(self, request: Any) -> None:
        failure = request.failure or ""
        if "/ui/events" in request.url and ("ERR_ABORTED" in failure or self.streams_may_fail):
            self.left_streams.append(request.url)
            return
        if "/ui/static/favicon.svg" in request.url and "ERR_ABORTED" in failure:
            return  # the browser's own fetch of the tab's icon, cut short by leaving the page
        self.problems.append(f"request failed: {request.method} {request.url}: {failure}")


class Browse:
    """``browse()`` opens a page in a context of its own, ``browse(beside=p)``
    a second tab of ``p``'s session; ``watched`` collects what went wrong."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.watched = Watched()
        self.contexts: list[Any] = []

    def __call__(self, beside: Any = None) -> Any:
        if beside is not None:
            context = beside.context
        else:
            context = self.browser.new_context()
            context.set_default_timeout(WAIT_MS)
            self.contexts.append(context)
        page = context.new_page()
        self.watched.attach(page)
        return page


@pytest.fixture
def browse(browser: Any) -> Iterator[Browse]:
    """Pages for a test, which fails if any of them logged an error or lost a request."""
    opened = Browse(browser)
    yield opened
    for context in opened.contexts:
        context.close()
    assert opened.watched.problems == [], "\n".join(opened.watched.problems)


def sign_in(page: Any, base_url: str, token: str, start: str = "/ui/") -> None:
    """Sign in through the form, as a person does, starting at ``start``."""
    page.goto(base_url + start)
    page.wait_for_url(re.compile(r".*/ui/signin.*"))
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/ui/signin" not in url)


def session_cookie(page: Any) -> str:
    """The ``Cookie`` header of ``page``'s console session, for a plain HTTP
    client (which would not send a Secure cookie over http by itself)."""
    cookies = page.context.cookies()
    return "; ".join(f"{c['name']}={c['value']}" for c in cookies if c["name"] == "qm_console")
