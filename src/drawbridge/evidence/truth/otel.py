"""OpenTelemetry view of verified tool-decision-truth evidence (evidence-formats.md §2.11).

Invariant: only decisions whose recipe row verified against their carrier are
projected, and neither raw arguments nor the keyed ``args_digest`` ever reach
the projection. The projection is a lossy, one-way view; the evidence records
stay the source of truth, and the envelope says so (``lossy``,
``source_of_truth``, ``non_claims``).

Theory of operation. ``VerifiedDecision.from_row`` is the only way to make a
projection input out of a (carrier, row) pair: it runs ``verify_recipe_row``
and refuses what fails, so the projector never re-pairs or re-verifies. Each
decision becomes one ``INTERNAL`` span named ``execute_tool <tool>``, with the
GenAI and OpenInference attributes a generic backend reads, the qualifier
``assay.claim_class=derived`` (a comparison over observed and declared data,
neither a raw observation nor enforcement), and the verdict and the four
higher-level digests under ``assay.tdt.*``. Attribute names, span shape and
non-claims are the reference format's, verbatim; only the service name is ours.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from drawbridge.evidence.truth.pack import verify_recipe_row

PROJECTION_SCHEMA = "assay.tool_decision_truth.otel_projection.v0"
OTEL_GENAI_SEMCONV = "1.37.0-development"
OPENINFERENCE_SEMCONV = "pinned"
SOURCE_OF_TRUTH = "assay artifacts"
SERVICE_NAME = "drawbridge"

NON_CLAIMS: tuple[str, ...] = (
    "This projection is a one-directional, lossy view; the assay artifacts remain authoritative.",
    "gen_ai.* and openinference.* fields are a projection, not the source of truth.",
    "A tool-decision-truth verdict is a derived comparison over observed and declared data "
    "(assay.claim_class=derived); it is not a raw observation, not enforcement, and not an intent "
    "or safety judgement.",
    "Raw tool arguments and the keyed args_digest are not projected; this view carries only the "
    "higher-level observed-input, declared-policy, decision-identity, and carrier-content digests.",
    f"Pinned to OTel GenAI semconv {OTEL_GENAI_SEMCONV} and OpenInference {OPENINFERENCE_SEMCONV}; "
    "a version bump is explicit.",
)

# Carrier fields copied when they are strings, in attribute order. args_digest is absent on purpose.
_CARRIER_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("schema", "assay.tdt.schema"),
    ("decision_verdict", "assay.tdt.decision_verdict"),
    ("observed_input_digest", "assay.tdt.observed_input_digest"),
    ("declared_policy_digest", "assay.tdt.declared_policy_digest"),
    ("source_class", "assay.tdt.source_class"),
)


class UnverifiedDecisionError(ValueError):
    """A (carrier, row) pair whose row does not verify cannot be projected."""


@dataclass(frozen=True)
class VerifiedDecision:
    """One decision whose row verified: the carrier plus the three values the row bound."""

    carrier: Mapping[str, Any]
    carrier_content_digest: str
    decision_identity_digest: str
    run_verdict: str

    @classmethod
    def from_row(cls, carrier: Mapping[str, Any], row: Mapping[str, Any]) -> VerifiedDecision:
        """Verify ``row`` against ``carrier`` under the row's own run verdict; raise if it fails."""
        run_verdict = row.get("run_verdict") if isinstance(row, Mapping) else None
        if not isinstance(run_verdict, str):
            run_verdict = ""
        ok, failed = verify_recipe_row(row, carrier, run_verdict)
        if not ok:
            raise UnverifiedDecisionError(f"recipe row does not verify ({failed})")
        return cls(
            carrier=carrier,
            carrier_content_digest=row["evidence_ref"]["digest"],
            decision_identity_digest=row["decision_identity_digest"],
            run_verdict=run_verdict,
        )


def _span(decision: VerifiedDecision) -> dict[str, Any]:
    carrier = decision.carrier
    tool = carrier.get("tool_name")
    tool = tool if isinstance(tool, str) else ""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool"}
    if tool:
        attributes["gen_ai.tool.name"] = tool
        attributes["tool.name"] = tool
    attributes["openinference.span.kind"] = "TOOL"
    attributes["assay.claim_class"] = "derived"
    for field, name in _CARRIER_ATTRIBUTES:
        value = carrier.get(field)
        if isinstance(value, str):
            attributes[name] = value
    attributes["assay.tdt.run_verdict"] = decision.run_verdict
    attributes["assay.tdt.decision_identity_digest"] = decision.decision_identity_digest
    attributes["assay.tdt.carrier_content_digest"] = decision.carrier_content_digest
    return {"name": f"execute_tool {tool}", "kind": "INTERNAL", "attributes": attributes}


def project_tool_decision_truth(
    decisions: Iterable[VerifiedDecision], *, service_name: str = SERVICE_NAME
) -> dict[str, Any]:
    """The projection envelope, fields in the reference's order, one span per decision."""
    return {
        "schema": PROJECTION_SCHEMA,
        "semconv": {"otel_genai": OTEL_GENAI_SEMCONV, "openinference": OPENINFERENCE_SEMCONV},
        "spans": [_span(d) for d in decisions],
        "resource_attributes": {"service.name": service_name},
        "lossy": True,
        "source_of_truth": SOURCE_OF_TRUTH,
        "non_claims": list(NON_CLAIMS),
    }
