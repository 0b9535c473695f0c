"""Digest spellings shared by every evidence format.

Every digest is ``sha256:`` + 64 lowercase hex over canonical bytes, or a keyed
``hmac-sha256:<key_id>:`` + 64 lowercase hex. Checking a digest's *form* lives
here too, so that every verifier rejects the same malformed strings.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from typing import Any

from drawbridge.canonical.jcs import canonical_bytes

SHA256_PREFIX = "sha256:"
_SHA256_RE = re.compile(r"sha256:[0-9a-f]{64}")
_HMAC_RE = re.compile(r"hmac-sha256:([A-Za-z0-9._-]+):([0-9a-f]{64})")
_KEY_ID_RE = re.compile(r"[A-Za-z0-9._-]+")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_prefixed(data: bytes) -> str:
    """``sha256:<hex>`` over raw bytes."""
    return SHA256_PREFIX + sha256_hex(data)


def jcs_digest(value: Any) -> str:
    """``sha256:<hex>`` over the JCS bytes of a JSON value."""
    return sha256_prefixed(canonical_bytes(value))


def hmac_sha256_hex(key: bytes, message: bytes) -> str:
    mac = _keyed_sha256(key).copy()
    mac.update(message)
    return mac.hexdigest()


@functools.lru_cache(maxsize=4)
def _keyed_sha256(key: bytes) -> hmac.HMAC:
    """The HMAC state after absorbing ``key``: a producer keys every digest of a run with the same
    key, and copying this state costs half of keying anew. Kept only for the last few keys,
    in memory, where their owners hold them anyway."""
    return hmac.new(key, digestmod="sha256")


def is_sha256_digest(value: object) -> bool:
    """True for a well-formed ``sha256:`` + 64 lowercase hex string."""
    return isinstance(value, str) and _SHA256_RE.fullmatch(value) is not None


def is_valid_key_id(value: object) -> bool:
    """Key ids are non-empty and ASCII ``[A-Za-z0-9._-]`` only."""
    return isinstance(value, str) and _is_valid_key_id_text(value)


@functools.lru_cache(maxsize=256)
def _is_valid_key_id_text(value: str) -> bool:
    """Memoized: a producer checks its one key id on every digest it makes."""
    return value.isascii() and _KEY_ID_RE.fullmatch(value) is not None


def parse_hmac_digest(value: object) -> tuple[str, str] | None:
    """``(key_id, hex)`` of a well-formed ``hmac-sha256:<kid>:<hex>``, else None."""
    if not isinstance(value, str) or not value.isascii():
        return None
    match = _HMAC_RE.fullmatch(value)
    return (match.group(1), match.group(2)) if match else None


def constant_time_equal(a: str | bytes, b: str | bytes) -> bool:
    """Compare secrets without leaking their length of common prefix through timing."""
    left = a.encode() if isinstance(a, str) else a
    right = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(left, right)
