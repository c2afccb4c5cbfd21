"""The API's documentation pages, /docs (Swagger UI) and /redoc, served with
every script and style from the service itself (the ``fastapi-offline``
package ships them): FastAPI's defaults load them from a public CDN and are
blank on a machine without internet."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse

#: Where the pages' assets are served; public, as the pages are.
STATIC = "/docs-static"
_ASSETS = Path(fastapi_offline.__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Serve /docs and /redoc from local assets (create the app with
    ``docs_url=None, redoc_url=None``)."""
    app.mount(STATIC, StaticFiles(directory=_ASSETS), name="docs-static")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{STATIC}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{STATIC}/favicon.png",
            with_google_fonts=False,
        )
