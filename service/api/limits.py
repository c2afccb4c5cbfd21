"""Limits on what a request body may make the API build: nesting depth,
integers, items of a bulk body, and YAML aliases.

A body that passes these is one every later step can hold: pydantic and
orjson serialise at most about 255 levels, and the ledger's canonical JSON
(RFC 8785) no integer beyond 2^53-1. Checked before a submission is batched
with others', so that one tenant's body can only fail its own request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml
from yaml.composer import ComposerError

from service.domain.quantity import MAX_SAFE_INTEGER

#: Bodies larger than this have their bulk items counted from their bytes
#: before they are parsed (a 60 MB body's document took 410 MB); smaller
#: ones are counted once parsed, which costs less than the count.
SHAPE_CHECK_BYTES = 4 << 20

#: YAML is parsed in Python, about a thousand times slower than JSON: a
#: YAML body is at most this large, bulk or not.
MAX_YAML_BYTES = 1 << 20

#: Deepest nesting of objects and arrays in a body. A JobSet's pod template
#: inside a Workload is about 20 levels deep; serialisers give up at ~255.
MAX_DEPTH = 64

#: Nodes that YAML aliases may add beyond the document's own, plus as many
#: as it has: an alias is a reference, but the JSON it becomes is a copy
#: (a 599-byte "billion laughs" document became gigabytes).
ALIAS_ALLOWANCE = 10_000

# -- after parsing -----------------------------------------------------------------------

_DIGIT_RUN = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(".") for b in range(256))
#: 2^53-1 has 16 digits: a body without a run of 16 is known to be within it.
_SAFE_DIGITS = b"0" * len(str(MAX_SAFE_INTEGER))


def may_exceed(raw: bytes) -> bool:
    """Whether ``raw`` might nest deeper than MAX_DEPTH or hold an integer
    beyond 2^53-1: the walk of :func:`document_problem` is then needed
    (one submission has about a dozen brackets and no long number)."""
    brackets = raw.count(b"{") + raw.count(b"[")
    return brackets > MAX_DEPTH or _SAFE_DIGITS in raw.translate(_DIGIT_RUN)


def document_problem(document: Any) -> tuple[str, str] | None:
    """The first (field, message) of a parsed body nested deeper than
    MAX_DEPTH or holding an integer beyond ±(2^53-1); None if none. A bare
    scalar body has nothing inside: the request's schema refuses it."""
    if type(document) is not dict and type(document) is not list:
        return None
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        for item in value.values() if type(value) is dict else value:
            kind = type(item)
            if kind is dict or kind is list:
                if depth >= MAX_DEPTH:
                    return _locate(document), f"nested deeper than {MAX_DEPTH} levels"
                stack.append((item, depth + 1))
            elif kind is int and not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                return _locate(document), f"integers are at most ±{MAX_SAFE_INTEGER} (2^53-1)"
    return None


def _locate(document: Any) -> str:
    """The path of the first value :func:`document_problem` refuses (found
    again with paths: building them on the way costs every good body)."""
    for path, _ in _offending(document, "", 1):
        return path
    return ""


def _offending(value: Any, path: str, depth: int) -> Iterator[tuple[str, Any]]:
    pairs = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in pairs:
        child = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        if isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                yield child, item
                return
            yield from _offending(item, child, depth + 1)
        elif type(item) is int and not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
            yield child, item


# -- before parsing: a bulk body's items ------------------------------------------------

#: What stays of a body for its shape: brackets, commas and quotes.
_NOT_SHAPE = bytes(b for b in range(256) if b not in b'{}[],"')
_OPEN, _CLOSE, _COMMA, _QUOTE = frozenset(b"[{"), frozenset(b"]}"), ord(","), ord('"')


def bulk_shape(raw: bytes, max_items: int) -> tuple[int, int]:
    """(depth, items) of a JSON body read from its bytes, without building
    the document (nor a Python object per token): its depth up to
    MAX_DEPTH + 1, and how many elements the arrays directly inside its
    top-level object hold (a bulk body's ``items``), up to ``max_items`` + 1;
    the scan stops at either bound. An array of one scalar counts 0.

    Escapes go first, so that every quote left delimits a string; then all
    but brackets, commas and quotes; then adjacent quote pairs, which never
    changes whether what remains is inside a string (most strings hold no
    bracket or comma, and vanish). One pass counts what is left. Malformed
    JSON gives some figures; the parser refuses it afterwards."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = unescaped.translate(None, _NOT_SHAPE).replace(b'""', b"")
    in_items = shape.startswith(b"{")
    depth = deepest = items = 0
    in_string = counting = False
    previous = 0
    for char in shape:
        if char == _QUOTE:
            in_string = not in_string
            continue
        if in_string:
            continue
        if char in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                break
            if depth == 2:
                counting = in_items and char == ord("[")
        elif char in _CLOSE:
            if depth == 2 and counting and previous not in _OPEN:
                items += 1  # the last element (or the only one) of the array
            depth -= 1
        elif char == _COMMA and depth == 2 and counting:
            items += 1
            if items > max_items:
                break
        previous = char
    return deepest, items


# -- YAML ------------------------------------------------------------------------------


class YamlLimitExceeded(ComposerError):
    """A YAML document beyond our depth or alias limits (a YAMLError, so it
    is answered as malformed YAML, with its position)."""


def _refused(problem: str, event: Any) -> YamlLimitExceeded:
    return YamlLimitExceeded(None, None, problem, event.start_mark)


class _LimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting as it composes: nesting depth, nodes,
    and the nodes each anchor stands for, so that aliases can add at most
    the document's own size again plus ALIAS_ALLOWANCE; an alias to an
    anchor still open (a recursive document) is refused."""

    def __init__(self, stream: bytes) -> None:
        super().__init__(stream)
        self._depth = 0
        self._literal = 0
        self._expanded = 0
        self._sizes: dict[str, int] = {}
        self._open: set[str] = set()

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]  # untyped library
        if isinstance(event, yaml.AliasEvent):
            anchor = str(event.anchor)
            if anchor in self._open:
                raise _refused("a recursive alias", event)
            self._expanded += self._sizes.get(anchor, 1)
            if self._expanded > 2 * self._literal + ALIAS_ALLOWANCE:
                raise _refused("aliases expand to too many nodes", event)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refused(f"nested deeper than {MAX_DEPTH} levels", event)
        opened: str | None = getattr(event, "anchor", None)
        before = self._expanded
        self._literal += 1
        self._expanded += 1
        if opened is not None:
            self._open.add(opened)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if opened is not None:
                self._open.discard(opened)
                self._sizes[opened] = self._expanded - before


def load_yaml(raw: bytes) -> Any:
    """One YAML document, as ``yaml.safe_load`` reads it, within our limits;
    a yaml.YAMLError otherwise."""
    loader = _LimitedLoader(raw)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
