"""Assay-format MCP policies read the way the reference reads them (evidence-formats.md §4, 2.5).

Invariant: a policy that reaches the truth layer has been through exactly one of
the two readings the reference has, and we say which:

* ``parse_assay_policy(text)`` is the *file* reading (Assay's ``from_file`` /
  ``from_slice``, used by its live producer). Legacy root ``allow``/``deny`` are
  appended to ``tools.allow``/``tools.deny``, and **non-empty** legacy
  ``constraints`` are migrated at load with a plain insert, so a migrated schema
  *overwrites* an explicit schema for the same tool (the 2.5 caveat, reproduced on
  purpose: the declared digest of a file must equal Assay's for the same file).
* ``normalize_assay_policy(policy)`` is the *declared view* of an already-parsed
  dict (Assay's ``normalized_declared_view_experimental`` over a policy built with
  ``serde_json::from_value``, as its conformance vectors are). Legacy shapes are
  merged, migration always runs, and an explicit schema wins over a migrated one.

Both return the same plain-dict shape, and the declared view of a file reading is
the file reading's own normalization, so ``normalize_assay_policy(parse_assay_policy(t))``
is what Assay's producer digests and evaluates for the file ``t``.

Theory of operation.

1. Text -> JSON value (``assay_yaml``): YAML (JSON is YAML) converted node by node
   by us, with a line and column for every path; spellings whose meaning differs
   between YAML readers are refused, with the line.
2. JSON value -> checked policy (``assay_fields``): the field types of Assay's
   ``McpPolicy`` are enforced; unknown fields are ignored (``unknown_policy_fields``
   lists them), and the operational sections never reach a digest or a verdict.
3. Legacy shapes. Root ``allow``/``deny`` are appended after the ``tools`` lists,
   creating the list if absent and keeping duplicates. Constraints come in a
   list shape ``[{tool, params: {arg: {matches}}}]`` or a map shape
   ``{tool: {arg: regex | {matches}}}`` (map tools in sorted order); each becomes
   ``{"type":"object","additionalProperties":true,"properties":{arg:{"type":"string",
   "pattern":regex,"minLength":1}},"required":[args in sorted order]}``, params
   without ``matches`` skipped. A version of ``""`` or ``"1.0"`` becomes ``"2.0"``
   whenever migration runs.
4. The file reading then validates what Assay validates at load
   (``Checker.validate_loaded``): tool-pin hashes are 64 lowercase hex, and
   kill-switch triggers name existing monitor rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drawbridge.evidence.truth.assay_errors import AssayPolicyError
from drawbridge.evidence.truth.assay_fields import CheckedPolicy, Checker
from drawbridge.evidence.truth.assay_yaml import load_text

__all__ = ["normalize_assay_policy", "parse_assay_policy"]


# --- 3. legacy shapes -----------------------------------------------------------------------


def _merge_legacy_lists(policy: CheckedPolicy) -> None:
    for key in ("allow", "deny"):
        legacy = getattr(policy, key)
        if legacy is not None:
            policy.tools[key] = [*policy.tools.get(key, []), *legacy]
            setattr(policy, key, None)


def _constraint_schema(params: Mapping[str, str | None]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for arg in sorted(params):  # code-point order == the reference's byte order
        pattern = params[arg]
        if pattern is None:
            continue
        properties[arg] = {"type": "string", "pattern": pattern, "minLength": 1}
        required.append(arg)
    return {"type": "object", "additionalProperties": True, "properties": properties, "required": required}


def _migrate_constraints(policy: CheckedPolicy) -> None:
    """Insert one schema per constraint (later ones overwrite), then normalize the version."""
    for tool, params in policy.constraints:
        policy.schemas[tool] = _constraint_schema(params)
    policy.constraints = []
    if policy.version in ("", "1.0"):
        policy.version = "2.0"


def _public(policy: CheckedPolicy) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version": policy.version,
        "name": policy.name,
        "tools": policy.tools,
        "schemas": policy.schemas,
        "enforcement": {"unconstrained_tools": policy.unconstrained_tools},
    }
    out.update(policy.operational)
    return out


# --- public ---------------------------------------------------------------------------------


def parse_assay_policy(text: str | bytes, *, deny_deprecations: bool = False) -> dict[str, Any]:
    """Read an Assay policy file's text the way Assay's ``from_file`` does.

    File reading (see the module docstring): non-empty legacy constraints are
    migrated here and *overwrite* explicit schemas of the same tool, as in the
    reference, so a digest of this result equals Assay's digest of that file.
    ``deny_deprecations`` refuses v1 policies (constraints, or version
    ``"1.0"``), as Assay's ``--deny-deprecations`` does. Raises
    ``AssayPolicyError`` with a line and column where the text has one.
    """
    raw, positions = load_text(text)
    checker = Checker(positions)
    policy = checker.read(raw)
    if deny_deprecations and (policy.constraints or policy.version == "1.0"):
        raise AssayPolicyError(
            "v1 policy format (constraints or version \"1.0\") is refused: deprecations are denied",
            kind="deprecated",
        )
    _merge_legacy_lists(policy)
    if policy.constraints:
        _migrate_constraints(policy)
    checker.validate_loaded(policy)
    return _public(policy)


def normalize_assay_policy(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The normalized declared view of an already-parsed policy dict.

    Declared-view reading (see the module docstring): legacy lists merged,
    constraints always migrated, version normalized, and an explicit schema wins
    over a migrated one. Idempotent, and a fresh copy: the input is not touched.
    Both the declared digest and the verdict gate read a policy through this.
    """
    policy_ = Checker({}).read(policy)
    _merge_legacy_lists(policy_)
    explicit = dict(policy_.schemas)
    _migrate_constraints(policy_)
    policy_.schemas.update(explicit)
    return _public(policy_)
