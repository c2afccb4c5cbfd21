"""The stand-in (and the workers) read and write JSON with orjson where that reads and writes
the same as the standard library, and with the standard library elsewhere."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.jsonio import dumps as _dumps
from service.jsonio import loads as _loads


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "Job", "metadata": {"name": "é"}, "spec": {"n": [1, 2.5, None, True]}},
        {"big": 123456789012345678901234567890},
        {1: "a non-string key"},
    ],
)
def test_answers_encode_as_json_dumps_would(value: Any) -> None:
    assert json.loads(_dumps(value)) == json.loads(json.dumps(value))
    assert b", " not in _dumps(value), "compact, as before"


@pytest.mark.parametrize(
    "body",
    [
        b'{"spec": {"replicas": 3, "x": "\\u00e9"}}',
        b'{"spec": {"big": 123456789012345678901234567890}}',  # exact, not a float
        b'{"spec": {"n": NaN}}',
    ],
)
def test_bodies_decode_as_json_loads_would(body: bytes) -> None:
    assert repr(_loads(body)) == repr(json.loads(body))


def test_a_body_that_is_not_json_is_refused_in_json_loads_words() -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        _loads(b'{"spec": ')
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(b'{"spec": ')
    assert str(caught.value) == str(expected.value)
