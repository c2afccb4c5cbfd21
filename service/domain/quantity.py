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
    "MAX_AMOUNT",
    "MAX_SAFE_INTEGER",
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
_DECIMAL_EXPONENTS: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?))$"
)


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity, or one too large to count."""


#: The largest amount Kubernetes counts: ``resource.Quantity``'s int64
#: accessors (``Value``, ``MilliValue``, which Kueue sums) silently overflow
#: past it, and a binary-SI quantity is capped at it when parsed ("8Ei" reads
#: as 2^63-1). We refuse instead of capping. kubernetes/apimachinery
#: pkg/api/resource/quantity.go (ParseQuantity, Value, MilliValue).
MAX_AMOUNT = 2**63 - 1

#: The largest integer every JSON reader holds exactly (RFC 7493, section
#: 2.2): the ledger's canonical form (RFC 8785) refuses larger ones, so an
#: amount recorded there, such as a whole gang's requests, stays within it.
MAX_SAFE_INTEGER = 2**53 - 1

#: Kubernetes keeps a quantity's precision down to nano and rounds a finer
#: non-zero value away from zero (ParseQuantity: "0.9n" becomes "1n").
_NANO = 9
#: Exponents beyond this are refused before any arithmetic: "1e999999999"
#: would otherwise be a billion-digit integer.
_MAX_EXPONENT = 1000


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity into an exact fraction of base units.

    ``int`` passes through; ``float`` is accepted for YAML convenience (``0.5``)
    and converted through its shortest decimal representation. Precision
    is kept down to nano (finer values round away from zero, as Kubernetes
    rounds them); a magnitude beyond :data:`MAX_AMOUNT` is refused.
    """
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {_shown(value)}")
    if isinstance(value, int):
        return _bounded(Fraction(value), value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"not a quantity: {_shown(value)}")
        value = repr(value)
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {_shown(value)}")
    whole, _, fraction = match["number"].partition(".")
    whole = whole.lstrip("0")
    binary, exponent = 0, 0
    if match["exp"]:
        digits = match["exp"][1:].lstrip("+-").lstrip("0")
        if len(digits) > len(str(_MAX_EXPONENT)) or int(digits or 0) > _MAX_EXPONENT:
            raise QuantityError(f"the exponent of {_shown(value)} is beyond ±{_MAX_EXPONENT}")
        exponent = -int(digits or 0) if match["exp"][1] == "-" else int(digits or 0)
    elif (suffix := match["suffix"] or "") in _BINARY_SUFFIXES:
        binary = _BINARY_SUFFIXES[suffix]
    else:
        exponent = _DECIMAL_EXPONENTS[suffix]
    # Digits before the point once scaled: 10^(that - 1) <= value, so more
    # than MAX_AMOUNT's 19 is out of range, whatever a binary suffix adds.
    leading = len(whole) if whole else len(fraction.lstrip("0")) - len(fraction)
    if leading + exponent > len(str(MAX_AMOUNT)):
        raise QuantityError(
            f"{_shown(value)} exceeds {MAX_AMOUNT}, the largest quantity Kubernetes counts"
        )
    # Fraction digits finer than nano (after the exponent, with room for a
    # binary suffix's factor) only round the value up.
    keep = max(0, _NANO + exponent + (19 if binary else 0))
    kept, dropped = fraction[:keep], fraction[keep:].strip("0")
    mantissa = int((whole + kept) or "0") + (1 if dropped else 0)
    result = Fraction(mantissa) * (binary or 1) * Fraction(10) ** (exponent - len(kept))
    if result.denominator > 10**_NANO or 10**_NANO % result.denominator:
        result = Fraction(math.ceil(result * 10**_NANO), 10**_NANO)
    result = -result if match["sign"] == "-" else result
    return _bounded(result, value)


def _shown(value: object) -> str:
    """The offending value for a message, cut short: a quantity's text may
    be as long as the body."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bounded(quantity: Fraction, text: object) -> Fraction:
    if abs(quantity) > MAX_AMOUNT:
        raise QuantityError(
            f"{_shown(text)} exceeds {MAX_AMOUNT}, the largest quantity Kubernetes counts"
        )
    return quantity


def canonical_amount(resource: str, value: str | int | float) -> int:
    """The integer amount of ``resource`` in its canonical unit, rounded up;
    at most :data:`MAX_AMOUNT` (cpu in milli-cores: Kubernetes' MilliValue)."""
    quantity = parse_quantity(value)
    if resource in MILLI_RESOURCES:
        quantity *= 1000
    amount = math.ceil(quantity)
    if abs(amount) > MAX_AMOUNT:
        raise QuantityError(
            f"{_shown(value)} is {amount} in {resource}'s unit, beyond {MAX_AMOUNT}, "
            "the largest amount Kubernetes counts"
        )
    return amount


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
