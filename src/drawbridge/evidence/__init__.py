"""The evidence core: records anyone can rebuild and verify offline from committed bytes.

Pure functions only (no I/O, no clock): the gateway's shell writes what these
build, and the ``drawbridge evidence`` commands verify what was written.

- surface records (``assay.tool_decision_surface.v0``): what was called, how it
  was classified, what was decided, with arguments dropped or hashed;
- the side-effect ladder (asserted, observed_confirmed, verified) and the binding
  of imported provider audit records (``assay.provider_audit_record.v0``);
- tool-decision truth (``assay.tool_decision_truth.v0``): keyed carriers,
  declared-policy digests, verdicts, pack recipe rows and their verifier;
- the hash-chained trace.
"""

from drawbridge.evidence.audit_binding import (
    binding_digest,
    check_audit_record,
    promote_with_audit_record,
    promote_with_observed_read,
    subject_from_action,
)
from drawbridge.evidence.audit_import import load_audit_records
from drawbridge.evidence.chain import (
    GENESIS_HASH,
    ChainHead,
    ChainProblem,
    ChainReport,
    make_checkpoint,
    make_entry,
    verify_chain,
)
from drawbridge.evidence.classify import Classification, classify, target_hash
from drawbridge.evidence.correlation import correlation_from_params
from drawbridge.evidence.side_effect import SideEffect, SideEffectLevel
from drawbridge.evidence.side_effect_verify import verify_side_effects
from drawbridge.evidence.surface import Effect, build_decision, build_surface
from drawbridge.evidence.truth import (
    Evidence,
    args_digest,
    build_carrier,
    carrier_content_digest,
    decision_identity_digest,
    decision_verdict,
    declared_policy_digest,
    matches_tool_pattern,
    observed_input_digest,
    pack_recipe_row,
    parse_assay_policy,
    project_tool_decision_truth,
    run_verdict,
    validate_carrier,
    verify_carriers,
    verify_recipe_row,
    verify_tdt_document,
)

__all__ = [
    "GENESIS_HASH",
    "ChainHead",
    "ChainProblem",
    "ChainReport",
    "Classification",
    "Effect",
    "Evidence",
    "SideEffect",
    "SideEffectLevel",
    "args_digest",
    "binding_digest",
    "build_carrier",
    "build_decision",
    "build_surface",
    "carrier_content_digest",
    "check_audit_record",
    "classify",
    "correlation_from_params",
    "decision_identity_digest",
    "decision_verdict",
    "declared_policy_digest",
    "load_audit_records",
    "make_checkpoint",
    "make_entry",
    "matches_tool_pattern",
    "observed_input_digest",
    "pack_recipe_row",
    "parse_assay_policy",
    "project_tool_decision_truth",
    "promote_with_audit_record",
    "promote_with_observed_read",
    "run_verdict",
    "subject_from_action",
    "target_hash",
    "validate_carrier",
    "verify_carriers",
    "verify_chain",
    "verify_recipe_row",
    "verify_side_effects",
    "verify_tdt_document",
]
