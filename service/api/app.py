"""The FastAPI application. Routers stay thin; errors are problem+json."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text
from sqlalchemy.exc import SQLAlchemyError
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from service import console
from service.api import docs, openapi, problems
from service.api.events import EventHead, events_router
from service.api.fastpath import SubmitFastPath
from service.api.group_commit import DATABASE_DOWN, GroupCommit
from service.api.idempotent import IdempotencyMiddleware
from service.api.indoubt import CommitInDoubt, InDoubt, InDoubtCommit, Settlements
from service.api.ledger import ledger_router
from service.api.middleware import (
    AuthenticateMiddleware,
    DatabaseDownMiddleware,
    Metrics,
    MetricsMiddleware,
    RateLimitMiddleware,
    Shedding,
    TextGuardMiddleware,
)
from service.api.outage import Outage
from service.api.problems import problem
from service.api.ratelimit import Buckets, LocalBuckets, RedisBuckets
from service.api.routes import admin_router, workload_router
from service.api.tokens import token_router
from service.app.bootstrap import Services
from service.app.migrate import head_revision
from service.config import Settings
from service.projections.schema import resources


class QueueDepths(Collector):
    """Pending and admitted workloads per ClusterQueue, read at scrape time."""

    def __init__(self, services: Services) -> None:
        self._services = services

    def collect(self) -> Any:
        family = GaugeMetricFamily(
            "qm_clusterqueue_workloads",
            "Workloads per ClusterQueue and state",
            labels=["cluster_queue", "state"],
        )
        cq = resources.c.status["clusterQueue"].astext
        state = resources.c.status["state"].astext
        query = (
            select(cq, state, func.count())
            .where(resources.c.kind == "Workload", resources.c.deleted.is_(False))
            .group_by(cq, state)
        )
        try:
            with self._services.engine.connect() as conn:
                rows = conn.execute(query).all()
        except SQLAlchemyError:
            rows = []
        for queue, current, count in rows:
            family.add_metric([queue or "", current or "Pending"], count)
        yield family


def _buckets(settings: Settings, rate: float, burst: int) -> Buckets:
    """Shared by every API process through Redis when there is one."""
    url = settings.rate_limit_redis_url or settings.broker_url
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        return RedisBuckets(url, rate, burst)
    return LocalBuckets(rate, burst)


def create_app(services: Services) -> FastAPI:
    threads = services.settings.api_threads

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Fewer threads than anyio's default 40: a request that holds the
        # event store's or the ledger's lock must not queue for the GIL behind
        # dozens of threads validating other requests.
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        yield

    app = FastAPI(
        title="Quartermaster",
        version="1.0.0",
        description="Fleet-wide admission for GPU gangs: quotas, submissions, events.",
        lifespan=lifespan,
        # We export Prometheus metrics and configure no OpenTelemetry; left
        # on, FastAPI looks for a provider in os.environ on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # Served from local assets by docs.install: the defaults load a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.container = services
    _writes(app, services)
    app.state.event_head = EventHead(services.event_queries.head)
    expected_revision = head_revision()
    metrics = Metrics()
    metrics.registry.register(QueueDepths(services))

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], response_model=None)
    def readyz() -> dict[str, str] | JSONResponse:
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

    @app.get("/metrics", tags=["health"], response_class=Response)
    def prometheus(request: Request) -> Response:
        """Prometheus metrics: requests, latencies, workloads per ClusterQueue."""
        registry = metrics.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Several API processes: add up what every one of them wrote.
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped library
            registry.register(QueueDepths(services))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # Submissions first: routes are matched in order, one by one.
    app.include_router(workload_router())
    app.include_router(admin_router())
    app.include_router(token_router())
    app.include_router(events_router())
    app.include_router(ledger_router())
    problems.install(app)
    outage: Outage = app.state.outage
    outage.watch(services.engine)
    openapi.install(app)
    docs.install(app)
    settings = services.settings
    # Innermost first (each one added wraps those before it): metrics see
    # every answer, including 429s and replays; submissions take the fast
    # path inside all of ours.
    app.add_middleware(SubmitFastPath)
    app.add_middleware(IdempotencyMiddleware, store=services.idempotency)
    # Outside the Idempotency-Key's claim: a caller is known before any of
    # its body is read.
    app.add_middleware(AuthenticateMiddleware)
    committer: GroupCommit[Any, Any] = app.state.group_commit
    app.add_middleware(
        RateLimitMiddleware,
        buckets=_buckets(settings, settings.rate_limit_per_second, settings.rate_limit_burst),
        anonymous=_buckets(
            settings, settings.rate_limit_anonymous_per_second, settings.rate_limit_anonymous_burst
        ),
        shedding=Shedding(
            settings.max_in_flight,
            settings.max_submission_backlog,
            lambda: committer.waiting,
        ),
    )
    app.add_middleware(TextGuardMiddleware)
    app.add_middleware(DatabaseDownMiddleware, outage=outage)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    console.install(app)  # the web console at /ui, its session gate outermost
    _trust_proxies(app, settings)
    return app


def _writes(app: FastAPI, services: Services) -> None:
    """The group commit of single submissions, and the settling of every
    write whose COMMIT's outcome is unknown (service/api/indoubt.py)."""
    app.state.in_doubt = InDoubt(services.engine)
    # A batch whose commit's outcome is unknown is every item's, as the
    # database down is.
    app.state.group_commit = GroupCommit(
        InDoubtCommit(app.state.in_doubt, services.submissions.submit_parsed),
        shared=(*DATABASE_DOWN, CommitInDoubt),
    )
    app.state.settlements = Settlements(services.engine)


def _trust_proxies(app: FastAPI, settings: Settings) -> None:
    """X-Forwarded-For read from QM_TRUSTED_PROXIES alone, as uvicorn's
    ProxyHeadersMiddleware reads it; outside even the console's gate, so that
    every part sees the client's address and scheme, not its proxy's (the
    unauthenticated are rate limited by address; the gate's cookies follow
    the scheme). The server's own reading of these headers is off
    (service/cli.py)."""
    if settings.trusted_proxy_networks:
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxy_networks)
