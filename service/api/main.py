"""ASGI entry point for ``uvicorn --factory service.api.main:create``."""

from __future__ import annotations

import gc

from fastapi import FastAPI

from service.api.app import create_app
from service.api.ratelimit import summarise_refusals
from service.app.bootstrap import bootstrap
from service.config import get_settings

#: Allocations between two young-generation collections (CPython's default
#: is 700). A request allocates thousands of short-lived objects and a bulk
#: submission millions: with the default, collection was a large share of a
#: bulk submission's CPU.
GC_YOUNG_THRESHOLD = 50_000


def create() -> FastAPI:
    app = create_app(bootstrap(get_settings()))
    summarise_refusals()  # uvicorn's access log: a line per 429 was a tenant's flood
    # What start-up allocated lives as long as the process: out of the
    # collector's way, so that full collections do not walk it again.
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    return app
