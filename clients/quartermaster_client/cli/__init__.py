"""``qmctl``, the command line (``python -m quartermaster_client.cli``)."""

from quartermaster_client.cli.main import app, main

__all__ = ["app", "main"]
