"""The console's pages, in navigation order. A new page is a module here
with a :class:`~service.console.web.Page` named ``PAGE`` (its router and the
roles that may open it) and its templates; list it below."""

from __future__ import annotations

from service.console.pages import fleet, ledger, queues, usage, workloads
from service.console.web import Page

PAGES: list[Page] = [fleet.PAGE, queues.PAGE, workloads.PAGE, ledger.PAGE, usage.PAGE]

__all__ = ["PAGES"]
