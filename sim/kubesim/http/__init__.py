"""The HTTP face of a simulated cluster: a plain ASGI application.

No framework on purpose: the routes are the Kubernetes REST layout
(``/api/v1/namespaces/{ns}/{plural}/{name}/{subresource}``), requests are
small, and the stand-in must answer well over a thousand writes a second and
hold long watch streams, so a request costs one path split, one JSON parse and
one ``ApiCore`` call. Watches stream newline-delimited JSON events over chunked
transfer encoding, exactly like the real server.

:mod:`.app` routes, :mod:`.request` reads a request, :mod:`.response` writes an answer
and :mod:`.watch` streams events.
"""

from __future__ import annotations

from sim.kubesim.http.app import KubeApp

__all__ = ["KubeApp"]
