"""The digest that binds an approval to exactly one set of arguments.

Invariant: two calls share an approval binding only if their arguments are the same JSON value,
every key included. Secret-like keys (``password``, ``token``, ``api_key`` ...) count like any
other: an approval given for ``{"user": "a", "password": "x"}`` must not let
``{"user": "a", "password": "y"}`` through. That is why this is not the truth carrier's
``args_digest``, which drops secret-like keys by design (its job is evidence that can be shared;
this one's is authorisation). The binding is keyed, so the digest kept in the approval queue and the
trace chain cannot be brute-forced back to a low-entropy value offline, and no raw argument is ever
stored.

Theory of operation. ``binding_digest(arguments, key, key_id)`` is
``hmac-sha256:<key_id>:<hex>`` with HMAC-SHA256 under ``key`` over the ASCII text
``drawbridge.approval_binding.v1:<key_id>:`` followed by the RFC 8785 canonical bytes of the
arguments. The domain prefix keeps the value apart from every other keyed digest the gateway makes,
even under a shared key. Arguments with no canonical form (a lone surrogate, a non-finite number)
have no binding: the function returns None and the caller refuses the call. Pure: the key is passed
in.
"""

from __future__ import annotations

from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, canonical_bytes, hmac_sha256_hex, is_valid_key_id

BINDING_DOMAIN: Final = "drawbridge.approval_binding.v1"


def binding_digest(arguments: Any, key: bytes, key_id: str) -> str | None:
    """The keyed binding of ``arguments`` (every key, secrets included); None if it cannot be computed."""
    if not isinstance(key, (bytes, bytearray)) or not key or not is_valid_key_id(key_id):
        return None
    try:
        canonical = canonical_bytes(arguments)
    except (CanonicalizationError, TypeError, ValueError, RecursionError):
        return None
    preimage = f"{BINDING_DOMAIN}:{key_id}:".encode("ascii") + canonical
    return f"hmac-sha256:{key_id}:{hmac_sha256_hex(bytes(key), preimage)}"


__all__ = ["BINDING_DOMAIN", "binding_digest"]
