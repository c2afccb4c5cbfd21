"""A small HTTP proxy in front of the live API that misbehaves on request:
it loses an answer after the API has acted, answers 503 or 429 itself, or
cuts an event stream after some events. Clients talk real HTTP to it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP_BY_HOP = {"connection", "content-length", "transfer-encoding", "keep-alive", "host"}


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    status: int | None = None
    replayed: bool = False


@dataclass
class Fault:
    """``drop`` (forward, then close without answering), ``503``, ``429`` or
    ``409`` (key in flight; answer with Retry-After: 0, do not forward), ``cut:N`` (forward an
    event stream and cut the connection mid-chunk after N events)."""

    method: str
    action: str
    path_prefix: str = "/"


@dataclass
class Proxy:
    upstream: str
    url: str = ""
    faults: list[Fault] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    open_responses: set[httpx.Response] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method and path.startswith(fault.path_prefix):
                    self.faults.remove(fault)
                    return fault
        return None

    def requests(self, method: str, path_prefix: str = "/") -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path.startswith(path_prefix)]


def _handler(proxy: Proxy, upstream: httpx.Client) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _handle(self) -> None:
            try:
                self._proxy()
            except (httpx.HTTPError, OSError):
                self.close_connection = True  # the client or the proxy went away

        def _proxy(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            with proxy.lock:
                proxy.seen.append(seen)
            fault = proxy.take_fault(self.command, self.path)
            if fault is not None and fault.action in ("503", "429", "409"):
                self._answer_problem(int(fault.action))
                seen.status = int(fault.action)
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            request = upstream.build_request(self.command, self.path, headers=headers, content=body)
            response = upstream.send(request, stream=True)
            with proxy.lock:
                proxy.open_responses.add(response)
            try:
                seen.status = response.status_code
                seen.replayed = response.headers.get("idempotent-replayed") == "true"
                if fault is not None and fault.action == "drop":
                    response.read()
                    self.close_connection = True  # the API acted; its answer is lost
                    return
                cut = int(fault.action.split(":")[1]) if fault is not None else None
                self._relay(response, cut)
            finally:
                with proxy.lock:
                    proxy.open_responses.discard(response)
                response.close()

        def _answer_problem(self, status: int) -> None:
            kind = b"idempotency-key-in-flight" if status == 409 else b"injected"
            body = (
                b'{"type":"https://quartermaster.dev/problems/%s","title":"injected",'
                b'"status":%d,"detail":"proxy"}' % (kind, status)
            )
            self.send_response(status)
            self.send_header("Content-Type", "application/problem+json")
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _relay(self, response: httpx.Response, cut: int | None) -> None:
            self.send_response(response.status_code)
            for key, value in response.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events, buffer = 0, b""
            for chunk in response.iter_raw():
                if cut is None:
                    self._chunk(chunk)
                    continue
                buffer += chunk
                while b"\n\n" in buffer:
                    message, buffer = buffer.split(b"\n\n", 1)
                    self._chunk(message + b"\n\n")
                    events += b"id: " in message
                    if events >= cut:
                        # Half a chunk, then hang up: a dropped stream.
                        self.wfile.write(b"40\r\nid: ")
                        self.wfile.flush()
                        self.close_connection = True
                        return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, data: bytes) -> None:
            if data:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        # http.server dispatches on do_<METHOD>.
        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle  # noqa: N815

    return Handler


@contextmanager
def flaky_proxy(upstream_url: str) -> Iterator[Proxy]:
    proxy = Proxy(upstream_url)
    with httpx.Client(base_url=upstream_url, timeout=60) as upstream:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy, upstream))
        server.daemon_threads = True
        proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield proxy
        finally:
            # Streams still relayed end here, so that the API sees its
            # watchers leave and the test leaves nothing running.
            with proxy.lock:
                for response in list(proxy.open_responses):
                    response.close()
            server.shutdown()
            server.server_close()
            thread.join(5)
