"""RFC 8785 (JCS) canonical JSON, byte-compatible with Assay's canonicalizer.

Invariant: every digest in drawbridge is computed over the bytes this module
returns, and over nothing else.

Theory of operation. The `rfc8785` library implements the RFC (UTF-16 key
order, ECMAScript number rendering, minimal string escaping) but refuses
integers outside the I-JSON range (|n| > 2**53 - 1). Assay's canonicalizer
instead renders every number as an IEEE-754 double, so ``9007199254740993``
becomes ``9007199254740992`` and ``2**64 - 1`` becomes
``18446744073709552000``. For byte compatibility (evidence-formats.md 0.1) we
convert such integers to floats before handing the value to the library; the
library's ECMAScript formatter then produces Assay's bytes. Booleans are
``int`` subclasses in Python and are left alone.
"""

from __future__ import annotations

import json
from typing import Any

import rfc8785

_SAFE = 2**53 - 1


class CanonicalizationError(ValueError):
    """A value has no canonical form (NaN, infinity, a non-JSON type)."""


def _as_doubles(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return float(value) if (value > _SAFE or value < -_SAFE) else value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalizationError(f"object key is not a string: {type(key).__name__}")
            out[key] = _as_doubles(item)
        return out
    if isinstance(value, (list, tuple)):
        return [_as_doubles(item) for item in value]
    raise CanonicalizationError(f"not a JSON value: {type(value).__name__}")


def canonical_bytes(value: Any) -> bytes:
    """The JCS bytes of a parsed JSON value."""
    try:
        return rfc8785.dumps(_as_doubles(value))
    except rfc8785.CanonicalizationError as exc:  # NaN, infinity, bad types
        raise CanonicalizationError(str(exc)) from exc
    except OverflowError as exc:  # an integer too large even for a double
        raise CanonicalizationError("number out of range for an IEEE-754 double") from exc


def canonical_text(value: Any) -> str:
    """The JCS string of a parsed JSON value."""
    return canonical_bytes(value).decode("utf-8")


def _reject_constant(name: str) -> Any:
    raise CanonicalizationError(f"{name} is not JSON")


def parse_json(text: str | bytes) -> Any:
    """Parse JSON text strictly: NaN/Infinity literals are refused, as in Rust serde_json."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except CanonicalizationError:
        raise
    except (ValueError, RecursionError) as exc:
        raise CanonicalizationError(f"invalid JSON: {exc}") from exc


def canonicalize_text(text: str | bytes) -> bytes:
    """JSON source text in, JCS bytes out."""
    return canonical_bytes(parse_json(text))
