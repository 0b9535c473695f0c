"""The closed vocabularies of the tool-decision surface and the side-effect receipt.

Invariant: every string the surface builder, the classifiers or the side-effect
verifier writes into a machine-readable field comes from a constant in this
module. Downstream never parses prose, so a value that is not listed here is a
bug, not a new state.

The values and their order are the wire formats' (evidence-formats.md §1.3, 3.1,
3.4); schema ids name formats, not producers, and are kept verbatim. Where a
record names its producer it says ``drawbridge``.
"""

from __future__ import annotations

from typing import Final

SURFACE_SCHEMA: Final = "assay.tool_decision_surface.v0"
PROVIDER_AUDIT_RECORD_SCHEMA: Final = "assay.provider_audit_record.v0"
SIDE_EFFECT_VERIFICATION_SCHEMA: Final = "assay.side_effect_verification.v0"

#: ``decision.source`` of every record we build.
PRODUCER: Final = "drawbridge"
#: ``server.transport`` of every record we build.
TRANSPORT: Final = "mcp"

SURFACE_NON_CLAIMS: Final = (
    "does not prove SaaS-side persistence without external audit evidence",
    "does not infer tool actions outside observed MCP proxy traffic",
    "does not expose raw secrets or tokens",
)

# --- classification -----------------------------------------------------------

CLASSIFIED: Final = "classified"
CLASSIFIED_INCOMPLETE: Final = "classified_incomplete"
OBSERVED_UNKNOWN_TOOL: Final = "observed_unknown_tool"
REDACTION_FAILED: Final = "redaction_failed"  # reserved by the format; never emitted
NOT_OBSERVED: Final = "not_observed"  # exists in the format's spec only; never emitted

#: Every classification state the format knows, in the format's order.
CLASSIFICATION_STATES: Final = (
    CLASSIFIED,
    CLASSIFIED_INCOMPLETE,
    OBSERVED_UNKNOWN_TOOL,
    REDACTION_FAILED,
    NOT_OBSERVED,
)
#: The states our classifier can produce.
EMITTED_CLASSIFICATION_STATES: Final = (CLASSIFIED, CLASSIFIED_INCOMPLETE, OBSERVED_UNKNOWN_TOOL)

REASON_CLASSIFIED_GITHUB_DEPLOY_KEY: Final = "classified_github_deploy_key"
REASON_CLASSIFIED_SLACK_ADD_MEMBER: Final = "classified_slack_add_member"
REASON_CLASSIFIED_WORKSPACE_ADMIN: Final = "classified_workspace_admin"
REASON_MISSING_REQUIRED_TARGET_FIELD: Final = "missing_required_target_field"
REASON_UNKNOWN_TOOL_NAME: Final = "unknown_tool_name"
REASON_REDACTED_SECRET_ARGUMENT: Final = "redacted_secret_argument"  # never emitted
REASON_UNSUPPORTED_ARGUMENT_SHAPE: Final = "unsupported_argument_shape"  # never emitted

#: Every reason code the format knows, in the format's order.
REASON_CODES: Final = (
    REASON_CLASSIFIED_GITHUB_DEPLOY_KEY,
    REASON_CLASSIFIED_SLACK_ADD_MEMBER,
    REASON_CLASSIFIED_WORKSPACE_ADMIN,
    REASON_MISSING_REQUIRED_TARGET_FIELD,
    REASON_UNKNOWN_TOOL_NAME,
    REASON_REDACTED_SECRET_ARGUMENT,
    REASON_UNSUPPORTED_ARGUMENT_SHAPE,
)
#: The reason codes our classifier can produce. Secret arguments are dropped by
#: construction and every argument shape is accepted, so the last two never occur.
EMITTED_REASON_CODES: Final = REASON_CODES[:5]

DETAIL_MISSING_GITHUB_OWNER_OR_REPO: Final = "missing_github_owner_or_repo"
DETAIL_MISSING_SLACK_PRINCIPAL: Final = "missing_slack_principal"
DETAIL_MISSING_SLACK_SCOPE: Final = "missing_slack_scope"
DETAIL_MISSING_WORKSPACE_ID: Final = "missing_workspace_id"
DETAIL_MISSING_WORKSPACE_PRINCIPAL: Final = "missing_workspace_principal"

DETAIL_VALUES: Final = (
    DETAIL_MISSING_GITHUB_OWNER_OR_REPO,
    DETAIL_MISSING_SLACK_PRINCIPAL,
    DETAIL_MISSING_SLACK_SCOPE,
    DETAIL_MISSING_WORKSPACE_ID,
    DETAIL_MISSING_WORKSPACE_PRINCIPAL,
)

# --- categories, action classes, resource types --------------------------------

GITHUB_DEPLOY_KEY: Final = "github_deploy_key"
SLACK_ADD_MEMBER: Final = "slack_add_member"
WORKSPACE_ADMIN: Final = "workspace_admin"

CATEGORIES: Final = (GITHUB_DEPLOY_KEY, SLACK_ADD_MEMBER, WORKSPACE_ADMIN)

PRIVILEGED_ADMIN_ACTION: Final = "privileged_admin_action"
UNCLASSIFIED: Final = "unclassified"
ACTION_CLASSES: Final = (PRIVILEGED_ADMIN_ACTION, UNCLASSIFIED)

#: ``action.resource_type`` per category. The binding subject's ``action_class`` is
#: this value, not the category (evidence-formats.md §3.3).
RESOURCE_TYPE: Final = {
    GITHUB_DEPLOY_KEY: "github_deploy_key",
    SLACK_ADD_MEMBER: "workspace_member",
    WORKSPACE_ADMIN: "workspace_role",
}

#: Static scope a classified action requires: a claim about the category, never
#: inferred from arguments. Absent (None) reads as "unknown", never "no scope".
REQUIRED_SCOPE: Final = {
    GITHUB_DEPLOY_KEY: "repo:deploy_key:write",
    SLACK_ADD_MEMBER: "conversations:members:write",
    WORKSPACE_ADMIN: "workspace:admin",
}

#: Domains of ``target_hash`` (pseudonymised identifiers).
TARGET_HASH_DOMAINS: Final = (
    "github_key_title",
    "slack_workspace",
    "slack_channel",
    "slack_principal",
    "workspace",
    "workspace_principal",
)

# --- decision and correlation ---------------------------------------------------

EFFECTS: Final = ("allow", "deny", "error")

BASIS_PROPAGATED: Final = "propagated_trace_context"
BASIS_MALFORMED: Final = "malformed_trace_context"
BASIS_NONE: Final = "none"
CORRELATION_BASES: Final = (BASIS_PROPAGATED, BASIS_MALFORMED, BASIS_NONE)
SOURCE_CLASS_PROPAGATED: Final = "propagated"

# --- side-effect ladder ---------------------------------------------------------

LEVEL_ASSERTED: Final = "asserted"
LEVEL_OBSERVED_CONFIRMED: Final = "observed_confirmed"
LEVEL_VERIFIED: Final = "verified"
SIDE_EFFECT_LEVELS: Final = (LEVEL_ASSERTED, LEVEL_OBSERVED_CONFIRMED, LEVEL_VERIFIED)

SOURCE_OBSERVED_READ_FOLLOWUP: Final = "observed_read_followup"
SOURCE_PROVIDER_AUDIT_IMPORT: Final = "provider_audit_import"
VERIFICATION_SOURCES: Final = (SOURCE_OBSERVED_READ_FOLLOWUP, SOURCE_PROVIDER_AUDIT_IMPORT)

IRREVERSIBILITY_CLASSES: Final = (
    "two_way",
    "one_way_recoverable",
    "one_way_consequential",
    "one_way_terminal",
)

AUDIT_OUTCOMES: Final = ("bound", "record_inconsistent", "binds_different_call", "not_projectable")

CLAIM_GATE_DECISIONS: Final = ("allowed", "degraded", "blocked")
#: The published ceiling ladder, weakest first.
CLAIM_CEILINGS: Final = (
    "asserted",
    "asserted_signed",
    "observed_at_receiver",
    "observed_in_path",
    "independently_confirmed",
)
WEAKEST_CEILING_STATES: Final = ("nothing_claimed", "blocked", "rung")

VERIFICATION_CLAIMS_NOT_MADE: Final = (
    "provider_query",
    "audit_record_authenticity_beyond_its_own_signature",
    "effect_persistence_after_the_observed_call",
)
