"""A plain HTTP client signed in to the console, for tests without a browser."""

from __future__ import annotations

import re
from typing import Any

import httpx


class Browser:
    """A plain HTTP client that keeps the console's cookies as a browser
    would on this origin (httpx's jar sends no Secure cookie over http)."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=30)
        self.cookies: dict[str, str] = {}

    def _keep(self, response: httpx.Response) -> httpx.Response:
        for header in response.headers.get_list("set-cookie"):
            name, _, rest = header.partition("=")
            value = rest.split(";", 1)[0]
            if "Max-Age=0" in header:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return response

    def cookie_header(self) -> dict[str, str]:
        return {"cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.cookie_header(), **kwargs.pop("headers", {})}
        return self._keep(self.http.get(path, headers=headers, **kwargs))

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.cookie_header(), **kwargs.pop("headers", {})}
        return self._keep(self.http.post(path, headers=headers, **kwargs))

    def sign_in(self, token: str, next_path: str = "/ui/workloads") -> httpx.Response:
        form = self.get("/ui/signin")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert csrf is not None, form.text
        data = {"token": token, "csrf_token": csrf.group(1), "next": next_path}
        return self.post("/ui/signin", data=data)

    def csrf(self) -> str:
        page = self.get("/ui/workloads")
        found = re.search(r'"X-CSRF-Token": "([^"]+)"', page.text)
        assert found is not None, page.text
        return found.group(1)
