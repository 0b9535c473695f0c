"""The observed side of tool-decision truth: the carrier record (evidence-formats.md §2.1-2.4).

Invariant: raw tool arguments never enter a carrier. The only trace of the
arguments is ``args_digest``, a keyed HMAC over their canonical form after every
secret-like key has been dropped at every depth. A secret is dropped rather than
hashed because a low-entropy or known-format secret can be recovered or
correlated from a hash, keyed or not.

Theory of operation. A carrier has three zones:

- observed-input identity: ``tool_name``, ``args_digest``, ``order`` and
  ``observed_input_digest`` (a plain sha256 over exactly those three);
- provenance, which is not identity: ``source_class``, ``call_id``,
  ``result_status``, ``identity_state``, ``key_id``;
- classification: ``declared_ref`` (reserved, always null),
  ``decision_verdict``, ``declared_policy_digest`` and ``decision_identity``
  (the pair of the two digests, the stable join key of the logical decision).

``build_carrier`` emits the fields in the exact insertion order of the format,
so NDJSON lines match the reference producer byte-for-byte; digests never
depend on that order because they all go through JCS. The builder refuses an
out-of-vocabulary label rather than minting one a consumer might trust
(``CarrierVocabularyError`` names the field); ``try_build_carrier`` is the
"mint nothing" form. ``validate_carrier`` is the import gate for a carrier
that arrives from elsewhere: it lists every problem instead of stopping at the
first, and never quotes argument-like content back.

This module is observed-side only: it takes a declared digest and a verdict
as values and does not evaluate policy.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from json.encoder import encode_basestring as _json_string
from typing import Any

from drawbridge.canonical import (
    CanonicalizationError,
    canonical_bytes,
    hmac_sha256_hex,
    is_sha256_digest,
    is_valid_key_id,
    jcs_digest,
    parse_hmac_digest,
    sha256_prefixed,
)

SCHEMA = "assay.tool_decision_truth.v0"
ARGS_DIGEST_DOMAIN = "assay.tool_args.v0"
_EXACT_INT = 2**53 - 1
"""Integers JCS writes as their digits; beyond, as the nearest double."""

SOURCE_CLASSES: tuple[str, ...] = ("authoritative_boundary", "reported_trace", "inferred")
RESULT_STATUSES: tuple[str, ...] = ("ok", "error", "n/a")
IDENTITY_STATES: tuple[str, ...] = ("present", "absent", "required_missing", "invalid")
# The carrier's own field vocabulary; the lattice that orders it lives in verdict.py.
DECISION_VERDICTS: tuple[str, ...] = ("match", "incomplete", "mismatch", "invalid")

# Normalized forms (lowercase, with "_", "-" and " " removed) of keys whose values are
# dropped before the argument digest. Exact equality only: "github_token" is kept.
SECRET_KEY_TOKENS: frozenset[str] = frozenset(
    {
        "token",
        "accesstoken",
        "refreshtoken",
        "authtoken",
        "idtoken",
        "sessiontoken",
        "password",
        "passwd",
        "apikey",
        "secret",
        "clientsecret",
        "secretkey",
        "authorization",
        "credential",
        "credentials",
        "privatekey",
        "secretaccesskey",
    }
)

# Field names that would hold raw arguments; none may appear anywhere in a carrier.
FORBIDDEN_RAW_ARG_KEYS: tuple[str, ...] = ("args", "arguments", "input", "tool_arguments")

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_SEPARATORS = frozenset("_- ")


class CarrierError(ValueError):
    """A carrier cannot be minted; ``field`` names the input at fault (never its value)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class CarrierVocabularyError(CarrierError):
    """A provenance, status or verdict label outside the append-only vocabulary."""


# --- secret-key rule (2.3) -------------------------------------------------------------


def normalize_secret_key(key: str) -> str:
    """Per-character lowercase after removing ``_``, ``-`` and space.

    Lowercasing per character (not ``str.lower`` on the whole key) matches the
    reference's context-free ``char::to_lowercase``: no Final_Sigma rule.
    """
    return "".join(c.lower() for c in key if c not in _SEPARATORS)


@functools.lru_cache(maxsize=4096)
def is_secret_key(key: str) -> bool:
    """Memoized: argument names repeat from call to call (only ``str`` keys reach it)."""
    return normalize_secret_key(key) in SECRET_KEY_TOKENS


_SCALARS = frozenset({str, int, float, bool, type(None)})


def drop_secret_keys(value: Any) -> Any:
    """The argument projection that feeds the digest: secret-like keys removed at every depth,
    including inside objects nested in arrays. Scalars are returned unchanged (the values of
    an object that are scalars without a call: arguments are mostly flat)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Mapping):
        return {
            k: v if type(v) in _SCALARS else drop_secret_keys(v)
            for k, v in value.items()
            if not (isinstance(k, str) and is_secret_key(k))
        }
    if isinstance(value, (list, tuple)):
        return [drop_secret_keys(item) for item in value]
    return value


# --- digests (2.2, 2.4, 2.9) -----------------------------------------------------------


def args_digest(args: Any, key: bytes, key_id: str) -> str | None:
    """``hmac-sha256:<key_id>:<hex>`` over ``assay.tool_args.v0:<key_id>:<JCS(projection)>``.

    None when the key is empty, the key id is malformed, or the arguments have no
    canonical form: a keyed digest that cannot be computed honestly is not computed.
    ``args`` is the raw ``params.arguments`` value (null and non-objects included).
    """
    if not isinstance(key, (bytes, bytearray)) or not key or not is_valid_key_id(key_id):
        return None
    try:
        canonical = canonical_bytes(drop_secret_keys(args))
    except CanonicalizationError:
        return None
    preimage = f"{ARGS_DIGEST_DOMAIN}:{key_id}:".encode() + canonical
    return f"hmac-sha256:{key_id}:{hmac_sha256_hex(bytes(key), preimage)}"


def is_i64(value: object) -> bool:
    """An integer (not a bool) that fits a signed 64-bit field, as the format's ``order``."""
    return isinstance(value, int) and not isinstance(value, bool) and _I64_MIN <= value <= _I64_MAX


def observed_input_digest(tool_name: str, args_digest: str, order: int) -> str:
    """sha256 over JCS of exactly ``{tool_name, args_digest, order}``; provenance never moves it."""
    if not isinstance(tool_name, str) or not isinstance(args_digest, str):
        raise TypeError("tool_name and args_digest must be strings")
    if not is_i64(order):
        raise ValueError("order must be an integer in the signed 64-bit range")
    if -_EXACT_INT <= order <= _EXACT_INT:
        # Every carrier computes this: its JCS text written out directly (keys in JCS order, strings
        # escaped as JCS escapes them, the integer as its digits), the general route otherwise.
        text = '{"args_digest":' + _json_string(args_digest) + ',"order":' + str(order)
        text += ',"tool_name":' + _json_string(tool_name) + "}"
        try:
            return sha256_prefixed(text.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: JCS has its own rule for it
            pass
    return jcs_digest({"tool_name": tool_name, "args_digest": args_digest, "order": order})


def decision_identity_digest(observed_input_digest: str, declared_policy_digest: str) -> str:
    """sha256 over JCS of the decision identity pair: the join key a pack row carries.

    Distinct from the carrier content digest, which covers every field."""
    return jcs_digest(
        {
            "observed_input_digest": observed_input_digest,
            "declared_policy_digest": declared_policy_digest,
        }
    )


def carrier_content_digest(carrier: Mapping[str, Any]) -> str:
    """sha256 over JCS of the whole carrier as given, extra keys included.

    Raises ``CanonicalizationError`` when the value has no canonical form."""
    return jcs_digest(carrier)


# --- builder (2.1) ----------------------------------------------------------------------


def _require_label(field: str, value: object, vocabulary: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in vocabulary:
        raise CarrierVocabularyError(field, "is not one of " + "|".join(vocabulary))


def build_carrier(
    *,
    tool_name: str,
    args: Any,
    order: int,
    declared_policy_digest: str,
    key: bytes,
    key_id: str,
    source_class: str,
    call_id: str,
    result_status: str,
    identity_state: str,
    decision_verdict: str | None = None,
) -> dict[str, Any]:
    """Mint one carrier, or raise ``CarrierError`` naming the field at fault.

    ``decision_verdict`` is None for an unclassified carrier; a classified one passes
    the verdict its caller computed for the same policy and observation. The field
    keeps its position either way.
    """
    _require_label("source_class", source_class, SOURCE_CLASSES)
    _require_label("result_status", result_status, RESULT_STATUSES)
    _require_label("identity_state", identity_state, IDENTITY_STATES)
    if decision_verdict is not None:
        _require_label("decision_verdict", decision_verdict, DECISION_VERDICTS)
    if not is_sha256_digest(declared_policy_digest):
        raise CarrierError("declared_policy_digest", "must be sha256:<64 lowercase hex>")
    if not isinstance(tool_name, str):
        raise CarrierError("tool_name", "must be a string")
    if not isinstance(call_id, str):
        raise CarrierError("call_id", "must be a string")
    if not is_i64(order):
        raise CarrierError("order", "must be an integer in the signed 64-bit range")
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise CarrierError("key", "must be non-empty bytes")
    if not is_valid_key_id(key_id):
        raise CarrierError("key_id", "must be non-empty [A-Za-z0-9._-]")
    digest = args_digest(args, key, key_id)
    if digest is None:
        raise CarrierError("args", "have no canonical JSON form")
    oid = observed_input_digest(tool_name, digest, order)
    return {
        "schema": SCHEMA,
        "tool_name": tool_name,
        "args_digest": digest,
        "order": order,
        "source_class": source_class,
        "call_id": call_id,
        "result_status": result_status,
        "identity_state": identity_state,
        "key_id": key_id,
        "declared_ref": None,
        "decision_verdict": decision_verdict,
        "observed_input_digest": oid,
        "declared_policy_digest": declared_policy_digest,
        "decision_identity": {
            "observed_input_digest": oid,
            "declared_policy_digest": declared_policy_digest,
        },
    }


def try_build_carrier(**fields: Any) -> dict[str, Any] | None:
    """``build_carrier`` with the reference's contract: mint nothing (None) instead of raising."""
    try:
        return build_carrier(**fields)
    except CarrierError:
        return None


# --- import gate (5.3) --------------------------------------------------------------------


def find_raw_argument_key(value: Any) -> str | None:
    """The first forbidden raw-argument key name found anywhere in ``value``, else None."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k in FORBIDDEN_RAW_ARG_KEYS:
                return str(k)
            found = find_raw_argument_key(v)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for item in value:
            found = find_raw_argument_key(item)
            if found is not None:
                return found
    return None


def _check_label(carrier: Mapping[str, Any], field: str, vocabulary: tuple[str, ...]) -> str | None:
    value = carrier.get(field)
    if not isinstance(value, str):
        return f"{field}: missing or not a string"
    if value not in vocabulary:
        return f"{field}: not one of {'|'.join(vocabulary)}"
    return None


def validate_carrier(carrier: Any, *, require_verdict: bool = False) -> list[str]:
    """Every reason a carrier must not be imported; an empty list means it may be.

    The checks of the reference import gate, all of them, in its order: schema; no
    raw-argument key at any depth; ``args_digest`` form and its key id equal to
    ``key_id``; both sha256 digests well-formed; ``decision_identity`` equal to the
    pair; ``observed_input_digest`` recomputes from ``(tool_name, args_digest,
    order)``; provenance vocabularies; ``call_id`` a string; ``decision_verdict``
    null or in vocabulary (required when ``require_verdict``, as binding a recipe
    row needs one). Messages name fields, never echo values.
    """
    if not isinstance(carrier, Mapping):
        return ["carrier: must be a JSON object"]
    problems: list[str] = []

    schema = carrier.get("schema")
    if schema != SCHEMA:
        problems.append(f"schema: must be {SCHEMA!r}")

    raw_key = find_raw_argument_key(carrier)
    if raw_key is not None:
        problems.append(f"raw_arguments: carrier holds a {raw_key!r} field; only digests are allowed")

    ad = carrier.get("args_digest")
    parsed = parse_hmac_digest(ad)
    key_id = carrier.get("key_id")
    if parsed is None:
        problems.append("args_digest: must be hmac-sha256:<key_id>:<64 lowercase hex>")
    if not isinstance(key_id, str):
        problems.append("key_id: missing or not a string")
    elif not is_valid_key_id(key_id):
        problems.append("key_id: must be non-empty [A-Za-z0-9._-]")
    elif parsed is not None and parsed[0] != key_id:
        problems.append("key_id: does not equal the key id framed in args_digest")

    oid = carrier.get("observed_input_digest")
    dpd = carrier.get("declared_policy_digest")
    for field, value in (("observed_input_digest", oid), ("declared_policy_digest", dpd)):
        if not is_sha256_digest(value):
            problems.append(f"{field}: must be sha256:<64 lowercase hex>")
    identity = carrier.get("decision_identity")
    if not isinstance(identity, Mapping):
        problems.append("decision_identity: missing or not an object")
    elif identity.get("observed_input_digest") != oid or identity.get("declared_policy_digest") != dpd:
        problems.append("decision_identity: must equal {observed_input_digest, declared_policy_digest}")

    tool_name = carrier.get("tool_name")
    order = carrier.get("order")
    if not isinstance(tool_name, str):
        problems.append("tool_name: missing or not a string")
    if not is_i64(order):
        problems.append("order: must be an integer in the signed 64-bit range")
    if isinstance(tool_name, str) and is_i64(order) and isinstance(ad, str) and is_sha256_digest(oid):
        if observed_input_digest(tool_name, ad, order) != oid:
            problems.append(
                "observed_input_digest: does not recompute from {tool_name, args_digest, order}"
            )

    for field, vocabulary in (
        ("source_class", SOURCE_CLASSES),
        ("result_status", RESULT_STATUSES),
        ("identity_state", IDENTITY_STATES),
    ):
        problem = _check_label(carrier, field, vocabulary)
        if problem is not None:
            problems.append(problem)
    if not isinstance(carrier.get("call_id"), str):
        problems.append("call_id: missing or not a string")

    verdict = carrier.get("decision_verdict")
    if verdict is None:
        if require_verdict:
            problems.append(
                "decision_verdict: must be one of match|incomplete|mismatch|invalid to bind a recipe row"
            )
    elif not isinstance(verdict, str) or verdict not in DECISION_VERDICTS:
        problems.append("decision_verdict: must be null or one of " + "|".join(DECISION_VERDICTS))
    try:
        carrier_content_digest(carrier)
    except CanonicalizationError:
        problems.append("carrier: has no canonical JSON form (content digest cannot be computed)")
    return problems
