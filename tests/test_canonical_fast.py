"""The C-encoder fast path of canonical JSON writes exactly the bytes of the rfc8785 library route.

The reference is ``library_canonical_bytes`` (integers beyond 2**53 as doubles, then the pure-Python
``rfc8785`` library); ``canonical_bytes`` must equal it byte for byte, or raise the same error, for
every value: the shapes the fast path takes and the ones it must hand back.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from conftest import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from drawbridge.canonical import CanonicalizationError, canonical_bytes, parse_json
from drawbridge.canonical.jcs import _fast_bytes, library_canonical_bytes

VECTORS = json.loads((Path(__file__).parent / "vectors" / "rfc8785-vectors.json").read_text(encoding="utf-8"))
CASES = {name: case for name, case in VECTORS.items() if not name.startswith("_")}


def _outcome(function: Any, value: Any) -> tuple[str, Any]:
    try:
        return ("bytes", function(value))
    except (CanonicalizationError, UnicodeEncodeError) as exc:  # the library's own errors, as they were
        return ("error", type(exc))


def _same_as_library(value: Any) -> None:
    assert _outcome(canonical_bytes, value) == _outcome(library_canonical_bytes, value)


# Keys and strings that reach every escaping and ordering rule: controls, quote, backslash, DEL,
# the BMP's private-use area (orders differently from astral characters in UTF-16), astral
# characters, and lone surrogates (not encodable as UTF-8).
special_chars = st.sampled_from(
    ["\x00", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1f", '"', "\\", "/", "\x7f", "\x80", "\u2028",
     "\ue000", "\uffff", "\U00010000", "\U0001f600", "\ud800", "\udfff", "é", "a", "Z", "0", " "]
)
texts = st.one_of(st.text(max_size=12), st.lists(special_chars, max_size=6).map("".join))
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-4, 1e-5, 1e-6, 1e-7, 1e15, 1e16, 1e20, 1e21, 1e22,
                     2.0**53, 2.0**53 - 1, -(2.0**53), 123.456, 0.1 + 0.2, 5e-324, 1.7976931348623157e308]),
    st.integers(min_value=-(2**60), max_value=2**60).map(float),
)
integers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**53 - 1, 2**53, 2**53 + 1, -(2**53) + 1, -(2**53), 2**64 - 1, 10**400]),
)
scalars = st.one_of(st.none(), st.booleans(), integers, floats, texts)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(texts, children, max_size=5),
    ),
    max_leaves=30,
)


@settings(max_examples=examples(500), deadline=None)
@given(json_values)
@example({"\u00e9": 1, "z": 2, "\U00010000": 3, "\ue000": 4})
@example({"a": [1.0, -0.0, 2.5, 1e-7, 1e21, 2**53 + 1]})
@example({"x": "\ud800"})
def test_fast_path_equals_the_library_route(value: Any) -> None:
    _same_as_library(value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_path_on_the_rfc8785_corpus(name: str) -> None:
    value = parse_json(CASES[name]["input"])
    assert canonical_bytes(value) == library_canonical_bytes(value)
    assert canonical_bytes(value).decode("utf-8") == CASES[name]["expected"]


def test_the_fast_path_is_taken_for_the_evidence_shape() -> None:
    # What a trace body looks like: ASCII keys, strings, small ints, rounded floats, nulls.
    body = {"agent": "bench", "tool": "echo", "rule_index": 0, "decision_ms": 0.052, "latency_ms": 0.413,
            "error": None, "ok": True, "nested": [{"k": "v\n\u00e9"}], "whole": 3.0}
    fast = _fast_bytes(body)
    assert fast is not None
    # Independent check: the expected JCS text written by hand (keys sorted, 3.0 -> 3).
    assert fast == (
        '{"agent":"bench","decision_ms":0.052,"error":null,"latency_ms":0.413,"nested":[{"k":"v\\n\u00e9"}],'
        '"ok":true,"rule_index":0,"tool":"echo","whole":3}'
    ).encode("utf-8")
    assert fast == rfc8785.dumps(body)


@pytest.mark.parametrize(
    "value",
    [
        1e-7,  # exponent form
        1e21,
        2**53,  # beyond the safe integers: rendered as a double by the library route
        {"\U00010000": 1},  # a key beyond the BMP: UTF-16 order differs
        {1: "x"},  # not a string key
        "\ud800",  # not encodable
        math.nan,
        [float("inf")],
    ],
)
def test_shapes_the_fast_path_hands_to_the_library(value: Any) -> None:
    assert _fast_bytes(value) is None
    _same_as_library(value)


def test_non_plain_types_take_the_library_route() -> None:
    from collections import OrderedDict
    from enum import StrEnum
    from types import MappingProxyType

    class Colour(StrEnum):
        RED = "red"

    for value in (OrderedDict(b=1, a=2), MappingProxyType({"a": 1}), Colour.RED, {"c": Colour.RED}, {1, 2}):
        assert _fast_bytes(value) is None
        _same_as_library(value)


def test_deep_nesting_behaves_as_before() -> None:
    deep: Any = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    assert _fast_bytes(deep) is None
    with pytest.raises(RecursionError):
        library_canonical_bytes(deep)
    with pytest.raises(RecursionError):
        canonical_bytes(deep)


@settings(max_examples=examples(700))
@given(
    value=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),  # NaN and infinities included: no canonical form either way
        st.floats(min_value=-1e-3, max_value=1e-3),  # exponent forms below 1e-6
        st.floats(min_value=1e15, max_value=1e25),  # integral doubles beyond 2**53, exponent forms
        st.text(st.characters(blacklist_categories=())),  # control characters, lone surrogates
    )
)
@example(value=1e-7)
@example(value=2.0**53 + 2)
@example(value=-0.0)
def test_scalar_bytes_writes_what_the_library_route_writes(value: Any) -> None:
    from drawbridge.canonical import scalar_bytes

    assert _outcome(scalar_bytes, value) == _outcome(library_canonical_bytes, value)


@pytest.mark.parametrize("value", [{"\ud800": 1}, {"a": "\udc00"}, ["\ud83d"], "\ud800"])
def test_a_lone_surrogate_anywhere_has_no_canonical_form(value: Any) -> None:
    """Every route says so with the one error its callers catch (a key used to raise UnicodeEncodeError)."""
    from drawbridge.canonical import scalar_bytes
    from drawbridge.evidence.truth.carrier import args_digest

    with pytest.raises(CanonicalizationError):
        canonical_bytes(value)
    with pytest.raises(CanonicalizationError):
        library_canonical_bytes(value)
    if isinstance(value, str):
        with pytest.raises(CanonicalizationError):
            scalar_bytes(value)
    assert args_digest(value, b"k" * 32, "kid") is None  # not computed, never a crash
