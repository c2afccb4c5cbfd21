"""tests/ordering.py: each worksteal share starts with its part of the long tests."""

from __future__ import annotations

from tests.ordering import spread


def test_each_share_is_led_by_its_long_modules_and_nothing_is_lost() -> None:
    keys = ["m/a", "m/a", "m/b", "m/c", *(f"m/x{i}" for i in range(8))]
    items = [f"{key}#{i}" for i, key in enumerate(keys)]
    ordered = spread(items, keys, 2, long={"m/a": 3, "m/b": 2, "m/c": 1.5})
    assert sorted(ordered) == sorted(items)
    # Worksteal hands the first process the first six, the second the rest.
    assert ordered[:2] == ["m/a#0", "m/a#1"]
    assert ordered[6:8] == ["m/b#2", "m/c#3"]
    assert not any(item.startswith(("m/a", "m/b", "m/c")) for item in ordered[2:6] + ordered[8:])


def test_a_test_named_alone_goes_to_its_own_share() -> None:
    keys = ["fuzz::t[1]", "fuzz::t[2]", "other", "other", "other", "other"]
    items = ["t1", "t2", "o1", "o2", "o3", "o4"]
    ordered = spread(items, keys, 2, long={"fuzz::t[1]": 2, "fuzz::t[2]": 2})
    assert {ordered[0], ordered[3]} == {"t1", "t2"}


def test_one_process_keeps_the_collection_order() -> None:
    items = ["a", "b", "c"]
    assert spread(items, ["x", "y", "x"], 1, long={"y": 9}) == items
