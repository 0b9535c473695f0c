"""The declared side of tool-decision truth: reading Assay policies and the declared digest (2.5, 4)."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.evidence.truth import (
    TOOL_LIST_FIELDS,
    UNCONSTRAINED_MODES,
    AssayPolicyError,
    declared_policy_digest,
    declared_view,
    normalize_assay_policy,
    parse_assay_policy,
    unknown_policy_fields,
)


def sha(preimage: str) -> str:
    return "sha256:" + hashlib.sha256(preimage.encode("utf-8")).hexdigest()


# The four declared policies of the reference's conformance vectors.
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
PATTERN_DENY = {
    "version": "1",
    "tools": {"deny": ["delete_*"]},
    "enforcement": {"unconstrained_tools": "allow"},
}
APPROVAL = {
    "version": "1",
    "tools": {"allow": ["pay"], "approval_required": ["pay"]},
    "enforcement": {"unconstrained_tools": "allow"},
}
MALFORMED_SCHEMA = {
    "version": "1",
    "tools": {"allow": ["t"]},
    "schemas": {"t": {"$ref": "#/$defs/missing"}},
    "enforcement": {"unconstrained_tools": "allow"},
}

BASE_PREIMAGE = (
    '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{"deploy":{"properties":{"env":{"enum":'
    '["prod","staging"]}},"required":["env"],"type":"object"}},"tools":{"allow":["deploy","read_file"],'
    '"deny":["delete_all"]},"version":"1"}'
)
BASE_DIGEST = "sha256:4c3c6a7a02a1877c0c68ea389e4c6234aff49db88827d3a8ef67d1e992e98e6f"
EMPTY_VIEW = '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{},"tools":{},"version":"2.0"}'


# --- the reference's digests ------------------------------------------------------------------


def test_base_preimage_and_digest_are_the_reference_values() -> None:
    assert sha(BASE_PREIMAGE) == BASE_DIGEST  # the page's preimage hashes to the page's digest
    assert json.loads(BASE_PREIMAGE) == declared_view(BASE)
    assert declared_policy_digest(BASE) == BASE_DIGEST


@pytest.mark.parametrize(
    ("policy", "head", "tail"),
    [
        (PATTERN_DENY, "sha256:06166718", "89d3"),
        (APPROVAL, "sha256:d424c137", "1311"),
        (MALFORMED_SCHEMA, "sha256:57ee3491", "2ab6"),
    ],
)
def test_other_vector_policies_match_the_reference_digests(policy: dict, head: str, tail: str) -> None:
    digest = declared_policy_digest(policy)
    assert digest.startswith(head) and digest.endswith(tail) and len(digest) == 71


def test_base_read_from_yaml_text_has_the_same_digest() -> None:
    text = """
version: "1"
tools:
  allow: [read_file, deploy]
  deny:
    - delete_all
schemas:
  deploy:
    type: object
    required: [env]
    properties:
      env: {enum: [staging, prod]}
enforcement:
  unconstrained_tools: warn
"""
    assert declared_policy_digest(parse_assay_policy(text)) == BASE_DIGEST
    assert declared_policy_digest(parse_assay_policy(json.dumps(BASE))) == BASE_DIGEST
    assert declared_policy_digest(parse_assay_policy(json.dumps(BASE).encode())) == BASE_DIGEST


# --- the projection ---------------------------------------------------------------------------


def test_empty_policy_projects_every_always_present_field() -> None:
    assert declared_view({}) == json.loads(EMPTY_VIEW)
    assert declared_policy_digest({}) == sha(EMPTY_VIEW)


def test_set_like_lists_sort_by_jcs_text_not_by_raw_string() -> None:
    # JCS escapes U+0001 as \u0001, whose backslash (0x5c) sorts after "[" (0x5b).
    view = declared_view({"version": "2", "tools": {"deny_classes": ["\u0001", "[", "é", "a"]}})
    assert view["tools"] == {"deny_classes": ["[", "\u0001", "a", "é"]}
    preimage = (
        '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{},'
        '"tools":{"deny_classes":["[","\\u0001","a","é"]},"version":"2"}'
    )
    reordered = {"version": "2", "tools": {"deny_classes": ["é", "[", "a", "\u0001"]}}
    assert declared_policy_digest(reordered) == sha(preimage)


def test_all_ten_lists_are_in_the_surface_and_contracts_are_not() -> None:
    tools = {key: ["b", "a"] for key in TOOL_LIST_FIELDS}
    view = declared_view({"tools": tools})
    assert view["tools"] == {key: ["a", "b"] for key in TOOL_LIST_FIELDS}
    for key in TOOL_LIST_FIELDS:
        without = {k: v for k, v in tools.items() if k != key}
        assert declared_policy_digest({"tools": without}) != declared_policy_digest({"tools": tools})
    with_contracts = {
        **tools,
        "restrict_scope_contract": {"scope_type": "repo", "scope_value": "x", "scope_match_mode": "exact"},
        "redact_args_contract": {
            "redaction_target": "a",
            "redaction_mode": "drop",
            "redaction_scope": "request",
        },
    }
    assert declared_policy_digest({"tools": with_contracts}) == declared_policy_digest({"tools": tools})


def test_null_lists_are_omitted_and_empty_lists_are_kept() -> None:
    assert declared_view({"tools": {"allow": None, "deny": []}})["tools"] == {"deny": []}
    assert declared_policy_digest({"tools": {"deny": []}}) == sha(
        '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{},"tools":{"deny":[]},"version":"2.0"}'
    )


def test_operational_fields_do_not_move_the_digest() -> None:
    loaded = {
        **BASE,
        "name": "prod policy",
        "limits": {"max_requests_total": 10, "max_tool_calls_total": 5},
        "signatures": {"check_descriptions": True},
        "tool_pins": {
            "deploy": {"server_id": "s", "tool_name": "deploy", "schema_hash": "x", "meta_hash": "y"}
        },
        "tool_classes": {"deploy": ["release"]},
        "discovery": {"enabled": True},
        "runtime_monitor": {"enabled": True},
        "kill_switch": {"enabled": False},
        "some_future_knob": [1, 2, 3],
    }
    assert declared_policy_digest(loaded) == BASE_DIGEST


def test_schema_normalization_is_flat() -> None:
    schema = {
        "type": "object",
        "required": ["b", "a"],
        "properties": {
            "x": {"enum": [2, "a", 1, None, True]},
            "y": {"items": {"enum": ["b", "a"]}},
            "z": True,
        },
        "items": {"enum": ["z", "y"]},
        "$defs": {"d": {"required": ["q", "p"]}},
    }
    view = declared_view({"schemas": {"t": schema, "u": 5, "$defs": {"required": ["b", "a"]}}})
    assert view["schemas"] == {
        "t": {
            "type": "object",
            "required": ["a", "b"],
            # JCS texts "a" < 1 < 2 < null < true (first bytes 0x22 0x31 0x32 0x6e 0x74)
            "properties": {
                "x": {"enum": ["a", 1, 2, None, True]},
                "y": {"items": {"enum": ["b", "a"]}},
                "z": True,
            },
            "items": {"enum": ["z", "y"]},
            "$defs": {"d": {"required": ["q", "p"]}},
        },
        "u": 5,
        "$defs": {"required": ["a", "b"]},  # "$defs" is an ordinary key to the projection
    }
    nested_reordered = copy.deepcopy(schema)
    nested_reordered["items"]["enum"] = ["y", "z"]
    assert declared_policy_digest({"schemas": {"t": schema}}) != declared_policy_digest(
        {"schemas": {"t": nested_reordered}}
    )


def test_membership_change_moves_the_digest() -> None:
    grown = copy.deepcopy(BASE)
    grown["tools"]["allow"].append("list_dir")
    assert declared_policy_digest(grown) != BASE_DIGEST
    duplicated = copy.deepcopy(BASE)
    duplicated["tools"]["allow"].append("deploy")
    assert declared_policy_digest(duplicated) != BASE_DIGEST  # duplicates are kept, not deduplicated


# --- legacy shapes --------------------------------------------------------------------------


def test_root_allow_and_deny_are_appended_after_tools_lists_keeping_duplicates() -> None:
    policy = {"version": "2.0", "tools": {"allow": ["b", "a"]}, "allow": ["a", "c"], "deny": ["x"]}
    normalized = normalize_assay_policy(policy)
    assert normalized["tools"] == {"allow": ["b", "a", "a", "c"], "deny": ["x"]}
    assert "allow" not in normalized and "deny" not in normalized
    assert declared_policy_digest(policy) == sha(
        '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{},'
        '"tools":{"allow":["a","a","b","c"],"deny":["x"]},"version":"2.0"}'
    )


def test_root_empty_allow_creates_an_empty_tools_allow_and_null_creates_nothing() -> None:
    assert normalize_assay_policy({"allow": []})["tools"] == {"allow": []}
    assert normalize_assay_policy({"allow": None})["tools"] == {}
    assert declared_policy_digest({"allow": []}) == sha(
        '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{},"tools":{"allow":[]},"version":"2.0"}'
    )


def migrated(required: list[str], patterns: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": True,
        "properties": {arg: {"type": "string", "pattern": p, "minLength": 1} for arg, p in patterns.items()},
        "required": required,
    }


def test_list_shape_constraints_migrate_with_sorted_required_and_skip_params_without_matches() -> None:
    policy = {
        "version": "1.0",
        "constraints": [
            {
                "tool": "deploy",
                "params": {"region": {"matches": "^eu-"}, "env": {"matches": "^prod$"}, "note": {}},
            },
            {"tool": "scale", "params": {"n": {"matches": "^[0-9]+$", "other": 1}}, "comment": "ignored"},
        ],
    }
    normalized = normalize_assay_policy(policy)
    assert normalized["version"] == "2.0"
    assert "constraints" not in normalized
    assert normalized["schemas"] == {
        "deploy": migrated(["env", "region"], {"env": "^prod$", "region": "^eu-"}),
        "scale": migrated(["n"], {"n": "^[0-9]+$"}),
    }
    assert list(normalized["schemas"]["deploy"]["properties"]) == ["env", "region"]


def test_list_shape_later_constraint_for_a_tool_replaces_the_earlier() -> None:
    policy = {
        "constraints": [
            {"tool": "t", "params": {"a": {"matches": "1"}}},
            {"tool": "t", "params": {"b": {"matches": "2"}}},
        ]
    }
    assert normalize_assay_policy(policy)["schemas"] == {"t": migrated(["b"], {"b": "2"})}


def test_map_shape_constraints_accept_direct_strings_and_matches_objects() -> None:
    policy = {
        "constraints": {"zeta": {"a": "^z$"}, "alpha": {"c": {"matches": None}, "b": {"matches": "^a$"}}}
    }
    schemas = normalize_assay_policy(policy)["schemas"]
    assert schemas == {"alpha": migrated(["b"], {"b": "^a$"}), "zeta": migrated(["a"], {"a": "^z$"})}
    preimage = (
        '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{'
        '"alpha":{"additionalProperties":true,"properties":'
        '{"b":{"minLength":1,"pattern":"^a$","type":"string"}},"required":["b"],"type":"object"},'
        '"zeta":{"additionalProperties":true,"properties":'
        '{"a":{"minLength":1,"pattern":"^z$","type":"string"}},"required":["a"],"type":"object"}},'
        '"tools":{},"version":"2.0"}'
    )
    assert declared_policy_digest(policy) == sha(preimage)


@pytest.mark.parametrize(
    "constraints",
    [
        [{"tool": "t", "params": {"a": "^x$"}}],  # list shape needs {matches} objects
        [{"tool": "t"}],  # params is required
        [{"params": {}}],  # tool is required
        {"t": {"a": 5}},
        {"t": ["^x$"]},
        {"t": {"a": {"matches": 5}}},
        "^x$",
        7,
    ],
)
def test_constraints_outside_both_shapes_are_refused(constraints: Any) -> None:
    with pytest.raises(AssayPolicyError) as info:
        normalize_assay_policy({"constraints": constraints})
    assert info.value.kind == "structure"
    assert info.value.path[0] == "constraints"


def test_explicit_schema_wins_in_the_dict_reading_and_loses_in_the_file_reading() -> None:
    policy = {
        "version": "1",
        "schemas": {"deploy": {"type": "object"}},
        "constraints": [{"tool": "deploy", "params": {"env": {"matches": "^prod$"}}}],
    }
    dict_preimage = (
        '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{"deploy":{"type":"object"}},'
        '"tools":{},"version":"1"}'
    )
    file_preimage = (
        '{"enforcement":{"unconstrained_tools":"warn"},"schemas":{"deploy":{"additionalProperties":true,'
        '"properties":{"env":{"minLength":1,"pattern":"^prod$","type":"string"}},"required":["env"],'
        '"type":"object"}},"tools":{},"version":"1"}'
    )
    assert normalize_assay_policy(policy)["schemas"]["deploy"] == {"type": "object"}
    assert declared_policy_digest(policy) == sha(dict_preimage)
    from_file = parse_assay_policy(json.dumps(policy))
    assert from_file["schemas"]["deploy"] == migrated(["env"], {"env": "^prod$"})
    assert "constraints" not in from_file
    assert declared_policy_digest(from_file) == sha(file_preimage)


def test_file_reading_merges_legacy_lists_at_load() -> None:
    loaded = parse_assay_policy("tools:\n  deny: [a]\ndeny: [b, a]\nallow: []\n")
    assert loaded["tools"] == {"deny": ["a", "b", "a"], "allow": []}
    assert "allow" not in loaded and "deny" not in loaded
    as_dict = {"tools": {"deny": ["a"]}, "deny": ["b", "a"], "allow": []}
    assert declared_policy_digest(loaded) == declared_policy_digest(as_dict)


@pytest.mark.parametrize(
    ("version", "expected"),
    [("", "2.0"), ("1.0", "2.0"), ("1", "1"), ("2.0", "2.0"), ("1.0.0", "1.0.0"), (" 1.0", " 1.0")],
)
def test_version_normalization_in_the_declared_view(version: str, expected: str) -> None:
    assert normalize_assay_policy({"version": version})["version"] == expected
    assert declared_view({"version": version})["version"] == expected


def test_version_is_normalized_at_load_only_when_there_are_constraints() -> None:
    assert parse_assay_policy('version: ""\n')["version"] == ""
    assert parse_assay_policy("{}")["version"] == ""
    assert parse_assay_policy('version: "1.0"\nconstraints: {t: {a: "^x$"}}\n')["version"] == "2.0"
    assert parse_assay_policy('version: "1.0"\nconstraints: []\n')["version"] == "1.0"
    # ...and the declared view of either reading is the same.
    assert declared_policy_digest(parse_assay_policy('version: ""\n')) == sha(EMPTY_VIEW)


def test_normalization_is_idempotent_and_does_not_touch_its_input() -> None:
    policy = {
        "version": "1.0",
        "allow": ["b"],
        "tools": {"allow": ["a"]},
        "schemas": {"x": {"required": ["z", "y"]}},
        "constraints": {"t": {"a": "^x$"}},
    }
    before = copy.deepcopy(policy)
    once = normalize_assay_policy(policy)
    assert policy == before
    assert normalize_assay_policy(once) == once
    once["schemas"]["x"]["required"].append("w")
    assert policy == before  # the result is a fresh copy


# --- reading policy text ----------------------------------------------------------------------


def refused(text: str | bytes, **kwargs: Any) -> AssayPolicyError:
    with pytest.raises(AssayPolicyError) as info:
        parse_assay_policy(text, **kwargs)
    return info.value


def test_a_wrong_type_names_the_field_and_its_line() -> None:
    error = refused('version: "2.0"\ntools:\n  allow:\n    - read_file\n    - {secret: hunter2}\n')
    assert (error.kind, error.line, error.column) == ("structure", 5, 7)
    assert error.path == ("tools", "allow", 1)
    assert "tools.allow[1]" in str(error) and "line 5" in str(error)
    assert "hunter2" not in str(error)  # never a value from the policy


def test_an_unquoted_version_is_refused_with_its_line() -> None:
    error = refused("tools: {}\nversion: 2.0\n")
    assert (error.kind, error.line, error.path) == ("structure", 2, ("version",))
    assert "quote" in str(error)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("tools: [a, b\n", 2),
        ("a: 1\na: 2\n", 2),  # duplicate key
        ("base: &b {x: 1}\nother:\n  <<: *b\n", 3),  # merge key
        ("schemas:\n  t: {maximum: 1_000}\n", 2),  # ambiguous number spelling
        ("schemas:\n  t: {maximum: .inf}\n", 2),
        ("schemas:\n  t: !!binary aGk=\n", 2),
        ("schemas:\n  t: {1: x}\n", 2),  # non-string key
        ("a: &x [*x]\n", 1),  # recursive alias
    ],
)
def test_syntax_errors_carry_a_line(text: str, line: int) -> None:
    error = refused(text)
    assert error.kind == "syntax"
    assert error.line == line


def test_documents_that_are_not_one_mapping_are_refused() -> None:
    assert refused("").kind == "root_not_mapping"
    assert refused("- a\n- b\n").kind == "root_not_mapping"
    assert refused("a: 1\n---\nb: 2\n").kind == "syntax"
    assert refused(b"version: \xff\n").kind == "syntax"


def test_yaml_scalars_read_as_the_reference_reads_them() -> None:
    loaded = parse_assay_policy(
        "schemas:\n  t:\n    enum: [2024-01-01, yes, 0x1F, 0o17, 1.5e3, ~, true, '012']\n"
    )
    assert loaded["schemas"]["t"]["enum"] == ["2024-01-01", "yes", 31, 15, 1500.0, None, True, "012"]


@pytest.mark.parametrize(
    ("policy", "path"),
    [
        ({"tools": None}, ("tools",)),
        ({"tools": {"deny": "delete_all"}}, ("tools", "deny")),
        ({"schemas": None}, ("schemas",)),
        ({"schemas": []}, ("schemas",)),
        ({"enforcement": {"unconstrained_tools": "block"}}, ("enforcement", "unconstrained_tools")),
        ({"enforcement": None}, ("enforcement",)),
        ({"name": 3}, ("name",)),
        ({"version": None}, ("version",)),
        ({"tools": {"redact_args_contract": {"redaction_target": "a"}}}, ("tools", "redact_args_contract")),
        ({"tool_pins": {"t": {"server_id": "s"}}}, ("tool_pins", "t")),
        ({"tool_classes": {"t": "fs"}}, ("tool_classes", "t")),
        ({"limits": {"max_requests_total": -1}}, ("limits", "max_requests_total")),
        ({"signatures": {"check_descriptions": "yes"}}, ("signatures", "check_descriptions")),
        ({"discovery": []}, ("discovery",)),
    ],
)
def test_field_types_are_enforced(policy: dict, path: tuple) -> None:
    with pytest.raises(AssayPolicyError) as info:
        normalize_assay_policy(policy)
    assert info.value.kind == "structure"
    assert info.value.path == path
    with pytest.raises(AssayPolicyError):
        parse_assay_policy(json.dumps(policy))


def test_a_root_that_is_not_a_mapping_is_refused_in_the_dict_reading() -> None:
    with pytest.raises(AssayPolicyError) as info:
        normalize_assay_policy(["allow"])  # type: ignore[arg-type]
    assert info.value.kind == "root_not_mapping"


def test_file_reading_validates_pins_and_kill_switch_references() -> None:
    good = "a" * 64
    pins = {"t": {"server_id": "s", "tool_name": "t", "schema_hash": good, "meta_hash": good.upper()}}
    error = refused(json.dumps({"tool_pins": pins}))
    assert (error.kind, error.path) == ("validation", ("tool_pins", "t", "meta_hash"))
    normalize_assay_policy({"tool_pins": pins})  # the dict reading does not run load-time validation
    pins["t"]["meta_hash"] = good
    parse_assay_policy(json.dumps({"tool_pins": pins}))

    monitor = {"rules": [{"id": "r1", "type": "x", "match": {}}]}
    assert parse_assay_policy(
        json.dumps({"runtime_monitor": monitor, "kill_switch": {"triggers": [{"on_rule": "r1"}]}})
    )
    dangling = {"runtime_monitor": monitor, "kill_switch": {"triggers": [{"on_rule": "r2"}]}}
    error = refused(json.dumps(dangling))
    assert (error.kind, error.path) == ("validation", ("kill_switch", "triggers", 0, "on_rule"))


def test_deprecated_v1_policies_can_be_refused() -> None:
    assert parse_assay_policy('version: "1.0"\n')["version"] == "1.0"
    assert refused('version: "1.0"\n', deny_deprecations=True).kind == "deprecated"
    assert refused("constraints: {t: {a: x}}\n", deny_deprecations=True).kind == "deprecated"
    assert parse_assay_policy('version: "2.0"\n', deny_deprecations=True)["version"] == "2.0"


def test_unknown_fields_are_ignored_and_listed() -> None:
    policy = {"version": "2.0", "extra": 1, "tools": {"allow": ["a"], "allow_typo": ["b"]}}
    assert unknown_policy_fields(policy) == ("extra", "tools.allow_typo")
    known_only = {"version": "2.0", "tools": {"allow": ["a"]}}
    assert declared_policy_digest(policy) == declared_policy_digest(known_only)
    assert unknown_policy_fields(BASE) == ()


# --- property: reordering never moves the digest ----------------------------------------------

names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=5)
name_lists = st.lists(names, max_size=5)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), names)
schemas = st.fixed_dictionaries(
    {"type": st.just("object")},
    optional={
        "required": name_lists,
        "properties": st.dictionaries(
            names,
            st.fixed_dictionaries({}, optional={"enum": st.lists(scalars, max_size=5), "type": names}),
            max_size=3,
        ),
    },
)
policies = st.fixed_dictionaries(
    {
        "version": st.sampled_from(["", "1", "1.0", "2.0"]),
        "tools": st.fixed_dictionaries({}, optional={key: name_lists for key in TOOL_LIST_FIELDS}),
        "schemas": st.dictionaries(names, schemas, max_size=3),
    },
    optional={
        "enforcement": st.fixed_dictionaries({"unconstrained_tools": st.sampled_from(UNCONSTRAINED_MODES)}),
        "allow": name_lists,
        "deny": name_lists,
        "name": names,
    },
)

SET_LIKE_PARENTS = set(TOOL_LIST_FIELDS) | {"required", "enum"}


def reorder(value: Any, rnd: random.Random, key: str | None = None) -> Any:
    """Shuffle every mapping's key order and every set-like list, recursively."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {k: reorder(value[k], rnd, k) for k in keys}
    if isinstance(value, list):
        items = [reorder(item, rnd) for item in value]
        if key in SET_LIKE_PARENTS:
            rnd.shuffle(items)
        return items
    return value


@settings(max_examples=150, deadline=None)
@given(policies, st.randoms(use_true_random=False))
def test_digest_is_insensitive_to_reordering(policy: dict, rnd: random.Random) -> None:
    reordered = reorder(policy, rnd)
    assert declared_policy_digest(reordered) == declared_policy_digest(policy)
    assert normalize_assay_policy(normalize_assay_policy(policy)) == normalize_assay_policy(policy)
