"""uvicorn's HTTP protocols, answering the requests they cannot parse with
problem+json like every other error of ours.

httptools refuses a request line past its limit (a URL of about 64 KiB and
more), and h11 headers past ``h11_max_incomplete_event_size``, with a
plain-text 400 written by the protocol itself, before any ASGI app runs.
uvicorn offers no hook for that body, so these subclasses replace the one
method that writes it; ``quartermaster api`` serves with them.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.problems import PROBLEM_JSON, TYPE_BASE

#: What ``uvicorn.run(http=...)`` takes to serve with these protocols.
HTTP_PROTOCOL = "service.api.server:ProblemHttpToolsProtocol"


def malformed_request(detail: str) -> bytes:
    """The whole response to a request that could not be parsed."""
    body = json.dumps(
        {
            "type": TYPE_BASE + "malformed-request",
            "title": "Malformed request",
            "status": 400,
            "detail": f"{detail} (a URL of at most 64 KiB, headers within limits)",
        }
    ).encode()
    head = (
        "HTTP/1.1 400 Bad Request\r\n"
        f"content-type: {PROBLEM_JSON}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        self.transport.write(malformed_request(msg))
        self.transport.close()


class ProblemH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        self.transport.write(malformed_request(msg))
        self.transport.close()
