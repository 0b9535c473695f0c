"""Correlation basis of a surface record, typed and never silent.

Invariant: an absent trace carrier, a malformed one and a valid one are three
different facts and produce three different records. Only a valid W3C
``traceparent`` is retained, verbatim; a malformed carrier is retained only as
the fact "malformed", never as bytes. ``tracestate`` and ``baggage`` are never
read: their values are free-form and may carry data redaction cannot reason
about.

Theory of operation (evidence-formats.md §1.7): the carrier is
``params._meta.traceparent`` of the ``tools/call`` params (not ``arguments``).
No ``_meta`` object or no ``traceparent`` key: no carrier. A present value that
is not a JSON string (null included) is extracted as ``""``, which fails
validation and so lands in ``malformed_trace_context``.
"""

from __future__ import annotations

import re
from typing import Any, Final

from drawbridge.evidence import vocabulary as v

_LOWER_HEX = {n: re.compile(f"[0-9a-f]{{{n}}}", re.ASCII) for n in (2, 16, 32)}


def traceparent_from_params(params: Any) -> str | None:
    """The carrier: None when absent, ``""`` when present but not a string."""
    if not isinstance(params, dict):
        return None
    meta = params.get("_meta")
    if not isinstance(meta, dict) or "traceparent" not in meta:
        return None
    carrier = meta["traceparent"]
    return carrier if isinstance(carrier, str) else ""


def _hex(part: str, length: int) -> bool:
    return _LOWER_HEX[length].fullmatch(part) is not None


def is_valid_traceparent(value: str) -> bool:
    """``version-traceid-parentid-flags``: lowercase hex of lengths 2/32/16/2,
    version not ``ff``, trace-id and parent-id not all zero."""
    parts = value.split("-")
    if len(parts) != 4:
        return False
    version, trace_id, parent_id, flags = parts
    return (
        _hex(version, 2)
        and version != "ff"
        and _hex(trace_id, 32)
        and _hex(parent_id, 16)
        and _hex(flags, 2)
        and trace_id.strip("0") != ""
        and parent_id.strip("0") != ""
    )


_MALFORMED: Final = {"basis": v.BASIS_MALFORMED, "traceparent": None, "source_class": None}
_NONE: Final = {"basis": v.BASIS_NONE, "traceparent": None, "source_class": None}


def correlation(traceparent: str | None) -> dict[str, Any]:
    """The ``correlation`` object (a fresh dict) for an extracted carrier."""
    if traceparent is None:
        return dict(_NONE)
    if is_valid_traceparent(traceparent):
        return {
            "basis": v.BASIS_PROPAGATED,
            "traceparent": traceparent,
            "source_class": v.SOURCE_CLASS_PROPAGATED,
        }
    return dict(_MALFORMED)


def correlation_from_params(params: Any) -> dict[str, Any]:
    return correlation(traceparent_from_params(params))
