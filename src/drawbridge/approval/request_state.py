"""The sealed ``requestState`` of an approval asked over MCP 2026-07-28 (``InputRequiredResult``).

Invariant: a ``requestState`` is accepted only if this gateway minted it, under
a key it still holds, for exactly this agent, tool and argument digest, and
before its expiry. Every other token -- forged, altered in any byte, minted
under a retired key, issued for another call, expired, or simply not of our
form -- raises a ``RequestStateError`` whose class and ``code`` say which,
and whose message never repeats the token, the key or an argument value.
The spec (peers.md 4.3) says servers MUST treat the echoed state as
attacker-controlled and MUST integrity-protect it; single use is enforced by
the approval engine, which consumes the approval named inside the state
exactly once (``gateway.pipeline.approvals.request_states``). This module is
pure: keys, nonce and time are passed in.

Theory of operation.

* Payload. A JSON object with exactly the fields ``v`` (1), ``purpose``
  (``PURPOSE``), ``kid`` (the sealing key's id, ``key_id``), ``agent``,
  ``tool``, ``args_digest`` (the keyed argument digest the approval queue
  stores), ``approval_id`` (16 hex), ``exp`` (fixed-width RFC 3339 UTC,
  microseconds) and ``nonce`` (drawn by the caller, so two states for the same
  approval differ). It is serialised as RFC 8785 canonical JSON, so one
  payload has one byte form.
* Continuation. Once a person approved a call, the upstream may answer it
  with an ``InputRequiredResult`` of its own; the gateway then hands the agent
  a continuation state (``seal_continuation``: purpose
  ``CONTINUATION_PURPOSE``, the same fields plus ``upstream``, the upstream's
  own ``requestState`` or null) so that the call's own retries run on the
  approval already given, and the upstream gets its state back unchanged.
* Ownership. ``issued_here`` tells a state this gateway sealed (its ``kid``
  names a key of the ring) from one that only looks alike (another gateway's,
  further upstream, which is passed on untouched). It reads the payload
  without verifying it: a state that names our key is then opened, and
  refused if anything in it was altered; a state whose payload cannot be
  read at all is taken as ours, and refused.
* Token. ``dbrs1.`` + base64url(payload bytes) + ``.`` + base64url(tag),
  without padding. The tag is HMAC-SHA256 over the ASCII text before the
  second dot (prefix and encoded payload together), so the version prefix and
  the exact encoding are authenticated too. The payload is signed, not
  encrypted: the client may read who, which tool and which approval it is
  about, all of which it already knows; argument values are never in it.
* Keys. The caller gives one key or a list (rotation ring). The first key
  seals; every key opens. Rotation without refusing live tokens: deploy
  ``[old, new]``, then ``[new, old]``, then ``[new]`` once the longest expiry
  has passed. Each key is at least ``MIN_KEY_BYTES`` long and is never used
  directly: the HMAC key is ``HMAC-SHA256(key, KEY_LABEL)``, so a secret
  shared with another use (argument digests, say) cannot produce a valid
  tag by accident.
* Opening. Checks run in this order, and the first that fails decides the
  error: form (prefix, two parts, canonical base64url, tag length, size) ->
  tag under some key in the ring (``RequestStateForged``) -> payload is
  canonical JSON with exactly the expected fields and types
  (``RequestStateMalformed``) -> agent, tool and argument digest equal those
  of the retried call (``RequestStateMismatch``, naming which) -> ``now`` is
  before ``exp`` (``RequestStateExpired``). The tag is checked before the
  payload is parsed, so no attacker-chosen JSON is read unless we wrote it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from drawbridge.canonical import (
    CanonicalizationError,
    canonical_bytes,
    constant_time_equal,
    is_sha256_digest,
    parse_hmac_digest,
    parse_json,
)

PREFIX: Final = "dbrs1."
"""Version prefix of a drawbridge request state, format 1."""
PURPOSE: Final = "drawbridge.approval.request_state.v1"
CONTINUATION_PURPOSE: Final = "drawbridge.approval.continuation.v1"
KEY_LABEL: Final = b"drawbridge/request_state/v1/hmac-key"
KEY_ID_LABEL: Final = b"drawbridge/request_state/v1/key-id"
MIN_KEY_BYTES: Final = 32
MAX_TOKEN_CHARS: Final = 65536
"""Room for an upstream's own ``requestState`` inside a continuation."""
TAG_BYTES: Final = 32
VERSION: Final = 1
_FIELDS: Final = frozenset({"v", "purpose", "kid", "agent", "tool", "args_digest", "approval_id", "exp", "nonce"})
_FIELDS_OF: Final = {PURPOSE: _FIELDS, CONTINUATION_PURPOSE: _FIELDS | {"upstream"}}
_APPROVAL_ID_RE: Final = re.compile(r"[0-9a-f]{16}")
_NONCE_RE: Final = re.compile(r"[A-Za-z0-9_-]{16,128}")
_TIME_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
_B64U_RE: Final = re.compile(r"[A-Za-z0-9_-]*")


# -- errors ------------------------------------------------------------------------------------


class RequestStateError(ValueError):
    """A request state that is refused. ``code`` is a stable reason name for records."""

    code: str = "invalid"


class RequestStateMalformed(RequestStateError):
    """Not a request state of this gateway's form (or a payload that does not read as one)."""

    code = "malformed"


class RequestStateForged(RequestStateError):
    """The tag does not verify under any key in the ring: forged, altered, or minted under a retired key."""

    code = "forged"


class RequestStateExpired(RequestStateError):
    """Authentic, for this call, but past its expiry."""

    code = "expired"


class RequestStateMismatch(RequestStateError):
    """Authentic, but issued for another agent, tool or set of arguments. ``bound`` names which."""

    code = "mismatch"

    def __init__(self, bound: str) -> None:
        what = {"agent": "another agent", "tool": "another tool", "arguments": "other arguments"}[bound]
        super().__init__(f"request_state was issued for {what}; it cannot authorise this call")
        self.bound = bound


# -- the value ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestStatePayload:
    """What a verified request state says."""

    agent: str
    tool: str
    args_digest: str
    approval_id: str
    expires_at: datetime
    nonce: str
    continuation: bool = False
    """Sealed by ``seal_continuation``: the approval was given and used; the call goes on."""
    upstream_state: str | None = None
    """The upstream's own ``requestState`` a continuation carries (None: the upstream sent none)."""


# -- helpers -----------------------------------------------------------------------------------


def _time_text(at: datetime) -> str:
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("expires_at must be a timezone-aware datetime")
    return at.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _parse_time(text: str) -> datetime:
    if _TIME_RE.fullmatch(text) is None:
        raise ValueError("not a timestamp")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _b64u_decode(text: str) -> bytes:
    """Strict: only the canonical unpadded encoding of some bytes decodes."""
    if _B64U_RE.fullmatch(text) is None or len(text) % 4 == 1:
        raise ValueError("not base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None
    if _b64u(raw) != text:
        raise ValueError("non-canonical base64url")
    return raw


def _ring(keys: bytes | Sequence[bytes]) -> list[bytes]:
    """The derived HMAC keys, in ring order. A key that is too short or not bytes is a configuration error."""
    if isinstance(keys, (bytes, bytearray)):
        keys = [bytes(keys)]
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError("request-state keys must be bytes or a sequence of bytes")
    if not keys:
        raise ValueError("request-state key ring is empty")
    derived: list[bytes] = []
    for index, key in enumerate(keys):
        if not isinstance(key, (bytes, bytearray)):
            raise TypeError(f"request-state key {index} must be bytes, not {type(key).__name__}")
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(
                f"request-state key {index} has {len(key)} bytes; at least {MIN_KEY_BYTES} bytes of "
                "secret randomness are required"
            )
        derived.append(hmac.new(bytes(key), KEY_LABEL, hashlib.sha256).digest())
    return derived


def _key_id(derived_key: bytes) -> str:
    return _b64u(hmac.new(derived_key, KEY_ID_LABEL, hashlib.sha256).digest()[:9])


def check_key_ring(key: bytes | Sequence[bytes]) -> None:
    """Raise the error ``seal`` would raise for this key ring (for checking configuration at startup)."""
    _ring(key)


def _tag(derived_key: bytes, signed_text: str) -> bytes:
    return hmac.new(derived_key, signed_text.encode("ascii"), hashlib.sha256).digest()


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _check_text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be non-empty text")
    return value


def _is_args_digest(value: object) -> bool:
    return parse_hmac_digest(value) is not None or is_sha256_digest(value)


# -- sealing and opening -----------------------------------------------------------------------


def _seal(key: bytes | Sequence[bytes], purpose: str, binding: dict[str, Any], extra: dict[str, Any]) -> str:
    derived = _ring(key)[0]
    _check_text(binding["agent"], "agent")
    _check_text(binding["tool"], "tool")
    if not _is_args_digest(binding["args_digest"]):
        raise ValueError("args_digest must be hmac-sha256:<key_id>:<hex> or sha256:<hex>")
    approval_id, nonce = binding["approval_id"], binding["nonce"]
    if not isinstance(approval_id, str) or _APPROVAL_ID_RE.fullmatch(approval_id) is None:
        raise ValueError("approval_id must be 16 lowercase hex characters")
    if not isinstance(nonce, str) or _NONCE_RE.fullmatch(nonce) is None:
        raise ValueError("nonce must be 16 to 128 characters of [A-Za-z0-9_-]")
    payload = {
        "v": VERSION,
        "purpose": purpose,
        "kid": _key_id(derived),
        **{k: v for k, v in binding.items() if k != "expires_at"},
        "exp": _time_text(binding["expires_at"]),
        **extra,
    }
    try:
        body = canonical_bytes(payload)
    except CanonicalizationError as exc:  # lone surrogates in a name
        raise ValueError("agent, tool or upstream state cannot be encoded") from exc
    signed = PREFIX + _b64u(body)
    token = signed + "." + _b64u(_tag(derived, signed))
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"request state would exceed {MAX_TOKEN_CHARS} characters")
    return token


def seal(
    key: bytes | Sequence[bytes],
    *,
    agent: str,
    tool: str,
    args_digest: str,
    approval_id: str,
    expires_at: datetime,
    nonce: str,
) -> str:
    """Mint the opaque ``requestState`` for one approval question; the first key of the ring signs."""
    binding = {"agent": agent, "tool": tool, "args_digest": args_digest, "approval_id": approval_id,
               "expires_at": expires_at, "nonce": nonce}
    return _seal(key, PURPOSE, binding, {})


def seal_continuation(
    key: bytes | Sequence[bytes],
    *,
    agent: str,
    tool: str,
    args_digest: str,
    approval_id: str,
    expires_at: datetime,
    nonce: str,
    upstream_state: str | None,
) -> str:
    """Mint the state that carries an approved call's own retries past the approval (module docstring,
    Continuation): the upstream's ``requestState`` rides inside, signed, and goes back to it unchanged."""
    if upstream_state is not None and not isinstance(upstream_state, str):
        raise ValueError("the upstream's requestState must be text")
    binding = {"agent": agent, "tool": tool, "args_digest": args_digest, "approval_id": approval_id,
               "expires_at": expires_at, "nonce": nonce}
    return _seal(key, CONTINUATION_PURPOSE, binding, {"upstream": upstream_state})


def _unverified_payload(token: object) -> dict[str, Any] | None:
    """The payload of a token of our form, read WITHOUT checking its tag; None when unreadable."""
    if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > MAX_TOKEN_CHARS:
        return None
    try:
        payload = parse_json(_b64u_decode(token[len(PREFIX):].split(".")[0]))
    except (CanonicalizationError, ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def issued_here(key: bytes | Sequence[bytes], token: object) -> bool:
    """Whether ``token`` is this gateway's to open (module docstring, Ownership); never verifies it."""
    if not isinstance(token, str) or not token.startswith(PREFIX):
        return False
    payload = _unverified_payload(token)
    if payload is None or not isinstance(payload.get("kid"), str):
        return True
    return payload["kid"] in {_key_id(derived) for derived in _ring(key)}


def carried_upstream_state(token: object) -> tuple[bool, str | None]:
    """Whether ``token`` reads as a continuation, and the upstream state it carries. Unverified: for
    routing only; a call runs on it only once ``open_state`` has verified the same bytes."""
    payload = _unverified_payload(token)
    if payload is None or payload.get("purpose") != CONTINUATION_PURPOSE:
        return False, None
    upstream = payload.get("upstream")
    return True, upstream if isinstance(upstream, str) else None


def _verified_body(ring: list[bytes], token: object) -> bytes:
    malformed = RequestStateMalformed("request_state is not a drawbridge request state")
    if not isinstance(token, str) or not token.isascii() or len(token) > MAX_TOKEN_CHARS:
        raise malformed
    if not token.startswith(PREFIX):
        raise RequestStateMalformed("request_state has an unknown version prefix")
    parts = token[len(PREFIX):].split(".")
    if len(parts) != 2:
        raise malformed
    body_text, tag_text = parts
    try:
        body = _b64u_decode(body_text)
        tag = _b64u_decode(tag_text)
    except ValueError:
        raise RequestStateMalformed("request_state is not canonical base64url") from None
    if len(tag) != TAG_BYTES or not body:
        raise malformed
    signed = PREFIX + body_text
    verified = False
    for derived in ring:  # every key is tried, so the time taken does not say which one matched
        verified |= hmac.compare_digest(_tag(derived, signed), tag)
    if not verified:
        raise RequestStateForged(
            "request_state does not verify: it was altered, forged, or sealed under a key this gateway "
            "no longer holds"
        )
    return body


def _decode_payload(body: bytes) -> dict[str, Any]:
    bad = RequestStateMalformed("request_state payload is not of this gateway's form")
    try:
        payload = parse_json(body)
        if canonical_bytes(payload) != body:
            raise bad
    except (CanonicalizationError, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(payload, dict):
        raise bad
    fields = _FIELDS_OF.get(payload.get("purpose"))  # type: ignore[arg-type]
    if payload.get("v") != VERSION or isinstance(payload.get("v"), bool) or fields is None:
        raise RequestStateMalformed("request_state has another version or purpose")
    if set(payload) != fields:
        raise bad
    if "upstream" in payload and payload["upstream"] is not None and not isinstance(payload["upstream"], str):
        raise bad
    for field in ("kid", "agent", "tool", "args_digest", "approval_id", "exp", "nonce"):
        if not isinstance(payload[field], str) or not payload[field]:
            raise bad
    if _APPROVAL_ID_RE.fullmatch(payload["approval_id"]) is None:
        raise bad
    if not _is_args_digest(payload["args_digest"]):
        raise bad
    return payload


def open_state(
    key: bytes | Sequence[bytes],
    token: object,
    *,
    agent: str,
    tool: str,
    args_digest: str,
    now: datetime,
) -> RequestStatePayload:
    """Verify ``token`` for the retried call (agent, tool, argument digest) at ``now``.

    Returns the payload, or raises the ``RequestStateError`` subclass that names the first problem
    (see the module docstring for the order).
    """
    ring = _ring(key)
    payload = _decode_payload(_verified_body(ring, token))
    try:
        expires_at = _parse_time(payload["exp"])
    except ValueError:
        raise RequestStateMalformed("request_state payload is not of this gateway's form") from None
    for field, given, bound in (
        ("agent", agent, payload["agent"]),
        ("tool", tool, payload["tool"]),
        ("arguments", args_digest, payload["args_digest"]),
    ):
        if not isinstance(given, str) or not constant_time_equal(_utf8(given), _utf8(bound)):
            raise RequestStateMismatch(field)
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise ValueError("now must be a timezone-aware datetime")
    if now >= expires_at:
        raise RequestStateExpired("request_state has expired; the approval question is no longer open")
    return RequestStatePayload(
        agent=payload["agent"],
        tool=payload["tool"],
        args_digest=payload["args_digest"],
        approval_id=payload["approval_id"],
        expires_at=expires_at,
        nonce=payload["nonce"],
        continuation=payload["purpose"] == CONTINUATION_PURPOSE,
        upstream_state=payload.get("upstream"),
    )


__all__ = [
    "CONTINUATION_PURPOSE",
    "MIN_KEY_BYTES",
    "PREFIX",
    "PURPOSE",
    "RequestStateError",
    "RequestStateExpired",
    "RequestStateForged",
    "RequestStateMalformed",
    "RequestStateMismatch",
    "RequestStatePayload",
    "carried_upstream_state",
    "check_key_ring",
    "issued_here",
    "open_state",
    "seal",
    "seal_continuation",
]
