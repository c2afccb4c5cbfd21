from fractions import Fraction

import pytest

from service.domain.quantity import (
    QuantityError,
    canonical_amount,
    canonical_resources,
    format_amount,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("1Ki", Fraction(1024)),
        ("1Ti", Fraction(2**40)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("2k", Fraction(2000)),
        ("1M", Fraction(10**6)),
        ("2e3", Fraction(2000)),
        ("1E", Fraction(10**18)),
        ("-1", Fraction(-1)),
        ("+3", Fraction(3)),
        (".5", Fraction(1, 2)),
        ("250u", Fraction(1, 4000)),
        (8, Fraction(8)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity(text: str | int | float, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1Kb", "1.2.3", "Mi", "1 Gi", "nan"])
def test_parse_quantity_rejects_garbage(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_parse_quantity_rejects_bool() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)


def test_cpu_is_counted_in_millicores_and_the_rest_in_units() -> None:
    assert canonical_amount("cpu", "500m") == 500
    assert canonical_amount("cpu", 96) == 96_000
    assert canonical_amount("memory", "1Ti") == 2**40
    assert canonical_amount("nvidia.com/gpu", "8") == 8


def test_fractions_round_up_never_under_count() -> None:
    assert canonical_amount("cpu", "1n") == 1
    assert canonical_amount("memory", "0.5") == 1
    assert canonical_amount("pods", "1500m") == 2


def test_canonical_resources_and_format_round_trip() -> None:
    amounts = canonical_resources({"cpu": "1500m", "memory": "512Gi", "nvidia.com/gpu": 8})
    assert amounts == {"cpu": 1500, "memory": 512 * 2**30, "nvidia.com/gpu": 8}
    rendered = {r: format_amount(r, a) for r, a in amounts.items()}
    assert rendered == {"cpu": "1500m", "memory": "512Gi", "nvidia.com/gpu": "8"}
    assert canonical_resources(rendered) == amounts
    assert format_amount("cpu", 96_000) == "96"
