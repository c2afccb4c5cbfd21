"""/docs and /redoc work on a machine without internet: every script and
style the pages load is served by the service itself."""

from __future__ import annotations

import re

import pytest

from tests.api.conftest import Api

_REFERENCES = re.compile(r"""(?:src|href)=["']([^"']+)["']|url:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_load_nothing_from_elsewhere(api: Api, page: str) -> None:
    anonymous = api.client(None)
    html = anonymous.get(page)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    references = [a or b for a, b in _REFERENCES.findall(html.text)]
    scripts = [r for r in references if r.endswith(".js")]
    assert scripts, html.text
    for reference in references:
        assert reference.startswith("/"), f"{page} loads {reference} from elsewhere"
        assert anonymous.get(reference).status_code == 200, reference
    assert "cdn." not in html.text and "fonts.googleapis" not in html.text
