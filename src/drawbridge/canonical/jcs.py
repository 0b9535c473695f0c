"""RFC 8785 (JCS) canonical JSON, byte-compatible with Assay's canonicalizer.

Invariant: every digest in drawbridge is computed over the bytes this module
returns, and over nothing else. Text is canonicalized only when it is I-JSON
(RFC 8785 section 3): an object that gives a key twice is refused, never
resolved to its first or last value.

Theory of operation. The `rfc8785` library implements the RFC (UTF-16 key
order, ECMAScript number rendering, minimal string escaping) but refuses
integers outside the I-JSON range (|n| > 2**53 - 1). Assay's canonicalizer
instead renders every number as an IEEE-754 double, so ``9007199254740993``
becomes ``9007199254740992`` and ``2**64 - 1`` becomes
``18446744073709552000``. For byte compatibility (evidence-formats.md §0.1) we
convert such integers to floats before handing the value to the library; the
library's ECMAScript formatter then produces Assay's bytes. Booleans are
``int`` subclasses in Python and are left alone.

Fast path. The library is pure Python; the evidence of every call goes through
here several times. For the common shape of a value -- plain ``dict``/``list``
with ASCII-only (or BMP-only) keys, strings, booleans, null, integers within
2**53 and floats whose shortest form has no exponent -- the standard library's
C encoder (``sort_keys``, compact separators, no ASCII escaping) writes the
same bytes, for these reasons, each one a rule of the library we fall back to:

* keys: UTF-16 code-unit order equals code-point order when no key holds a
  character beyond U+FFFF, and the C encoder sorts by code point;
* strings: both escape exactly ``"``, ``\\`` and U+0000..U+001F (``\\b \\t \\n
  \\f \\r`` short, the rest as lowercase ``\\u00xx``) and write everything else
  as UTF-8; a lone surrogate cannot be encoded, and then the library decides;
* integers within 2**53 - 1 are their decimal digits in both;
* a float with an integral value below 2**53 is written as that integer (JCS
  drops ``.0``), and any other finite float whose ``repr`` has no exponent is
  its ``repr`` in both (the library formats ``repr`` and only rewrites ``.0``
  and exponents).

Anything else (a float with an exponent form, a large integer, a key beyond the
BMP, a non-plain type, NaN) takes the library route, so the fast path can never
change a byte; ``tests/test_canonical.py`` checks the two routes against each
other on generated values and on the RFC 8785 corpus.
"""

from __future__ import annotations

import json
import math
from typing import Any

import rfc8785

from drawbridge.canonical.encoders import compact_encoder

_SAFE = 2**53 - 1
_fast_encode = compact_encoder(sort_keys=True, ensure_ascii=False, allow_nan=False)
_json_string = json.encoder.encode_basestring
"""A string as the C encoder writes it with ``ensure_ascii=False``: JCS's escapes exactly."""


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


class _NotPlain(Exception):
    """The value needs the library route (see the module docstring)."""


_NOT_PLAIN = _NotPlain()
_MAX_BMP = "\uffff"


def _scan(value: Any) -> bool:
    """True: the C encoder renders ``value`` as JCS as it is. False: only after ``_convert`` (a float
    with an integral value is somewhere in it). Raises ``_NotPlain`` when the library must do it."""
    kind = type(value)
    if kind is dict:
        as_is = True
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or max(key) <= _MAX_BMP):
                raise _NOT_PLAIN
            item_kind = type(item)
            if item_kind is str or item is None or item_kind is bool:
                continue
            if item_kind is int:
                if -_SAFE <= item <= _SAFE:
                    continue
                raise _NOT_PLAIN
            if not _scan(item):
                as_is = False
        return as_is
    if kind is str or value is None or kind is bool:
        return True
    if kind is int:
        if -_SAFE <= value <= _SAFE:
            return True
        raise _NOT_PLAIN
    if kind is list or kind is tuple:
        as_is = True
        for item in value:
            if not _scan(item):
                as_is = False
        return as_is
    if kind is float:
        if value.is_integer():
            if -_SAFE <= value <= _SAFE:
                return False  # written as the integer (JCS drops ".0")
            raise _NOT_PLAIN
        if math.isfinite(value) and "e" not in repr(value):
            return True
    raise _NOT_PLAIN


def _convert(value: Any) -> Any:
    """A copy of a value ``_scan`` accepted, with integral floats as integers."""
    kind = type(value)
    if kind is dict:
        return {key: _convert(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [_convert(item) for item in value]
    if kind is float and value.is_integer():
        return int(value)
    return value


def _fast_bytes(value: Any) -> bytes | None:
    """The JCS bytes through the C encoder, or None when the value needs the library route."""
    try:
        if not _scan(value):
            value = _convert(value)
        return _fast_encode(value).encode("utf-8")
    except (_NotPlain, UnicodeEncodeError, RecursionError):
        return None


def canonical_bytes(value: Any) -> bytes:
    """The JCS bytes of a parsed JSON value."""
    fast = _fast_bytes(value)
    if fast is not None:
        return fast
    return library_canonical_bytes(value)


def library_canonical_bytes(value: Any) -> bytes:
    """The JCS bytes through the ``rfc8785`` library alone (the reference for the fast path)."""
    try:
        return rfc8785.dumps(_as_doubles(value))
    except rfc8785.CanonicalizationError as exc:  # NaN, infinity, bad types
        raise CanonicalizationError(str(exc)) from exc
    except OverflowError as exc:  # an integer too large even for a double
        raise CanonicalizationError("number out of range for an IEEE-754 double") from exc
    except UnicodeError as exc:  # the library sorts keys by their UTF-16 form, which a lone surrogate lacks
        raise CanonicalizationError("a string holds a lone surrogate, which is not Unicode text") from exc


class Canonical(bytes):
    """Bytes that already are the JCS form of a JSON value. Whoever makes one vouches for it: a
    writer that renders a shape of its own faster than the general route (its tests compare the
    two); a reader takes them as they are instead of canonicalizing again."""

    __slots__ = ()


def scalar_bytes(value: str | int | float | bool | None) -> bytes:
    """The JCS bytes of a scalar: ``canonical_bytes(value)``, by a shorter route where one applies."""
    kind = type(value)
    if kind is str:
        try:
            return _json_string(value).encode("utf-8")  # type: ignore[arg-type]
        except UnicodeEncodeError:  # a lone surrogate
            return canonical_bytes(value)
    if value is None:
        return b"null"
    if kind is bool:
        return b"true" if value else b"false"
    if kind is int:
        if -_SAFE <= value <= _SAFE:  # type: ignore[operator]
            return str(value).encode("ascii")
    elif kind is float:
        if value.is_integer():  # type: ignore[union-attr]
            if -_SAFE <= value <= _SAFE:  # type: ignore[operator]
                return str(int(value)).encode("ascii")  # type: ignore[arg-type]
        elif math.isfinite(value):  # type: ignore[arg-type]
            text = repr(value)
            if "e" not in text:
                return text.encode("ascii")
    return canonical_bytes(value)


def canonical_text(value: Any) -> str:
    """The JCS string of a parsed JSON value."""
    return canonical_bytes(value).decode("utf-8")


class DuplicateKeyError(CanonicalizationError):
    """An object gives a key twice: readers that keep the first and readers that keep the last read it
    two ways. ``key`` is the key (a caller decides how much of it a message may show; this message
    shows it JSON-escaped and cut, so no control character reaches a terminal)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {shown_key(key)} is given twice in one object")
        self.key = key


def shown_key(key: str) -> str:
    """A key as a message may show it: JSON-escaped (no control character or lone surrogate reaches a
    terminal), and cut."""
    text = json.dumps(key[:40])
    return text if len(key) <= 40 else text[:-1] + '..."'


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` that refuses a key given twice (``DuplicateKeyError``)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise CanonicalizationError(f"{name} is not JSON")


_STRICT_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_UNIQUE_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=unique_object)


def parse_json(text: str | bytes, *, unique_keys: bool = False) -> Any:
    """Parse JSON text strictly: NaN/Infinity literals are refused, as in Rust serde_json.

    ``unique_keys`` also refuses an object that gives a key twice (``DuplicateKeyError``), as I-JSON
    (RFC 7493) does: without it the last value wins, as in serde_json. Evidence a verifier is handed
    and input to RFC 8785 use it, so that a document cannot mean one thing here and another elsewhere.
    """
    decoder = _UNIQUE_DECODER if unique_keys else _STRICT_DECODER
    try:
        # What ``json.loads(text, parse_constant=...)`` does, without building a decoder per call.
        if type(text) is bytes:
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        if type(text) is str and not text.startswith("\ufeff"):
            return decoder.decode(text)
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=decoder.object_pairs_hook)
    except CanonicalizationError:
        raise
    except (ValueError, RecursionError) as exc:
        raise CanonicalizationError(f"invalid JSON: {exc}") from exc


def canonicalize_text(text: str | bytes) -> bytes:
    """JSON source text in, JCS bytes out. RFC 8785 takes I-JSON only: a key given twice is refused."""
    return canonical_bytes(parse_json(text, unique_keys=True))
