"""Compact JSON text through the standard library's C encoder, built once.

``json.JSONEncoder.encode`` builds a new C encoder object for every value it encodes; evidence
lines and canonical forms are encoded several times per tools/call, so that setup is a measurable
share of the gateway's cost. ``compact_encoder`` returns a function that reuses one C encoder
with exactly the arguments ``JSONEncoder.iterencode`` would give it, and so writes exactly the
same text. Where the C encoder is absent or its signature differs (another interpreter), the
function is plain ``JSONEncoder.encode``.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any


def compact_encoder(*, sort_keys: bool, ensure_ascii: bool, allow_nan: bool) -> Callable[[Any], str]:
    """``json.JSONEncoder(separators=(",", ":"), check_circular=False, ...).encode``, faster."""
    fallback = json.JSONEncoder(
        ensure_ascii=ensure_ascii, separators=(",", ":"), sort_keys=sort_keys, allow_nan=allow_nan,
        check_circular=False,
    )
    make = getattr(json.encoder, "c_make_encoder", None)
    string = json.encoder.c_encode_basestring_ascii if ensure_ascii else json.encoder.c_encode_basestring
    if make is None or string is None:
        return fallback.encode
    try:
        c_encoder = make(None, fallback.default, string, None, ":", ",", sort_keys, False, allow_nan)
    except TypeError:
        return fallback.encode

    def encode(value: Any) -> str:
        return "".join(c_encoder(value, 0))

    if encode({"a": [1, 2.5, None, True, "é"]}) != fallback.encode({"a": [1, 2.5, None, True, "é"]}):
        return fallback.encode
    return encode


__all__ = ["compact_encoder"]
