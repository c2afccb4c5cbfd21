"""The client address behind a reverse proxy (QM_TRUSTED_PROXIES): what
the unauthenticated are rate limited by. X-Forwarded-For is read as
uvicorn's ProxyHeadersMiddleware reads it (the rightmost address that is
not itself a trusted proxy), and only when the peer is a trusted proxy:
from anyone else it is ignored, so that a client cannot name itself a fresh
address per request. Served as ``quartermaster api`` serves (uvicorn's own
reading of the headers off)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from service.config import Settings
from tests.api.conftest import serve

FLAVORS = "/v1/resourceflavors"
#: Three unauthenticated requests per address, then 429.
LIMITS: dict[str, Any] = {
    "rate_limit_anonymous_per_second": 0.01,
    "rate_limit_anonymous_burst": 3,
    "server_options": {"proxy_headers": False},
}


def _statuses(base_url: str, forwarded: list[str]) -> list[int]:
    """Unauthenticated requests (a 401 each, unless limited first), each
    claiming to be forwarded for the address given."""
    with httpx.Client(base_url=base_url) as client:
        return [client.get(FLAVORS, headers={"X-Forwarded-For": f}).status_code for f in forwarded]


def test_without_trusted_proxies_a_client_cannot_name_its_address(
    database_url: str, engine: sa.Engine
) -> None:
    with serve(database_url, **LIMITS) as (url, _):
        assert _statuses(url, [f"203.0.113.{i}" for i in range(5)]) == [401] * 3 + [429] * 2


def test_a_peer_that_is_not_a_trusted_proxy_cannot_name_its_client(
    database_url: str, engine: sa.Engine
) -> None:
    with serve(database_url, trusted_proxies="10.0.0.0/8", **LIMITS) as (url, _):
        assert _statuses(url, [f"203.0.113.{i}" for i in range(5)]) == [401] * 3 + [429] * 2


def test_a_trusted_proxy_names_the_client_and_each_client_has_its_own_limit(
    database_url: str, engine: sa.Engine
) -> None:
    with serve(database_url, trusted_proxies="127.0.0.0/8, ::1", **LIMITS) as (url, _):
        assert _statuses(url, ["203.0.113.7"] * 4) == [401, 401, 401, 429]
        # Another client behind the same proxy is not limited by the first.
        assert _statuses(url, ["198.51.100.9"]) == [401]
        # Addresses put before its own (the client writes those) do not
        # make it another client: the proxy's is the rightmost entry.
        assert _statuses(url, ["192.0.2.1, 203.0.113.7", "192.0.2.2,203.0.113.7"]) == [429, 429]
        # A chain of trusted proxies: the first untrusted address from the right.
        assert _statuses(url, ["198.51.100.9, 127.0.0.5"]) == [401]
        assert _statuses(url, ["198.51.100.9, 127.0.0.5"] * 2) == [401, 429]


def test_trusted_proxies_are_addresses_or_networks() -> None:
    assert Settings(trusted_proxies="10.0.0.1/8, 192.0.2.7").trusted_proxy_networks == [
        "10.0.0.0/8",
        "192.0.2.7/32",
    ]
    assert Settings().trusted_proxy_networks == []
    for bad in ("*", "proxy.example", "10.0.0.0/33"):
        with pytest.raises(ValidationError, match="trusted_proxies"):
            Settings(trusted_proxies=bad)
