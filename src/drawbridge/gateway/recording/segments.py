"""The evidence lines as written, and the cached segments that render them by a shorter route.

Invariant: a trace body or a carrier line joined from segments and a call's
changing values is byte for byte the one the general route renders
(``canonical_bytes`` of the body, ``ndjson_line`` of the minted carrier); what
cannot be cut so is never cut, and takes the general route.

Theory of operation. From call to call a trace body differs only in the four
fields of ``BODY_VARYING``, and a carrier (per tool, verdict and contract) only
in its digests, its order and its call id. The record is rendered once with a
mark (a string no record holds) in place of each changing value and cut where
the marks stand (``body_segments``, ``carrier_segments``); the recorder caches
the segments, and each later call joins them with its own values rendered
alone (``body_join``, ``carrier_join``). A record in which a mark does not
stand exactly once (a field holds its text) is not cut. The carrier's segments
are checked before they are used: the carrier they were cut from, filled in
again from its own values, must give its own line; a line ``ndjson_line``
escapes to ASCII (a lone surrogate) is not cut either.
"""

from __future__ import annotations

import json.encoder
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from drawbridge.canonical import Canonical, CanonicalizationError, canonical_bytes, scalar_bytes
from drawbridge.canonical.encoders import compact_encoder

_line_encode = compact_encoder(sort_keys=False, ensure_ascii=False, allow_nan=True)
_ascii_line_encode = compact_encoder(sort_keys=False, ensure_ascii=True, allow_nan=True)


def ndjson_line(record: Mapping[str, Any]) -> bytes:
    """One compact JSON line in the record's insertion order (evidence-formats.md §0.2: digests are
    always recomputed over JCS, so the line keeps the documented field order for readers)."""
    try:
        return (_line_encode(record) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escape rather than write invalid UTF-8
        return (_ascii_line_encode(record) + "\n").encode("ascii")


BODY_VARYING = ("args_digest", "decision_ms", "evidence", "latency_ms", "request_id")
"""The trace body's fields that change from call to call, in JCS order (``evidence``: the records the
call produced, ``[{"content_hash", "type"}, ...]``)."""
_CARRIER_VARYING = ("args_digest", "order", "call_id", "observed_input_digest")
"""The carrier's fields that change from call to call, in line order (the observed input digest is
written again inside ``decision_identity``)."""
_line_string = json.encoder.encode_basestring
"""A string as ``ndjson_line`` and the JCS route write it (JSON escapes, UTF-8 kept)."""


def _marks(count: int) -> list[str]:
    """Strings no record holds, to stand where the changing values go while the rest is rendered."""
    return [f"\x00{secrets.token_hex(8)}-{index}\x00" for index in range(count)]


def _cut(rendered: bytes, marks: Sequence[str]) -> tuple[bytes, ...] | None:
    """``rendered`` cut where each of ``marks`` (rendered as JSON strings) stands, in order: the parts
    between which the values complete it; None unless each stands there exactly once."""
    segments: list[bytes] = []
    for mark in marks:
        token = _line_string(mark).encode("ascii")
        before, found, rendered = rendered.partition(token)
        if not found or token in rendered:
            return None
        segments.append(before)
    segments.append(rendered)
    return tuple(segments)


def body_segments(body: Mapping[str, Any]) -> tuple[bytes, ...] | None:
    """The trace body's JCS text cut where its ``BODY_VARYING`` fields go; None when a field holds
    a mark's text."""
    marks = _marks(len(BODY_VARYING))
    return _cut(canonical_bytes({**body, **dict(zip(BODY_VARYING, marks, strict=True))}), marks)


def evidence_bytes(evidence: Sequence[Mapping[str, str]]) -> bytes:
    """The JCS text of a body's ``evidence`` list (content hashes and record types: ASCII, never escaped)."""
    return b"[" + b",".join(
        b'{"content_hash":"%s","type":"%s"}' % (item["content_hash"].encode(), item["type"].encode())
        for item in evidence
    ) + b"]"


def body_join(
    segments: Sequence[bytes],
    varying: tuple[str | None, float | None, Sequence[Mapping[str, str]], float, str | None],
) -> Canonical:
    """A trace body's JCS text from its segments (``body_segments``) and the values of its
    ``BODY_VARYING`` fields."""
    first, after_digest, after_decision, after_evidence, after_latency, last = segments
    digest, decision_ms, evidence, latency_ms, request_id = varying
    return Canonical(b"".join((
        first, scalar_bytes(digest), after_digest, scalar_bytes(decision_ms), after_decision,
        evidence_bytes(evidence), after_evidence, scalar_bytes(latency_ms), after_latency,
        scalar_bytes(request_id), last,
    )))


def carrier_texts(digest: str, order: int, call_id: str, observed: str) -> tuple[bytes, bytes, bytes, bytes]:
    """The changing values of a carrier's line as written (``UnicodeEncodeError`` when the call id
    holds a lone surrogate: that line is escaped to ASCII whole)."""
    return (_line_string(digest).encode(), str(order).encode(), _line_string(call_id).encode("utf-8"),
            _line_string(observed).encode())


def carrier_join(segments: Sequence[bytes], texts: tuple[bytes, bytes, bytes, bytes]) -> bytes:
    """A carrier's line from its segments (``carrier_segments``) and changing values (``carrier_texts``)."""
    first, after_digest, after_order, after_call_id, after_observed, last = segments
    digest, order, call_id, observed = texts
    return b"".join((
        first, digest, after_digest, order, after_order, call_id, after_call_id, observed, after_observed,
        observed, last,
    ))


def carrier_jcs_join(segments: Sequence[bytes], texts: tuple[bytes, bytes, bytes, bytes]) -> bytes:
    """A carrier's JCS text (its content hash's input) from ``carrier_jcs_segments`` and ``carrier_texts``."""
    first, after_digest, after_call_id, after_identity, after_observed, last = segments
    digest, order, call_id, observed = texts
    return b"".join((
        first, digest, after_digest, call_id, after_call_id, observed, after_identity, observed, after_observed,
        order, last,
    ))


def carrier_jcs_segments(carrier: Mapping[str, Any]) -> tuple[bytes, ...] | None:
    """The carrier's JCS text cut where its changing values go (JCS order: args_digest, call_id,
    decision_identity's observed_input_digest, observed_input_digest, order); None when it cannot be
    cut, checked by filling in the carrier's own values."""
    marks = _marks(5)
    shaped = {**carrier, "args_digest": marks[0], "call_id": marks[1], "observed_input_digest": marks[3],
              "order": marks[4]}
    shaped["decision_identity"] = {**shaped["decision_identity"], "observed_input_digest": marks[2]}
    try:
        segments = _cut(canonical_bytes(shaped), marks)
        texts = carrier_texts(*(carrier[name] for name in _CARRIER_VARYING))
    except (UnicodeEncodeError, CanonicalizationError):  # no canonical form (a lone surrogate): not cut
        return None
    try:
        reference = canonical_bytes(dict(carrier))
    except CanonicalizationError:
        return None
    if segments is None or reference != carrier_jcs_join(segments, texts):
        return None
    return segments


def carrier_segments(carrier: Mapping[str, Any]) -> tuple[bytes, ...] | None:
    """The carrier's line cut where its changing values go; None when it cannot be cut (a field the
    line must escape to ASCII), checked by filling in the carrier's own values."""
    marks = _marks(len(_CARRIER_VARYING) + 1)
    shaped = {**carrier, **dict(zip(_CARRIER_VARYING, marks, strict=False))}
    shaped["decision_identity"] = {**shaped["decision_identity"], "observed_input_digest": marks[-1]}
    try:
        segments = _cut((_line_encode(shaped) + "\n").encode("utf-8"), marks)
        texts = carrier_texts(*(carrier[name] for name in _CARRIER_VARYING))
    except UnicodeEncodeError:  # the line (the shaped one, or this carrier's own) is escaped to ASCII
        return None
    if segments is None or ndjson_line(carrier) != carrier_join(segments, texts):
        return None
    return segments


__all__ = [
    "BODY_VARYING",
    "body_join",
    "body_segments",
    "carrier_jcs_join",
    "carrier_jcs_segments",
    "carrier_join",
    "carrier_segments",
    "carrier_texts",
    "evidence_bytes",
    "ndjson_line",
]
