"""The FastAPI application. Routers stay thin; errors are problem+json."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from service.api.problems import problem
from service.app.bootstrap import Services
from service.app.migrate import head_revision


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="Quartermaster", version="0.1.0")
    app.state.services = services
    expected_revision = head_revision()

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], response_model=None)
    def readyz(request: Request) -> dict[str, str] | JSONResponse:
        """Readiness: the database answers and its migrations are current."""
        try:
            with services.engine.connect() as conn:
                revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except SQLAlchemyError as error:
            return problem(
                503, "not-ready", "Not ready", f"database unreachable: {type(error).__name__}"
            )
        if revision != expected_revision:
            return problem(
                503,
                "not-ready",
                "Not ready",
                f"database at migration {revision}, expected {expected_revision}",
            )
        return {"status": "ready", "migration": str(revision)}

    return app
