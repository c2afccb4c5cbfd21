"""ASGI entry point for ``uvicorn --factory service.api.main:create``."""

from __future__ import annotations

from fastapi import FastAPI

from service.api.app import create_app
from service.app.bootstrap import bootstrap
from service.config import get_settings


def create() -> FastAPI:
    return create_app(bootstrap(get_settings()))
