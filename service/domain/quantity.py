"""Kubernetes resource quantities, parsed exactly and stored as plain integers.

A quantity such as ``"1Ti"``, ``"500m"``, ``"1.5"`` or ``"2e3"`` is parsed into an
exact :class:`fractions.Fraction` (no floating point). Everywhere else in
Quartermaster an amount of a resource is an ``int`` in that resource's
*canonical unit*, following Kueue (``pkg/resources``): ``cpu`` is counted in
milli-cores, every other resource (memory and storage in bytes, ``pods``,
``nvidia.com/gpu`` …) in whole units. Fractional amounts are rounded up, as
``resource.Quantity.Value()`` does, so that a request is never under-counted.

Reference: https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction

__all__ = [
    "MILLI_RESOURCES",
    "QuantityError",
    "canonical_amount",
    "canonical_resources",
    "format_amount",
    "parse_quantity",
]

#: Resources counted in thousandths of a unit (Kueue counts cpu in milli-cores).
MILLI_RESOURCES: frozenset[str] = frozenset({"cpu"})

_BINARY_SUFFIXES: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_SUFFIXES: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?))$"
)


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity into an exact fraction of base units.

    ``int`` passes through; ``float`` is accepted for YAML convenience (``0.5``)
    and converted through its shortest decimal representation.
    """
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"not a quantity: {value!r}")
        value = repr(value)
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {value!r}")
    number = Fraction(match["number"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        scale = Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        scale = (
            Fraction(_BINARY_SUFFIXES[suffix])
            if suffix in _BINARY_SUFFIXES
            else _DECIMAL_SUFFIXES[suffix]
        )
    result = number * scale
    return -result if match["sign"] == "-" else result


def canonical_amount(resource: str, value: str | int | float) -> int:
    """The integer amount of ``resource`` in its canonical unit, rounded up."""
    quantity = parse_quantity(value)
    if resource in MILLI_RESOURCES:
        quantity *= 1000
    return math.ceil(quantity)


def canonical_resources(values: Mapping[str, str | int | float]) -> dict[str, int]:
    """Convert a ``{resource: quantity}`` mapping (requests, allocatable, quota)."""
    return {resource: canonical_amount(resource, value) for resource, value in values.items()}


def format_amount(resource: str, amount: int) -> str:
    """Render a canonical amount back as a readable Kubernetes quantity.

    ``cpu`` 1500 → ``"1500m"``, 96000 → ``"96"``; memory 2**40 → ``"1Ti"``.
    """
    if resource in MILLI_RESOURCES:
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if amount != 0 and abs(amount) >= 1024:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            base = _BINARY_SUFFIXES[suffix]
            if amount % base == 0:
                return f"{amount // base}{suffix}"
    return str(amount)
