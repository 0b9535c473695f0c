"""The verdict gate (evidence-formats.md §2.7, 2.8): every axis, every branch, the schema check, the run."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.evidence.truth import (
    AXES,
    JSON_NULL,
    VERDICTS,
    ArgsCheck,
    AssayPolicyError,
    Evidence,
    check_tool_args,
    decision_axes,
    decision_verdict,
    lattice_max,
    run_verdict,
    verdict_rank,
)

BASE = {
    "version": "1",
    "tools": {"allow": ["read_file", "deploy"], "deny": ["delete_all"]},
    "schemas": {
        "deploy": {
            "type": "object",
            "required": ["env"],
            "properties": {"env": {"enum": ["staging", "prod"]}},
        }
    },
    "enforcement": {"unconstrained_tools": "warn"},
}
NONE = Evidence()


def axes(
    policy: dict, tool: str = "t", args: Any = None, identity: str = "present", evidence: Evidence = NONE
) -> dict:
    return decision_axes(policy, tool, {} if args is None else args, identity, evidence)


def open_policy(**tools: Any) -> dict:
    """A policy whose only declarations are ``tools``; unconstrained tools are allowed."""
    return {"version": "2.0", "tools": tools, "enforcement": {"unconstrained_tools": "allow"}}


# --- the lattice ------------------------------------------------------------------------------


def test_vocabulary_and_ranks() -> None:
    assert VERDICTS == ("match", "incomplete", "mismatch", "invalid")
    assert [verdict_rank(v) for v in VERDICTS] == [0, 1, 2, 3]
    for unknown in ("", "MATCH", "ok", None, 0, ["match"]):
        assert verdict_rank(unknown) == 3


def test_lattice_max_takes_arguments_or_one_iterable() -> None:
    assert lattice_max() == "match"
    assert lattice_max([]) == "match"
    assert lattice_max("match", "incomplete") == "incomplete"
    assert lattice_max(["incomplete", "mismatch", "match"]) == "mismatch"
    assert lattice_max(iter(["match", "bogus"])) == "invalid"
    assert lattice_max("mismatch") == "mismatch"


def test_the_seven_axes_are_named_in_order() -> None:
    assert AXES == ("tool", "args", "identity", "class", "approval", "scope", "redaction")
    assert tuple(axes(open_policy())) == AXES


# --- the reference's matrix over the base policy -------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "identity", "expected"),
    [
        ("deploy", {"env": "staging"}, "present", "match"),
        ("deploy", {"env": "prod"}, "absent", "match"),
        ("delete_all", {}, "present", "mismatch"),
        ("exfiltrate", {}, "present", "mismatch"),
        ("deploy", {"env": "dev"}, "present", "mismatch"),
        ("deploy", None, "present", "incomplete"),
        ("read_file", {"path": "/x"}, "present", "incomplete"),
        ("deploy", {"env": "staging"}, "required_missing", "incomplete"),
        ("deploy", {"env": "staging"}, "invalid", "invalid"),
    ],
)
def test_base_policy_matrix(tool: str, args: Any, identity: str, expected: str) -> None:
    assert decision_verdict(BASE, tool, args, identity, NONE) == expected


def test_verdict_is_the_lattice_max_of_the_axes() -> None:
    got = decision_axes(BASE, "deploy", {"env": "dev"}, "required_missing", NONE)
    assert got == {
        "tool": "match",
        "args": "mismatch",
        "identity": "incomplete",
        "class": "match",
        "approval": "match",
        "scope": "match",
        "redaction": "match",
    }
    assert decision_verdict(BASE, "deploy", {"env": "dev"}, "required_missing", NONE) == "mismatch"


# --- 1. tool axis ---------------------------------------------------------------------------


def test_tool_axis_branches() -> None:
    deny_and_allow = open_policy(allow=["delete_*"], deny=["delete_*"])
    assert axes(deny_and_allow, "delete_all")["tool"] == "mismatch"  # deny wins over allow
    assert axes(open_policy(deny=["delete_*"]), "delete_all")["tool"] == "mismatch"
    assert axes(open_policy(deny=["delete_*"]), "read_file")["tool"] == "match"  # falls to the mode
    assert axes(open_policy(allow=["read_*"]), "read_file")["tool"] == "match"
    assert axes(open_policy(allow=["read_*"]), "write_file")["tool"] == "mismatch"
    # an interior star is literal: in deny it blocks nothing
    assert axes(open_policy(deny=["read_*_file"]), "read_config_file")["tool"] == "match"


MODES = [("deny", "mismatch"), ("allow", "match"), ("warn", "incomplete")]


@pytest.mark.parametrize(("mode", "expected"), MODES)
def test_tool_axis_without_allowlist_follows_the_unconstrained_mode(mode: str, expected: str) -> None:
    policy = {"tools": {"allow": [], "allow_classes": ["fs"]}, "enforcement": {"unconstrained_tools": mode}}
    # an empty allow list is no allowlist, and class allowlists play no part on this axis
    assert axes(policy, "anything")["tool"] == expected


def test_legacy_root_lists_count_on_the_tool_axis() -> None:
    policy = {"allow": ["a"], "deny": ["b"], "enforcement": {"unconstrained_tools": "allow"}}
    assert axes(policy, "a")["tool"] == "match"
    assert axes(policy, "b")["tool"] == "mismatch"
    assert axes(policy, "c")["tool"] == "mismatch"


# --- 2. args axis ---------------------------------------------------------------------------


def test_args_axis_branches() -> None:
    assert decision_axes(BASE, "deploy", None, "present", NONE)["args"] == "incomplete"  # not captured
    assert axes(BASE, "deploy", {"env": "prod"})["args"] == "match"
    assert axes(BASE, "deploy", {"env": "dev"})["args"] == "mismatch"
    assert axes(BASE, "deploy", {})["args"] == "mismatch"
    malformed = open_policy(allow=["t"]) | {"schemas": {"t": {"$ref": "#/$defs/missing"}}}
    assert axes(malformed, "t")["args"] == "invalid"
    assert decision_verdict(malformed, "t", {}, "present", NONE) == "invalid"


@pytest.mark.parametrize(("mode", "expected"), MODES)
def test_args_axis_without_schema_follows_the_unconstrained_mode(mode: str, expected: str) -> None:
    policy = {"schemas": {"$defs": {"x": {"type": "string"}}}, "enforcement": {"unconstrained_tools": mode}}
    assert axes(policy, "no_schema_tool")["args"] == expected
    assert axes(policy, "$defs")["args"] == expected  # the shared definitions are never a tool


def test_json_null_arguments_are_captured_and_checked() -> None:
    policy = {"schemas": {"t": {"type": "null"}, "u": {"type": "object"}}}
    assert decision_axes(policy, "t", JSON_NULL, "present", NONE)["args"] == "match"
    assert decision_axes(policy, "u", JSON_NULL, "present", NONE)["args"] == "mismatch"
    assert decision_axes(policy, "u", None, "present", NONE)["args"] == "incomplete"
    assert check_tool_args(policy, "t", None) is ArgsCheck.VALID
    assert check_tool_args(policy, "t", JSON_NULL) is ArgsCheck.VALID


def test_legacy_constraints_are_evaluated_on_the_args_axis() -> None:
    policy = open_policy(allow=["deploy"]) | {
        "constraints": [{"tool": "deploy", "params": {"env": {"matches": "^prod$"}}}]
    }
    assert decision_verdict(policy, "deploy", {"env": "prod"}, "present", NONE) == "match"
    assert decision_verdict(policy, "deploy", {"env": "staging"}, "present", NONE) == "mismatch"
    assert decision_verdict(policy, "deploy", {"env": ""}, "present", NONE) == "mismatch"  # minLength 1


def test_args_axis_uses_the_explicit_schema_over_a_migrated_constraint() -> None:
    policy = open_policy() | {
        "schemas": {"deploy": {"type": "object"}},
        "constraints": [{"tool": "deploy", "params": {"env": {"matches": "^prod$"}}}],
    }
    assert decision_verdict(policy, "deploy", {"env": "staging"}, "present", NONE) == "match"


# --- 3. identity axis -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("present", "match"),
        ("absent", "match"),
        ("required_missing", "incomplete"),
        ("invalid", "invalid"),
        ("unknown_state", "invalid"),
        ("", "invalid"),
        (None, "invalid"),
    ],
)
def test_identity_axis(state: Any, expected: str) -> None:
    assert axes(open_policy(), identity=state)["identity"] == expected


# --- 4. class axis --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "classes", "expected"),
    [
        ({}, None, "match"),  # nothing declared: not applicable
        ({"deny_classes": [], "allow_classes": []}, None, "match"),
        ({"deny_classes": ["network"]}, None, "incomplete"),  # declared, not observed
        ({"allow_classes": ["fs"]}, None, "incomplete"),
        ({"deny_classes": ["network"]}, ("network",), "mismatch"),
        ({"deny_classes": ["network"]}, ("fs",), "match"),
        ({"deny_classes": ["network"]}, (), "match"),
        ({"allow_classes": ["fs"]}, ("fs", "x"), "match"),
        ({"allow_classes": ["fs"]}, ("network",), "mismatch"),
        ({"allow_classes": ["fs"]}, (), "mismatch"),
        ({"allow_classes": ["fs"], "deny_classes": ["network"]}, ("fs", "network"), "mismatch"),  # deny first
        ({"allow_classes": ["fs*"]}, ("fs",), "mismatch"),  # classes compare exactly, not as patterns
    ],
)
def test_class_axis(tools: dict, classes: tuple | None, expected: str) -> None:
    assert axes(open_policy(**tools), evidence=Evidence(tool_classes=classes))["class"] == expected


# --- 5-7. obligation axes -------------------------------------------------------------------

OBLIGATIONS = [
    ("approval", "approval_required", "approval_obtained"),
    ("scope", "restrict_scope", "scope_satisfied"),
    ("redaction", "redact_args", "redaction_applied"),
]


@pytest.mark.parametrize(("axis", "names_key", "flag"), OBLIGATIONS)
@pytest.mark.parametrize(
    ("names", "classes", "observed", "satisfied", "expected"),
    [
        # applicable by name pattern: the evidence decides
        (["pa*"], [], None, None, "incomplete"),
        (["pa*"], [], None, True, "match"),
        (["pa*"], [], None, False, "mismatch"),
        (["pay"], ["money"], ("other",), False, "mismatch"),  # a name match needs no class evidence
        # not applicable: no name match and no classes declared, whatever the evidence says
        (["other"], [], None, False, "match"),
        ([], [], None, None, "match"),
        # classes declared but not observed: cannot tell whether it applies
        ([], ["money"], None, True, "incomplete"),
        # applicable by an observed class
        ([], ["money"], ("money",), None, "incomplete"),
        ([], ["money"], ("x", "money"), True, "match"),
        ([], ["money"], ("money",), False, "mismatch"),
        # classes declared, observed, none listed: not applicable
        ([], ["money"], ("fs",), False, "match"),
        ([], ["money"], (), None, "match"),
    ],
)
def test_obligation_axes(
    axis: str,
    names_key: str,
    flag: str,
    names: list,
    classes: list,
    observed: tuple | None,
    satisfied: bool | None,
    expected: str,
) -> None:
    policy = open_policy(**{names_key: names, names_key + "_classes": classes})
    evidence = Evidence(tool_classes=observed, **{flag: satisfied})
    got = axes(policy, "pay", evidence=evidence)
    assert got[axis] == expected
    others = [a for a, _, _ in OBLIGATIONS if a != axis]
    assert all(got[other] == "match" for other in others)  # each obligation reads its own flag


def test_the_reference_approval_cases() -> None:
    approval = {
        "version": "1",
        "tools": {"allow": ["pay"], "approval_required": ["pay"]},
        "enforcement": {"unconstrained_tools": "allow"},
    }
    for evidence, expected in [
        (None, "incomplete"),
        ({"approval_obtained": True}, "match"),
        ({"approval_obtained": False}, "mismatch"),
    ]:
        got = decision_verdict(approval, "pay", {"amount": 10}, "present", Evidence.from_json(evidence))
        assert got == expected


# --- the schema check -----------------------------------------------------------------------


def check(schemas: dict, tool: str = "t", args: Any = None) -> ArgsCheck:
    return check_tool_args({"schemas": schemas}, tool, {} if args is None else args)


def test_shared_defs_are_copied_into_a_schema_without_defs() -> None:
    schemas = {"$defs": {"name": {"type": "string"}}, "t": {"properties": {"n": {"$ref": "#/$defs/name"}}}}
    assert check(schemas, args={"n": "x"}) is ArgsCheck.VALID
    assert check(schemas, args={"n": 1}) is ArgsCheck.INVALID


def test_shared_defs_merge_into_local_defs() -> None:
    schemas = {
        "$defs": {"shared": {"type": "string"}},
        "t": {
            "$defs": {"local": {"type": "integer"}},
            "type": "object",
            "properties": {"name": {"$ref": "#/$defs/shared"}, "count": {"$ref": "#/$defs/local"}},
            "required": ["name", "count"],
        },
    }
    assert check(schemas, args={"name": "item", "count": 1}) is ArgsCheck.VALID
    assert check(schemas, args={"name": "item", "count": "1"}) is ArgsCheck.INVALID


@pytest.mark.parametrize(
    "schemas",
    [
        {"$defs": [], "t": {"type": "object"}},  # shared $defs not a mapping
        {"$defs": None, "t": {"type": "object"}},
        {  # a shared and a local definition of the same name
            "$defs": {"id": {"type": "string"}},
            "t": {"$defs": {"id": {"type": "integer"}}, "$ref": "#/$defs/id"},
        },
        {"$defs": {"a": {}}, "t": {"$defs": [], "type": "object"}},  # local $defs not a mapping
        {"$defs": {"a": {}}, "t": {"$defs": None}},
        {"$defs": {"bad": {"type": "nonsense"}}, "t": True},  # boolean schema: shared defs must compile alone
    ],
)
def test_defs_rules_that_make_a_schema_malformed(schemas: dict) -> None:
    assert check(schemas) is ArgsCheck.MALFORMED


def test_defs_rules_that_do_not() -> None:
    assert check({"$defs": {"ok": {"type": "string"}}, "t": True}) is ArgsCheck.VALID
    assert check({"$defs": {"ok": {}}, "t": False}) is ArgsCheck.INVALID
    assert check({"$defs": [], "u": {}}, tool="t") is ArgsCheck.NO_SCHEMA  # only a checked tool fails
    assert check({"t": {"$defs": [], "type": "object"}, "u": {}}, tool="u") is ArgsCheck.VALID
    assert check({"$weird": {"type": "object"}}, tool="$weird") is ArgsCheck.VALID  # only "$defs" is special


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "https://example.invalid/external-schema"},  # remote: never retrieved
        {"$ref": "other.json"},
        {"$ref": "#/$defs/missing"},  # unresolvable
        {"properties": {"unused": {"$ref": "#/$defs/missing"}}},  # resolved at compile time, not when reached
        {"$defs": {"a": {"$ref": "https://example.invalid/x"}}},  # remote anywhere in the document
        {"$dynamicRef": "#nowhere"},
        {"$schema": "https://example.invalid/custom-dialect"},
        {"type": "nonsense"},  # fails its meta-schema
        {"pattern": "("},  # a regex that does not compile
        5,
        "object",
        None,
    ],
)
def test_schemas_that_do_not_compile_are_malformed(schema: Any) -> None:
    assert check({"t": schema}) is ArgsCheck.MALFORMED
    policy = open_policy() | {"schemas": {"t": schema}}
    assert decision_verdict(policy, "t", {}, "present", NONE) == "invalid"


def test_references_that_resolve_locally_compile() -> None:
    tree = {"type": "object", "properties": {"child": {"$ref": "#"}}}
    assert check({"t": tree}, args={"child": {"child": {}}}) is ArgsCheck.VALID
    assert check({"t": tree}, args={"child": {"child": 1}}) is ArgsCheck.INVALID
    anchored = {"$defs": {"n": {"$anchor": "num", "type": "number"}}, "properties": {"x": {"$ref": "#num"}}}
    assert check({"t": anchored}, args={"x": 1}) is ArgsCheck.VALID
    assert check({"t": anchored}, args={"x": "1"}) is ArgsCheck.INVALID
    embedded = {
        "$id": "https://example.invalid/root",
        "$defs": {"item": {"$id": "item", "type": "string"}},
        "items": {"$ref": "item"},
    }
    assert check({"t": embedded}, args=["a"]) is ArgsCheck.VALID
    meta = {"$ref": "https://json-schema.org/draft/2020-12/schema"}  # bundled meta-schemas resolve
    assert check({"t": meta}, args={"type": "string"}) is ArgsCheck.VALID


def test_dialect_follows_dollar_schema() -> None:
    draft7_tuple = {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}
    assert check({"t": draft7_tuple}, args=["a"]) is ArgsCheck.VALID
    assert check({"t": draft7_tuple}, args=[1]) is ArgsCheck.INVALID
    # formats assert for drafts 4/6/7 and are annotations in 2020-12
    draft7_ipv4 = {"$schema": "http://json-schema.org/draft-07/schema#", "format": "ipv4"}
    assert check({"t": draft7_ipv4}, args="not an address") is ArgsCheck.INVALID
    assert check({"t": {"format": "ipv4"}}, args="not an address") is ArgsCheck.VALID


# --- the run --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdicts", "orders", "expected"),
    [
        ([], [], "match"),
        (["match"], [0], "match"),
        (["match", "incomplete"], [0, 1], "incomplete"),
        (["match", "mismatch"], [0, 1], "mismatch"),
        (["match", "mismatch", "invalid"], [0, 1, 2], "invalid"),
        (["incomplete", "match"], [5, -3], "incomplete"),  # orders need not be contiguous or sorted
        (["match"], [0, 1], "invalid"),  # more orders than verdicts
        (["match", "match"], [0], "invalid"),  # more verdicts than orders
        ([], [0], "invalid"),
        (["match", "match"], [0, 0], "invalid"),  # duplicate order
        (["match", "match", "match"], [1, 2, 1], "invalid"),
        (["match", "bogus"], [0, 1], "invalid"),  # unknown strings rank as invalid
        (["match", "MATCH"], [0, 1], "invalid"),
        (["match"], [0.0], "invalid"),  # an order is an integer
        (["match"], [True], "invalid"),
    ],
)
def test_run_verdict(verdicts: list, orders: list, expected: str) -> None:
    assert run_verdict(verdicts, orders) == expected


@given(st.lists(st.sampled_from(VERDICTS), max_size=8))
def test_run_verdict_is_the_lattice_max_of_distinct_orders(verdicts: list[str]) -> None:
    worst = max(verdicts, key=VERDICTS.index, default="match")
    assert run_verdict(verdicts, list(range(len(verdicts)))) == worst


# --- evidence -------------------------------------------------------------------------------


def test_evidence_from_json() -> None:
    assert Evidence.from_json(None) == Evidence()
    assert Evidence.from_json({}) == Evidence()
    full = {
        "tool_classes": ["a", "b"],
        "approval_obtained": True,
        "scope_satisfied": False,
        "redaction_applied": None,
    }
    got = Evidence.from_json(full)
    assert got == Evidence(tool_classes=("a", "b"), approval_obtained=True, scope_satisfied=False)
    assert got.to_json() == full
    assert Evidence.from_json({"tool_classes": []}).tool_classes == ()
    assert Evidence.from_json({"unrelated": 1}) == Evidence()


@pytest.mark.parametrize(
    "obj",
    [
        {"tool_classes": ["a", 1]},  # would silently drop a class
        {"tool_classes": "a"},
        {"approval_obtained": "yes"},
        {"scope_satisfied": 1},
        {"redaction_applied": 0},
        ["approval_obtained"],
    ],
)
def test_evidence_of_the_wrong_type_is_refused(obj: Any) -> None:
    with pytest.raises(ValueError):
        Evidence.from_json(obj)


def test_evidence_is_frozen_and_typed() -> None:
    assert Evidence(tool_classes=["a"]).tool_classes == ("a",)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Evidence(tool_classes="fs")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Evidence(approval_obtained=1)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        Evidence().approval_obtained = True  # type: ignore[misc]


def test_an_unreadable_policy_raises_rather_than_judging() -> None:
    with pytest.raises(AssayPolicyError):
        decision_verdict({"tools": {"allow": "deploy"}}, "deploy", {}, "present", NONE)
    with pytest.raises(TypeError):
        decision_verdict(BASE, None, {}, "present", NONE)  # type: ignore[arg-type]
