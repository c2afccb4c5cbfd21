"""Resource quantities as a real API server writes them: canonical strings.

A built-in object's quantity is decoded into ``resource.Quantity`` and encoded
back in canonical form, so ``1`` is served as ``"1"``, ``0.5`` as ``"500m"``,
``1024Mi`` as ``"1Gi"`` and ``2000`` as ``"2k"``; the format (decimal SI, binary
SI, exponent) of the input is kept. Controllers format their own amounts as
Kueue's ``resources.ResourceQuantity`` does (cpu in milli, memory binary).

Source: k8s.io/apimachinery/pkg/api/resource/quantity.go (``ParseQuantity``,
``CanonicalizeBytes``) and kueue ``pkg/resources``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

__all__ = [
    "FORMAT_ERROR",
    "QuantityFormatError",
    "canonical",
    "canonical_list",
    "resource_quantity",
]

#: The message of ``resource.ErrFormatWrong``, which a decode error carries.
FORMAT_ERROR = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)

_DECIMAL = "DecimalSI"
_BINARY = "BinarySI"
_EXPONENT = "DecimalExponent"
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?))$"
)
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_EXPONENTS |= {"P": 15, "E": 18}
_DECIMAL_SUFFIXES = {exponent: suffix for suffix, exponent in _DECIMAL_EXPONENTS.items()}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_NANO = 10**9


class QuantityFormatError(ValueError):
    """Not a quantity: the real server refuses the object with 400 at decode."""


def canonical(value: Any) -> str:
    """The string the API server serves for ``value`` (a JSON string or number)."""
    amount, form = _parse(value)
    return _render(amount, form)


def canonical_list(values: Any) -> Any:
    """A ``ResourceList`` (name → quantity) with every quantity canonical."""
    if not isinstance(values, Mapping):
        return values
    return {name: canonical(value) for name, value in values.items()}


def resource_quantity(resource: str, amount: int) -> str:
    """An amount in Kueue's canonical unit (milli-cpu, bytes, units) as Kueue writes it."""
    if resource == "cpu":
        return _render(Fraction(amount, 1000), _DECIMAL)
    binary = resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-")
    return _render(Fraction(amount), _BINARY if binary else _DECIMAL)


def _parse(value: Any) -> tuple[Fraction, str]:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityFormatError(FORMAT_ERROR)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityFormatError(FORMAT_ERROR)
        value = repr(value)
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise QuantityFormatError(FORMAT_ERROR)
    number = Fraction(match["number"])
    if match["exp"]:
        amount, form = number * Fraction(10) ** int(match["exp"][1:]), _EXPONENT
    elif match["suffix"] in _BINARY_SUFFIXES[1:]:
        amount, form = number * 1024 ** _BINARY_SUFFIXES.index(match["suffix"]), _BINARY
    else:
        amount, form = number * Fraction(10) ** _DECIMAL_EXPONENTS[match["suffix"]], _DECIMAL
    # Non-zero amounts below a nano are rounded up (away from zero), never to zero.
    nanos = amount * _NANO
    if nanos.denominator != 1:
        amount = Fraction(math.ceil(nanos), _NANO)
    return (-amount if match["sign"] == "-" else amount), form


def _render(amount: Fraction, form: str) -> str:
    if amount == 0:
        return "0"
    sign, magnitude = ("-" if amount < 0 else ""), abs(amount)
    if form == _BINARY and magnitude >= 1024 and magnitude.denominator == 1:
        mantissa, power = int(magnitude), 0
        while mantissa % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            mantissa, power = mantissa // 1024, power + 1
        return f"{sign}{mantissa}{_BINARY_SUFFIXES[power]}"
    if form == _BINARY:  # below 1024 or fractional: shown in decimal, losing nothing
        form = _DECIMAL
    mantissa, exponent = math.ceil(magnitude * _NANO), -9
    while mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    while exponent % 3:
        mantissa, exponent = mantissa * 10, exponent - 1
    if form == _DECIMAL and exponent in _DECIMAL_SUFFIXES:
        return f"{sign}{mantissa}{_DECIMAL_SUFFIXES[exponent]}"
    return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
