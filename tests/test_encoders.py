"""The reused C encoder writes exactly what ``json.JSONEncoder.encode`` writes, for every setting used."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.canonical.encoders import compact_encoder

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)
SETTINGS = [(sort, ascii_, nan) for sort in (True, False) for ascii_ in (True, False) for nan in (True, False)]


def _outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return "ok", encode(value)
    except (ValueError, TypeError) as exc:
        return "error", type(exc).__name__


@pytest.mark.parametrize(("sort_keys", "ensure_ascii", "allow_nan"), SETTINGS)
@settings(max_examples=150, deadline=None)
@given(value=VALUES)
def test_same_text_or_same_refusal_as_the_standard_encoder(
    sort_keys: bool, ensure_ascii: bool, allow_nan: bool, value: Any
) -> None:
    reference = json.JSONEncoder(
        ensure_ascii=ensure_ascii, separators=(",", ":"), sort_keys=sort_keys, allow_nan=allow_nan,
        check_circular=False,
    )
    fast = compact_encoder(sort_keys=sort_keys, ensure_ascii=ensure_ascii, allow_nan=allow_nan)
    assert _outcome(fast, value) == _outcome(reference.encode, value)


def test_the_encoder_is_built_once_and_refuses_what_json_cannot_hold() -> None:
    encode = compact_encoder(sort_keys=True, ensure_ascii=False, allow_nan=False)
    assert encode({"b": 1, "a": [math.pi, None, "é\n"]}) == '{"a":[3.141592653589793,null,"é\\n"],"b":1}'
    with pytest.raises(ValueError):
        encode({"x": math.nan})
    with pytest.raises(TypeError):
        encode({"x": object()})
