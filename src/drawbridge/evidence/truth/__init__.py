"""Tool-decision truth (assay.tool_decision_truth.v0): declared side, verdict gate, carriers."""

from drawbridge.evidence.truth.args_schema import ArgsCheck
from drawbridge.evidence.truth.assay_errors import AssayPolicyError
from drawbridge.evidence.truth.assay_fields import (
    TOOL_LIST_FIELDS,
    UNCONSTRAINED_MODES,
    unknown_policy_fields,
)
from drawbridge.evidence.truth.assay_policy import normalize_assay_policy, parse_assay_policy
from drawbridge.evidence.truth.carrier import (
    SCHEMA,
    CarrierError,
    CarrierVocabularyError,
    args_digest,
    build_carrier,
    carrier_content_digest,
    decision_identity_digest,
    drop_secret_keys,
    is_secret_key,
    observed_input_digest,
    try_build_carrier,
    validate_carrier,
)
from drawbridge.evidence.truth.declared import declared_policy_digest, declared_view, project_declared
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.otel import (
    UnverifiedDecisionError,
    VerifiedDecision,
    project_tool_decision_truth,
)
from drawbridge.evidence.truth.pack import (
    RECIPE,
    RecipeRowError,
    evidence_ref,
    pack_recipe_row,
    verify_recipe_row,
)
from drawbridge.evidence.truth.patterns import matches_tool_pattern
from drawbridge.evidence.truth.vectors import verify_carriers, verify_tdt_document
from drawbridge.evidence.truth.verdict import (
    AXES,
    IDENTITY_STATES,
    JSON_NULL,
    VERDICTS,
    check_tool_args,
    decision_axes,
    decision_verdict,
    lattice_max,
    run_verdict,
    verdict_rank,
)

__all__ = [
    "AXES",
    "ArgsCheck",
    "AssayPolicyError",
    "CarrierError",
    "CarrierVocabularyError",
    "Evidence",
    "IDENTITY_STATES",
    "JSON_NULL",
    "RECIPE",
    "RecipeRowError",
    "SCHEMA",
    "TOOL_LIST_FIELDS",
    "UNCONSTRAINED_MODES",
    "UnverifiedDecisionError",
    "VERDICTS",
    "VerifiedDecision",
    "args_digest",
    "build_carrier",
    "carrier_content_digest",
    "check_tool_args",
    "decision_axes",
    "decision_identity_digest",
    "decision_verdict",
    "declared_policy_digest",
    "declared_view",
    "drop_secret_keys",
    "evidence_ref",
    "is_secret_key",
    "lattice_max",
    "matches_tool_pattern",
    "normalize_assay_policy",
    "observed_input_digest",
    "pack_recipe_row",
    "parse_assay_policy",
    "project_declared",
    "project_tool_decision_truth",
    "run_verdict",
    "try_build_carrier",
    "unknown_policy_fields",
    "validate_carrier",
    "verdict_rank",
    "verify_carriers",
    "verify_recipe_row",
    "verify_tdt_document",
]
