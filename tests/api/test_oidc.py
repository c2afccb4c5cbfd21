"""OIDC JWTs verified against the issuer's JWKS, served over HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from service.runtime.embedded import free_port
from tests.api.conftest import Api, serve
from tests.api.test_resources import _problem

ISSUER = "https://issuer.example"


@pytest.fixture
def issuer() -> Iterator[tuple[str, rsa.RSAPrivateKey]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(jwks)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/jwks", key
    server.shutdown()
    server.server_close()


def _token(key: rsa.RSAPrivateKey, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": "quartermaster", "sub": "alice", "iat": now, "exp": now + 300}
    return jwt.encode({**body, **claims}, key, algorithm="RS256", headers={"kid": "k1"})


def test_oidc_tokens_map_a_claim_to_roles(
    database_url: str, api: Api, issuer: tuple[str, rsa.RSAPrivateKey]
) -> None:
    jwks_url, key = issuer
    settings = {"oidc_issuer": ISSUER, "oidc_audience": "quartermaster", "oidc_jwks_url": jwks_url}
    with serve(database_url, **settings) as (base_url, _):

        def call(token: str) -> httpx.Response:
            return httpx.post(
                f"{base_url}/v1/resourceflavors",
                json={"metadata": {"name": f"f{time.monotonic_ns()}"}, "spec": {}},
                headers={"Authorization": f"Bearer {token}"},
            )

        assert call(_token(key, groups=["queue-admin", "unrelated"])).status_code == 201
        mixed = _token(key, groups="auditor submitter", namespaces=["a"])
        who = httpx.get(
            f"{base_url}/v1/whoami", headers={"Authorization": f"Bearer {mixed}"}
        ).json()
        assert who == {"name": "oidc:alice", "roles": ["auditor", "submitter"], "namespaces": ["a"]}
        _problem(call(_token(key, groups=["auditor"])), 403, "forbidden")
        _problem(
            call(_token(key, groups=["queue-admin"], exp=int(time.time()) - 10)),
            401,
            "unauthorized",
        )
        _problem(call(_token(key, groups=["queue-admin"], aud="other")), 401, "unauthorized")
        _problem(
            call(_token(key, groups=["queue-admin"], iss="https://evil.example")),
            401,
            "unauthorized",
        )
        stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _problem(call(_token(stranger, groups=["queue-admin"])), 401, "unauthorized")
