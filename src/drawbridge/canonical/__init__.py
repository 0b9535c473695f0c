"""Canonical JSON (RFC 8785) and the digests built on it: the unit every evidence format shares."""

from drawbridge.canonical.digests import (
    constant_time_equal,
    hmac_sha256_hex,
    is_sha256_digest,
    is_valid_key_id,
    jcs_digest,
    parse_hmac_digest,
    sha256_hex,
    sha256_prefixed,
)
from drawbridge.canonical.jcs import (
    Canonical,
    CanonicalizationError,
    DuplicateKeyError,
    canonical_bytes,
    canonical_text,
    canonicalize_text,
    parse_json,
    scalar_bytes,
    shown_key,
    unique_object,
)
from drawbridge.canonical.text import RUST_WHITESPACE, escape_unsafe, rust_trim, sanitize

__all__ = [
    "RUST_WHITESPACE",
    "Canonical",
    "CanonicalizationError",
    "DuplicateKeyError",
    "canonical_bytes",
    "canonical_text",
    "canonicalize_text",
    "constant_time_equal",
    "escape_unsafe",
    "hmac_sha256_hex",
    "is_sha256_digest",
    "is_valid_key_id",
    "jcs_digest",
    "parse_hmac_digest",
    "parse_json",
    "rust_trim",
    "sanitize",
    "scalar_bytes",
    "sha256_hex",
    "sha256_prefixed",
    "shown_key",
    "unique_object",
]
