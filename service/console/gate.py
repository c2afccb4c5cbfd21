"""The console's door: one ASGI middleware, outermost, for paths under ``/ui``.

It turns the session cookie into the ``Authorization: Bearer`` header the
API's own stack understands, so that everything inside — rate limits,
authentication (``AuthenticateMiddleware``, ``current_principal``), the
routes' role checks — treats a console request exactly as an API request of
the same token. Around that it adds what a browser needs and a bearer client
does not:

* CSRF: every state-changing request (not GET, HEAD or OPTIONS) must carry the
  session's CSRF token, in ``X-CSRF-Token`` (htmx sends it from the page) or
  in the form field ``csrf_token``; the sign-in form, made before any session
  exists, is checked against a cookie of its own (double submit). Refused: 403.
* No session: a page asks to sign in (303 to ``/ui/signin``; htmx gets
  ``HX-Redirect``); a 401 from inside (a token revoked or expired) clears the
  cookie and does the same.
* An error answered as problem+json by the API's middleware (429, 503, 413)
  becomes a page; security headers (CSP without inline script or style, no
  framing, no sniffing) go on every answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, quote

from service.console.session import (
    COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    SIGNIN_COOKIE,
    SessionCodec,
    same_secret,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Render = Callable[[str, dict[str, Any]], bytes]

#: Where the session is left for the console's routes.
SESSION_KEY = "qm.console.session"
#: The root path as the gate saw it (the mount rewrites the scope's own).
ROOT_KEY = "qm.console.root"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The largest form the gate reads to find a CSRF token or a sign-in token.
MAX_FORM_BYTES = 64 * 1024
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers", [])}


def _cookies(raw: bytes | None) -> dict[str, str]:
    if not raw:
        return {}
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw.decode("latin-1"))
    except CookieError:
        return {}
    return {key: morsel.value for key, morsel in jar.items()}


class ConsoleGate:
    def __init__(
        self,
        app: ASGIApp,
        prefix: str,
        codec: SessionCodec,
        render: Render,
        public: frozenset[str],
        clear_cookie: Callable[[Scope], str],
    ) -> None:
        self.app = app
        self.prefix = prefix
        self.codec = codec
        self.render = render
        #: Paths (below the prefix) open without a session: sign-in, static assets.
        self.public = public
        self.clear_cookie = clear_cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            await self.app(scope, receive, send)
            return
        scope[ROOT_KEY] = scope.get("root_path", "")
        headers = _headers(scope)
        # One way in: a bearer header sent to /ui is not the console's session.
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
        cookies = _cookies(headers.get(b"cookie"))
        session = self.codec.open(cookies.get(COOKIE))
        local = path[len(self.prefix) :] or "/"
        unsafe = scope["method"] not in SAFE_METHODS
        htmx = b"hx-request" in headers
        if local == "/signin" and unsafe:
            await self._sign_in(scope, receive, send, cookies)
            return
        if self._is_public(local):
            await self._inner(scope, receive, send, htmx)
            return
        if session is None:
            if unsafe:
                await self._refuse(send, 403, "no console session: sign in first")
            else:
                await self._to_sign_in(scope, send, htmx)
            return
        if unsafe:
            given = headers.get(CSRF_HEADER.encode(), b"").decode("latin-1") or None
            if given is None:
                body, receive = await _buffered(receive)
                if body is None:
                    await self._refuse(send, 413, "the form is too large")
                    return
                given = parse_form(body, headers).get(CSRF_FIELD)
            if not same_secret(given, session.csrf):
                await self._refuse(send, 403, "the CSRF token is missing or wrong")
                return
        scope[SESSION_KEY] = session
        _authorize(scope, session.token)
        await self._inner(scope, receive, send, htmx)

    def _is_public(self, local: str) -> bool:
        return local in self.public or local.startswith("/static/")

    async def _sign_in(
        self, scope: Scope, receive: Receive, send: Send, cookies: dict[str, str]
    ) -> None:
        """The sign-in form: its CSRF cookie checked, its token moved into the
        Authorization header, then on to the route through the API's stack."""
        body, receive = await _buffered(receive)
        if body is None:
            await self._refuse(send, 413, "the form is too large")
            return
        form = parse_form(body, _headers(scope))
        if not same_secret(form.get(CSRF_FIELD), cookies.get(SIGNIN_COOKIE)):
            await self._refuse(send, 403, "the sign-in form expired: load it again")
            return
        again = {
            "csrf": cookies.get(SIGNIN_COOKIE),
            "next": form.get("next") or "",
            "root": scope.get(ROOT_KEY, ""),
        }
        token = (form.get("token") or "").strip()
        if not token:
            page = self.render("signin.html", {**again, "error": "Enter a token."})
            await _send_html(send, 400, page)
            return
        _authorize(scope, token)
        await self._inner(scope, receive, send, htmx=False, signing_in=again)

    async def _inner(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        htmx: bool,
        signing_in: dict[str, Any] | None = None,
    ) -> None:
        """The request through the API's stack, its answer with security
        headers; a 401 sends the browser to sign in, a problem becomes a page."""
        held: list[Message] = []
        state: dict[str, Any] = {"problem": False}

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                kind = dict(message.get("headers", [])).get(b"content-type", b"")
                if status == 401 and signing_in is None:
                    await self._to_sign_in(scope, send, htmx, clear=True)
                    state["problem"] = state["done"] = True
                    return
                if kind.startswith(b"application/problem+json"):
                    state["problem"] = True
                    held.append(message)
                    return
                message = {**message, "headers": [*message.get("headers", []), *_SECURITY_HEADERS]}
            elif state["problem"]:
                if state.get("done"):
                    return
                held.append(message)
                if not message.get("more_body", False):
                    await self._problem_page(send, held, signing_in)
                return
            await send(message)

        await self.app(scope, receive, wrapped)

    async def _problem_page(
        self, send: Send, held: list[Message], signing_in: dict[str, Any] | None
    ) -> None:
        start = held[0]
        raw = b"".join(bytes(m.get("body", b"")) for m in held[1:])
        try:
            problem = json.loads(raw)
        except ValueError:
            problem = {}
        status = int(start["status"])
        keep = [(k, v) for k, v in start.get("headers", []) if k.lower() == b"retry-after"]
        detail = str(problem.get("detail") or problem.get("title") or "")
        if signing_in is not None and status == 401:
            # Post/Redirect/Get: the form again, saying the token was refused.
            await self._to_sign_in_again(send, signing_in)
            return
        if signing_in is not None:
            page = self.render("signin.html", {**signing_in, "error": detail})
        else:
            page = self.render(
                "error.html", {"status": status, "title": problem.get("title"), "detail": detail}
            )
        await _send_html(send, status, page, keep)

    async def _to_sign_in_again(self, send: Send, signing_in: dict[str, Any]) -> None:
        target = quote(str(signing_in.get("next") or ""), safe="")
        location = f"{signing_in['root']}{self.prefix}/signin?refused=1&next={target}"
        headers = [(b"location", location.encode()), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, send: Send, status: int, detail: str) -> None:
        title = "Refused" if status == 403 else "Too large"
        page = self.render("error.html", {"status": status, "title": title, "detail": detail})
        await _send_html(send, status, page)

    async def _to_sign_in(self, scope: Scope, send: Send, htmx: bool, clear: bool = False) -> None:
        root = scope.get(ROOT_KEY, "")
        path = scope.get("path", "")
        query = scope.get("query_string", b"").decode("latin-1")
        target = path + (f"?{query}" if query else "")
        location = f"{root}{self.prefix}/signin?next={quote(target, safe='')}"
        headers = [(b"cache-control", b"no-store"), *_SECURITY_HEADERS]
        if clear:
            headers.append((b"set-cookie", self.clear_cookie(scope).encode()))
        if htmx:
            headers.append((b"hx-redirect", location.encode()))
            await send({"type": "http.response.start", "status": 401, "headers": headers})
        else:
            headers.append((b"location", location.encode()))
            await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _authorize(scope: Scope, token: str) -> None:
    scope["headers"] = [
        *[(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"],
        (b"authorization", f"Bearer {token}".encode("latin-1", "replace")),
    ]


async def _send_html(
    send: Send, status: int, page: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(page)).encode()),
        (b"cache-control", b"no-store"),
        *_SECURITY_HEADERS,
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": page})


async def _buffered(receive: Receive) -> tuple[bytes | None, Receive]:
    """The whole body (None past MAX_FORM_BYTES), and a receive that replays it."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None, receive
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def parse_form(body: bytes, headers: dict[bytes, bytes]) -> dict[str, str]:
    kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    if kind != b"application/x-www-form-urlencoded":
        return {}
    try:
        parsed = parse_qs(body.decode("utf-8"), max_num_fields=100)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {key: values[0] for key, values in parsed.items() if values}
