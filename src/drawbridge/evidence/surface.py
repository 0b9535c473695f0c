"""Tool-decision surface records (``assay.tool_decision_surface.v0``).

Invariant: no raw argument and no secret ever rides in a record, and an
asserted side effect is never recorded as verified. Both hold by construction
here, and no caller can opt out: the builder never copies ``arguments`` (only
the classifier's projected target reaches the record), always writes
``arguments_redacted: true`` and ``secret_material_stored: false``, and always
leaves the side-effect block at level ``asserted``.

The builder is total: any tool name and any JSON value as arguments or params
yields exactly one record, never an exception.

Theory of operation (evidence-formats.md §1.1, 1.2):

* ``side_effect_asserted`` is ``effect == "allow" and status == "success"``
  (the raw status, before sanitising); ``side_effect_verified`` is derived from
  the block's level, so the boolean and the ladder cannot disagree.
* Every free string (server id, tool name, status, rule id) is sanitised:
  control characters become U+FFFD.
* Keys are emitted in the wire's insertion order; ``detail`` comes last and
  only when the classifier produced one. Digests never depend on this order
  (they use JCS), but the bytes of NDJSON lines do.
* The producer is named ``drawbridge`` (``decision.source``); the schema id
  names the format and stays verbatim.

``credential_alias`` is always null and ``server.declared_manifest_digest`` /
``redaction.sanitized_fields`` are never written: the format allows them, but
this builder has no evidence for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.classify import Classification, classify, record_text, target_hash
from drawbridge.evidence.correlation import correlation_from_params
from drawbridge.evidence.side_effect import producer_block
from drawbridge.evidence.vocabulary import (
    CLASSIFICATION_STATES,
    CORRELATION_BASES,
    DETAIL_VALUES,
    REASON_CODES,
    SURFACE_NON_CLAIMS,
    SURFACE_SCHEMA,
)

__all__ = [
    "CLASSIFICATION_STATES",
    "CORRELATION_BASES",
    "DETAIL_VALUES",
    "REASON_CODES",
    "SURFACE_NON_CLAIMS",
    "SURFACE_SCHEMA",
    "Classification",
    "Effect",
    "build_decision",
    "build_surface",
    "classify",
    "target_hash",
]


class Effect(StrEnum):
    """What the gateway decided for the call."""

    ALLOW = "allow"
    DENY = "deny"
    ERROR = "error"


def build_decision(
    *,
    server_id: str,
    tool_name: str,
    arguments: Any,
    params: Any,
    effect: Effect | str,
    status: str,
    rule_id: str | None = None,
) -> dict[str, Any]:
    """One observed decision entry.

    ``arguments`` is the raw ``params.arguments`` value (any JSON value) and is
    read only by the classifier; ``params`` are the ``tools/call`` params, read
    only for ``_meta.traceparent``. ``effect`` must be one of allow/deny/error;
    anything else is a caller bug and raises ``ValueError``.
    """
    effect = Effect(effect)
    asserted = effect is Effect.ALLOW and status == "success"
    c = classify(tool_name, arguments)
    side_effect = producer_block(asserted, c.category)
    decision: dict[str, Any] = {
        "server": {"id": record_text(server_id), "transport": v.TRANSPORT},
        "tool": {"name": record_text(tool_name), "category": c.category},
        "classification": c.state,
        "reason_code": c.reason_code,
        "action": {
            "class": c.action_class,
            "verb": c.verb,
            "resource_type": c.resource_type,
            "target": c.target,
            "required_scope": c.required_scope,
        },
        "decision": {
            "effect": effect.value,
            "source": v.PRODUCER,
            "rule_id": None if rule_id is None else record_text(rule_id),
            "enforced": True,
        },
        "response": {
            "status": record_text(status),
            "side_effect_asserted": asserted,
            "side_effect_verified": side_effect.verified_flag,
            "side_effect": side_effect.to_json(),
        },
        "redaction": {
            "arguments_redacted": True,
            "credential_alias": None,
            "secret_material_stored": False,
        },
        "correlation": correlation_from_params(params),
    }
    if c.detail is not None:
        decision["detail"] = c.detail
    return decision


def build_surface(decisions: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The envelope: schema, the entries in the given order, the non-claims."""
    return {
        "schema": SURFACE_SCHEMA,
        "observed_tool_decisions": list(decisions),
        "non_claims": list(SURFACE_NON_CLAIMS),
    }
