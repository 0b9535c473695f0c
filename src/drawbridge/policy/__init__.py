"""The native policy engine: model, strict loading, evaluation, argument schemas, provenance.

Pure core: ``model``, ``globs``, ``conditions``, ``regexes``, ``schemas``, ``strict_yaml`` (the one
strict YAML reading, which the configuration shares), ``load``, ``expectations`` (tables of
``policy test``), ``evaluate``,
``edit`` (per-tool edit plans, reading the file's layout in ``edit_layout`` and splicing its lines in
``edit_splice``), ``declared`` and ``assay`` (the Assay-format conversion). Reading
the files, hot reload and applying edits are the shell's (``drawbridge.state.policy_files``,
``policy_store``, ``policy_edits``). The file format is documented in docs/policy-format.md.
"""

from drawbridge.policy.conditions import ConditionError, compile_condition, compile_regex
from drawbridge.policy.evaluate import Candidate, ToolView, candidate_rules, evaluate, explain
from drawbridge.policy.globs import Glob, GlobError, GlobKind, compile_glob
from drawbridge.policy.load import (
    PolicyLoadError,
    PolicySource,
    is_assay_format,
    load_policies,
    load_policy_text,
    parse_policy,
)
from drawbridge.policy.model import (
    DEFAULT_DENY,
    Action,
    Approver,
    Basis,
    Condition,
    Decision,
    Op,
    Policy,
    PolicySet,
    Rule,
    ToolSchema,
    Truth,
    stricter,
)
from drawbridge.policy.schemas import SchemaLoadError, Violation, check_arguments, compile_schema

__all__ = [
    "DEFAULT_DENY",
    "Action",
    "Approver",
    "Basis",
    "Candidate",
    "Condition",
    "ConditionError",
    "Decision",
    "Glob",
    "GlobError",
    "GlobKind",
    "Op",
    "Policy",
    "PolicyLoadError",
    "PolicySet",
    "PolicySource",
    "Rule",
    "SchemaLoadError",
    "ToolSchema",
    "ToolView",
    "Truth",
    "Violation",
    "candidate_rules",
    "check_arguments",
    "compile_condition",
    "compile_glob",
    "compile_regex",
    "compile_schema",
    "evaluate",
    "explain",
    "is_assay_format",
    "load_policies",
    "load_policy_text",
    "parse_policy",
    "stricter",
]
