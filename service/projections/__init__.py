"""Read models built from the event log by tracking processors."""

from service.projections.resources import Resources
from service.projections.runner import CatchUp, Projection, ProjectionRunner, UnknownProjection


def all_projections() -> list[Projection]:
    """Every projection the service maintains; later modules add theirs here."""
    return [Resources()]


__all__ = [
    "CatchUp",
    "Projection",
    "ProjectionRunner",
    "Resources",
    "UnknownProjection",
    "all_projections",
]
