"""Read models built from the event log by tracking processors."""

from service.projections.runner import CatchUp, Projection, ProjectionRunner, UnknownProjection
from service.projections.streams import StreamIndex


def all_projections() -> list[Projection]:
    """Every projection the service maintains; later modules add theirs here."""
    return [StreamIndex()]


__all__ = [
    "CatchUp",
    "Projection",
    "ProjectionRunner",
    "StreamIndex",
    "UnknownProjection",
    "all_projections",
]
