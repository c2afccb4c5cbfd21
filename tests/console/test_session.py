"""The console's door, over HTTP against a served API (no member clusters):
sign-in, the session cookie, CSRF refusal, sign-out, revocation, role
scoping of pages, fragments and the event stream; and one real browser
signing in and out."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from service.api.deps import current_principal
from service.console import PREFIX, PUBLIC
from service.console.gate import ConsoleGate
from tests.api.conftest import ADMIN_TOKEN, Api, setup_quota, workload
from tests.api.tcp_proxy import TcpProxy
from tests.console.conftest import Browse, sign_in
from tests.console.http import Browser
from tests.waiting import wait_for


def _depends_on(dependant: Any, target: Any) -> bool:
    return any(d.call is target or _depends_on(d, target) for d in dependant.dependencies)


@pytest.fixture
def http(api: Api) -> Browser:
    return Browser(api.base_url)


def test_every_console_route_but_sign_in_is_authorized_by_the_api_dependency(api: Api) -> None:
    from service.api.app import create_app

    app = create_app(api.services)
    mounted = next(r for r in app.routes if getattr(r, "path", None) == PREFIX)
    contexts = iter_route_contexts(mounted.app.routes)  # type: ignore[attr-defined]
    routes = [c.original_route for c in contexts if isinstance(c.original_route, APIRoute)]
    assert len(routes) >= 10
    unguarded = sorted(
        f"{sorted(r.methods or ())} {r.path}"
        for r in routes
        if not _depends_on(r.dependant, current_principal)
    )
    # GET /signin shows the form; POST /signin depends on it (the form's token).
    assert unguarded == ["['GET'] /signin"]
    assert {"/signin"} == PUBLIC
    # The gate wraps everything else, the API's own middleware included.
    outermost: Any = app.user_middleware[0].cls
    assert outermost is ConsoleGate


def test_sign_in_seals_the_token_in_a_strict_http_only_secure_cookie(
    api: Api, http: Browser
) -> None:
    assert http.get("/ui/workloads").status_code == 303
    answer = http.sign_in(ADMIN_TOKEN)
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/ui/workloads"
    session = next(h for h in answer.headers.get_list("set-cookie") if h.startswith("qm_console="))
    flags = {part.strip() for part in session.split(";")[1:]}
    assert {"HttpOnly", "Secure", "SameSite=Strict", "Path=/ui"} <= flags
    assert ADMIN_TOKEN not in session
    page = http.get("/ui/workloads")
    assert page.status_code == 200
    assert "<title>Workloads · Quartermaster</title>" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    # A cookie altered by one character is no session.
    sealed = http.cookies["qm_console"]
    http.cookies["qm_console"] = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    assert http.get("/ui/workloads").status_code == 303


def test_a_wrong_token_or_a_forged_sign_in_form_is_refused(api: Api, http: Browser) -> None:
    wrong = http.sign_in("qm_not-a-token")
    assert wrong.status_code == 303
    assert wrong.headers["location"] == "/ui/signin?refused=1&next=%2Fui%2Fworkloads"
    assert "qm_console" not in http.cookies
    assert "That token was refused" in http.get(wrong.headers["location"]).text
    # A form posted from elsewhere has no sign-in cookie to match.
    forged = httpx.post(
        api.base_url + "/ui/signin", data={"token": ADMIN_TOKEN, "csrf_token": "guess"}
    )
    assert forged.status_code == 403
    assert not any(h.startswith("qm_console=") for h in forged.headers.get_list("set-cookie"))


def test_a_state_changing_request_without_the_csrf_token_is_refused(
    api: Api, http: Browser
) -> None:
    setup_quota(api.admin)
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=workload("victim"))
    assert created.status_code == 201, created.text
    http.sign_in(ADMIN_TOKEN)
    cancel = "/ui/workloads/team-a/victim/cancel"
    for refused in (
        http.post(cancel),
        http.post(cancel, data={"csrf_token": "not-the-token"}),
        http.post(cancel, headers={"X-CSRF-Token": "not-the-token"}),
        http.post("/ui/signout"),
    ):
        assert refused.status_code == 403, refused.text
        assert "CSRF token" in refused.text
    state = api.admin.get("/v1/namespaces/team-a/workloads/victim").json()["status"]["state"]
    assert state == "Pending"
    assert http.get("/ui/workloads").status_code == 200  # still signed in
    token = http.csrf()
    done = http.post(cancel, headers={"X-CSRF-Token": token, "HX-Request": "true"})
    assert done.status_code == 200, done.text
    assert "Cancelled" in done.text
    state = api.admin.get("/v1/namespaces/team-a/workloads/victim").json()["status"]["state"]
    assert state == "Cancelled"


def test_sign_out_ends_the_session(api: Api, http: Browser) -> None:
    http.sign_in(ADMIN_TOKEN)
    token = http.csrf()
    out = http.post("/ui/signout", data={"csrf_token": token})
    assert out.status_code == 303
    assert out.headers["location"] == "/ui/signin"
    assert "qm_console" not in http.cookies
    assert http.get("/ui/workloads").status_code == 303


def test_a_revoked_token_ends_its_sessions(api: Api, http: Browser) -> None:
    issued = api.admin.post("/v1/tokens", json={"name": "brief", "role": "auditor"}).json()
    http.sign_in(issued["token"])
    assert http.get("/ui/workloads").status_code == 200
    assert api.admin.delete(f"/v1/tokens/{issued['id']}").status_code == 204
    again = http.get("/ui/workloads")
    assert again.status_code == 303
    assert again.headers["location"].startswith("/ui/signin")
    assert "qm_console" not in http.cookies


def _stream(http: Browser, path: str) -> str:
    """What the live stream sends from ``path`` until it goes quiet."""
    seen = []
    timeout = httpx.Timeout(30, read=3)
    with http.http.stream("GET", path, headers=http.cookie_header(), timeout=timeout) as response:
        assert response.status_code == 200
        try:
            for chunk in response.iter_text():
                seen.append(chunk)
        except httpx.ReadTimeout:
            pass  # the backlog is sent at once; quiet after it
    return "".join(seen)


def test_a_submitters_pages_fragments_and_stream_carry_nothing_of_another_namespace(
    api: Api, http: Browser
) -> None:
    setup_quota(api.admin, "team-a", "alpha")
    setup_quota(api.admin, "team-b", "beta")
    for namespace, name in (("team-a", "ours"), ("team-b", "theirs")):
        created = api.admin.post(f"/v1/namespaces/{namespace}/workloads", json=workload(name))
        assert created.status_code == 201, created.text
    issued = api.admin.post(
        "/v1/tokens", json={"name": "a-only", "role": "submitter", "namespaces": ["team-a"]}
    ).json()
    http.sign_in(issued["token"])
    shown = {
        path: http.get(path)
        for path in (
            "/ui/workloads",
            "/ui/workloads/rows",
            "/ui/workloads?namespace=team-a",
            "/ui/workloads/team-a/ours",
            "/ui/workloads/team-a/ours/detail",
            "/ui/queues",
            "/ui/queues/tree",
        )
    }
    for path, page in shown.items():
        assert page.status_code == 200, (path, page.text)
        assert "team-b" not in page.text and "theirs" not in page.text, path
    assert "ours" in shown["/ui/workloads"].text
    assert ">Fleet<" not in shown["/ui/workloads"].text  # no page the API would refuse
    for path in (
        "/ui/workloads?namespace=team-b",
        "/ui/workloads/rows?namespace=team-b",
        "/ui/workloads/team-b/theirs",
        "/ui/workloads/team-b/theirs/detail",
        "/ui/fleet",
        "/ui/fleet/grid",
    ):
        refused = http.get(path)
        assert refused.status_code == 403, (path, refused.text)
        assert "theirs" not in refused.text
    ours = _stream(http, "/ui/events?after=0")
    assert "team-a" in ours and "team-b" not in ours
    # The same stream as an admin does carry team-b: the check above can fail.
    admin = Browser(api.base_url)
    admin.sign_in(ADMIN_TOKEN)
    assert "team-b" in _stream(admin, "/ui/events?after=0")


def test_a_person_signs_in_and_out_in_a_real_browser(api: Api, browse: Browse) -> None:
    page = browse()
    sign_in(page, api.base_url, ADMIN_TOKEN, start="/ui/workloads")
    assert page.url.endswith("/ui/workloads")
    assert page.title() == "Workloads · Quartermaster"
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r".*/ui/signin$"))
    assert page.title() == "Sign in · Quartermaster"
    page.goto(api.base_url + "/ui/workloads")
    page.wait_for_url(re.compile(r".*/ui/signin\?next=.*"))
    page.get_by_label("Token").fill("qm_wrong")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("That token was refused").wait_for()
    assert page.get_by_label("Token").get_attribute("aria-invalid") == "true"


def _frames(http: Browser, path: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The events a live stream sends (id and decoded data) until it goes quiet."""
    text = ""
    timeout = httpx.Timeout(30, read=3)
    with http.http.stream(
        "GET", path, headers={**http.cookie_header(), **headers}, timeout=timeout
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        try:
            for chunk in response.iter_text():
                text += chunk
        except httpx.ReadTimeout:
            pass  # the backlog is sent at once; quiet after it
    found = []
    for frame in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if "id" in fields:
            found.append({"id": int(fields["id"]), "event": fields["event"], **_json(fields)})
    return found


def _json(fields: dict[str, str]) -> dict[str, Any]:
    import json

    decoded: dict[str, Any] = json.loads(fields["data"])
    return decoded


def test_the_live_stream_resumes_after_the_last_event_id_and_carries_no_state(
    api: Api, http: Browser
) -> None:
    setup_quota(api.admin)
    for name in ("first", "second", "third"):
        created = api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name))
        assert created.status_code == 201, created.text
    http.sign_in(ADMIN_TOKEN)
    everything = _frames(http, "/ui/events?after=0&kind=Workload", {})
    assert [f["data"]["name"] for f in everything] == ["first", "second", "third"]
    assert everything[0] == {
        "id": everything[0]["id"],
        "event": "WorkloadSubmitted",
        "position": everything[0]["id"],
        "type": "WorkloadSubmitted",
        "data": {"kind": "Workload", "namespace": "team-a", "name": "first"},
    }
    # A browser reconnecting says where it was: the stream goes on from there.
    resumed = _frames(
        http, "/ui/events?after=0&kind=Workload", {"Last-Event-ID": str(everything[0]["id"])}
    )
    assert [f["data"]["name"] for f in resumed] == ["second", "third"]


def test_a_page_catches_up_after_its_live_stream_is_cut(api: Api, browse: Browse) -> None:
    setup_quota(api.admin)
    upstream = httpx.URL(api.base_url)
    proxy = TcpProxy((upstream.host, upstream.port or 80))
    try:
        base = f"http://127.0.0.1:{proxy.port}"
        page = browse()
        sign_in(page, base, ADMIN_TOKEN, start="/ui/workloads?namespace=team-a")
        page.locator("#live.on").wait_for()
        # Every event the page hears, by id, and a mark a reload would lose.
        page.evaluate(
            """() => { window.__qmMark = 'kept'; window.__qmIds = [];
            document.addEventListener('htmx:sseMessage',
              (e) => window.__qmIds.push(Number(e.detail.lastEventId))); }"""
        )

        def submit(name: str) -> int:
            created = api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name))
            assert created.status_code == 201, created.text
            return int(created.json()["metadata"]["resourceVersion"])

        submit("before")
        page.locator('tr[data-workload="team-a/before"]').wait_for()
        # From here the stream's failures to reconnect are the point, not faults.
        browse.watched.streams_may_fail = True
        proxy.cut()
        page.locator("#live:not(.on)").wait_for()
        submit("during")  # while the page cannot hear of it
        proxy.restore()
        page.locator('tr[data-workload="team-a/during"]').wait_for()
        page.locator("#live.on").wait_for()
        assert page.evaluate("window.__qmMark") == "kept"

        def heard() -> list[int] | None:
            ids: list[int] = page.evaluate("window.__qmIds")
            return ids if len(ids) >= 2 else None

        ids = wait_for(heard, what="two events heard")
        # Resumed from the last event it had (Last-Event-ID), not replayed
        # from where the page began: no event twice, the missed one heard.
        assert ids == sorted(set(ids)) and len(ids) == 2, ids
    finally:
        proxy.close()
