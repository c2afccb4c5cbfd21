"""A TCP proxy in front of Postgres that a test can cut and restore: cut,
every open connection is closed and new ones are refused at once, as a
database that went away is seen by its clients."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import make_url


class TcpProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.cut_now = False
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, database_url: str) -> str:
        """``database_url`` with this proxy as its host and port."""
        url = make_url(database_url).set(host="127.0.0.1", port=self.port)
        return url.render_as_string(hide_password=False)

    def cut(self) -> None:
        """Close every relayed connection; refuse new ones until ``restore``."""
        with self._lock:
            self.cut_now = True
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def restore(self) -> None:
        with self._lock:
            self.cut_now = False

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._listener.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self.cut_now:
                    client.close()  # refused, as by a server that is down
                    continue
                try:
                    server = socket.create_connection(self.upstream, timeout=5)
                except OSError:
                    client.close()
                    continue
                self._open |= {client, server}
            threading.Thread(target=self._relay, args=(client, server), daemon=True).start()

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        pair = {client: server, server: client}
        try:
            while True:
                ready, _, _ = select.select(list(pair), [], [], 1.0)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pair[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._open -= {client, server}
            client.close()
            server.close()


@contextmanager
def tcp_proxy(database_url: str) -> Iterator[TcpProxy]:
    url = make_url(database_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    try:
        yield proxy
    finally:
        proxy.close()
