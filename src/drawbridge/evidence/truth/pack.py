"""The pack recipe row: how evidence cites one carrier (evidence-formats.md §2.9).

Invariant: a recipe row verifies only against the exact carrier bytes it cites
and only for a run verdict at least as severe as the carrier's own verdict.
Any change to the carrier, to the row, or to the claimed verdict fails closed.

Theory of operation. A row holds two different digests of the carrier:
``evidence_ref.digest`` is the *content* digest (JCS of every carrier field)
and cites one record; ``decision_identity_digest`` covers only the pair
(observed input, declared policy) and joins rows that describe the same
logical decision. ``coherence_binding`` is a sha256 over JCS of the recipe,
the envelope verbatim (``ref`` and any extra keys included), the identity
digest and the run verdict, so none of them can be swapped independently.

``verify_recipe_row`` runs eight checks in a fixed order and reports the first
that fails, named by an id from ``CHECKS``:

1. ``recipe``            the recipe id is ``tool_decision_truth.v0``;
2. ``envelope``          ``evidence_ref`` has the fixed type, schema,
                         canonicalization and digest subject;
3. ``run_verdict``       the row states the run verdict being verified;
4. ``verdict_covers``    that verdict is in the vocabulary and not less severe
                         than the carrier's ``decision_verdict``;
5. ``digest_form``       both cited digests are ``sha256:`` + 64 lowercase hex;
6. ``content_digest``    the carrier's content digest equals the citation;
7. ``decision_identity`` the carrier's identity pair is well-formed and digests
                         to the row's ``decision_identity_digest``;
8. ``coherence_binding`` the binding recomputes.

``ref`` is a locator, never validated: the content digest is the citation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drawbridge.canonical import CanonicalizationError, is_sha256_digest, jcs_digest
from drawbridge.evidence.truth.carrier import (
    SCHEMA,
    carrier_content_digest,
    decision_identity_digest,
)
from drawbridge.evidence.truth.verdict import VERDICTS, verdict_rank

RECIPE = "tool_decision_truth.v0"
EVIDENCE_REF_TYPE = "tool_decision_truth"
DIGEST_SUBJECT = "carrier_content"
CANONICALIZATION = "jcs-json-v1"

CHECKS: tuple[str, ...] = (
    "recipe",
    "envelope",
    "run_verdict",
    "verdict_covers",
    "digest_form",
    "content_digest",
    "decision_identity",
    "coherence_binding",
)

_ENVELOPE_FIELDS: tuple[tuple[str, str], ...] = (
    ("type", EVIDENCE_REF_TYPE),
    ("schema", SCHEMA),
    ("canonicalization", CANONICALIZATION),
    ("digest_subject", DIGEST_SUBJECT),
)


class RecipeRowError(ValueError):
    """A recipe row cannot be built for this carrier and verdict."""


def evidence_ref(content_digest: str, ref: str) -> dict[str, Any]:
    """The envelope a row cites its carrier by, in the format's insertion order."""
    return {
        "type": EVIDENCE_REF_TYPE,
        "digest": content_digest,
        "digest_subject": DIGEST_SUBJECT,
        "canonicalization": CANONICALIZATION,
        "schema": SCHEMA,
        "ref": ref,
    }


def coherence_binding(
    evidence_ref_value: Any, decision_identity: Any, run_verdict: str, recipe: str = RECIPE
) -> str:
    """sha256 over JCS of ``{recipe, evidence_ref, decision_identity_digest, run_verdict}``."""
    return jcs_digest(
        {
            "recipe": recipe,
            "evidence_ref": evidence_ref_value,
            "decision_identity_digest": decision_identity,
            "run_verdict": run_verdict,
        }
    )


def _is_verdict(value: object) -> bool:
    return isinstance(value, str) and value in VERDICTS


def _coverage_problem(carrier: Mapping[str, Any], run_verdict: object) -> str | None:
    """Why ``run_verdict`` cannot stand for this carrier, or None when it can."""
    if not _is_verdict(run_verdict):
        return "run verdict is not one of " + "|".join(VERDICTS)
    carrier_verdict = carrier.get("decision_verdict")
    if carrier_verdict is None:
        return None
    if not _is_verdict(carrier_verdict):
        return "carrier decision_verdict is not one of " + "|".join(VERDICTS)
    if verdict_rank(run_verdict) < verdict_rank(carrier_verdict):  # type: ignore[arg-type]
        return f"run verdict {run_verdict!r} understates carrier verdict {carrier_verdict!r}"
    return None


def pack_recipe_row(carrier: Mapping[str, Any], run_verdict: str, ref: str) -> dict[str, Any]:
    """Build the row that binds ``carrier`` under ``run_verdict``; raise ``RecipeRowError`` if it
    cannot stand. Like the reference, it neither checks the carrier schema nor recomputes the
    observed-input digest: that is the import gate's job (``validate_carrier``)."""
    if not isinstance(carrier, Mapping):
        raise RecipeRowError("carrier is not a JSON object")
    problem = _coverage_problem(carrier, run_verdict)
    if problem is not None:
        raise RecipeRowError(problem)
    oid = carrier.get("observed_input_digest")
    dpd = carrier.get("declared_policy_digest")
    if not is_sha256_digest(oid) or not is_sha256_digest(dpd):
        raise RecipeRowError("carrier observed_input_digest or declared_policy_digest is malformed")
    try:
        content = carrier_content_digest(carrier)
    except CanonicalizationError as exc:
        raise RecipeRowError("carrier has no canonical JSON form") from exc
    identity = decision_identity_digest(oid, dpd)
    envelope = evidence_ref(content, ref)
    return {
        "recipe": RECIPE,
        "evidence_ref": envelope,
        "decision_identity_digest": identity,
        "run_verdict": run_verdict,
        "coherence_binding": coherence_binding(envelope, identity, run_verdict),
    }


def _fail(check: str, reason: str) -> tuple[bool, str]:
    return False, f"{check}: {reason}"


def verify_recipe_row(row: Any, carrier: Any, run_verdict: str) -> tuple[bool, str | None]:
    """``(True, None)`` when the row coheres with ``carrier`` under ``run_verdict``; otherwise
    ``(False, "<check>: <reason>")`` for the first failing check of ``CHECKS``."""
    if not isinstance(row, Mapping):
        return _fail("recipe", "row is not a JSON object")
    if row.get("recipe") != RECIPE:
        return _fail("recipe", f"recipe is not {RECIPE!r}")

    envelope = row.get("evidence_ref")
    if not isinstance(envelope, Mapping):
        return _fail("envelope", "evidence_ref is missing or not an object")
    for field, expected in _ENVELOPE_FIELDS:
        if envelope.get(field) != expected:
            return _fail("envelope", f"evidence_ref.{field} is not {expected!r}")

    if row.get("run_verdict") != run_verdict:
        return _fail("run_verdict", "row run_verdict differs from the verdict being verified")

    if not isinstance(carrier, Mapping):
        return _fail("verdict_covers", "carrier is not a JSON object")
    problem = _coverage_problem(carrier, run_verdict)
    if problem is not None:
        return _fail("verdict_covers", problem)

    cited = envelope.get("digest")
    row_identity = row.get("decision_identity_digest")
    if not is_sha256_digest(cited):
        return _fail("digest_form", "evidence_ref.digest is not sha256:<64 lowercase hex>")
    if not is_sha256_digest(row_identity):
        return _fail("digest_form", "decision_identity_digest is not sha256:<64 lowercase hex>")

    try:
        content = carrier_content_digest(carrier)
    except CanonicalizationError:
        return _fail("content_digest", "carrier has no canonical JSON form")
    if content != cited:
        return _fail("content_digest", "carrier content digest differs from evidence_ref.digest")

    oid = carrier.get("observed_input_digest")
    dpd = carrier.get("declared_policy_digest")
    if not is_sha256_digest(oid) or not is_sha256_digest(dpd):
        return _fail(
            "decision_identity", "carrier observed_input_digest or declared_policy_digest is malformed"
        )
    if decision_identity_digest(oid, dpd) != row_identity:
        return _fail("decision_identity", "carrier identity pair does not digest to decision_identity_digest")

    try:
        expected_binding = coherence_binding(envelope, row_identity, run_verdict)
    except CanonicalizationError:
        return _fail("coherence_binding", "evidence_ref has no canonical JSON form")
    if row.get("coherence_binding") != expected_binding:
        return _fail("coherence_binding", "coherence_binding does not recompute")
    return True, None
