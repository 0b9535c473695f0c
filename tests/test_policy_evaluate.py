"""Policy evaluation: order, first match, every operator, undecidable conditions, schemas, provenance."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from conftest import scaled
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.policy import (
    DEFAULT_DENY,
    Action,
    Basis,
    PolicySet,
    PolicySource,
    candidate_rules,
    evaluate,
    explain,
    load_policies,
    load_policy_text,
    stricter,
)
from drawbridge.policy.evaluate import MEMO_MAX_ENTRIES
from drawbridge.policy.globs import Glob

A, H, D = Action.ALLOW, Action.HUMAN_APPROVAL, Action.DENY


def policies(**files: str) -> PolicySet:
    return load_policies([PolicySource(name + ".yaml", body) for name, body in files.items()])


def single(rules: str, agent: str = "*", schemas: str = "") -> PolicySet:
    return load_policy_text(f"name: p\nagent: '{agent}'\nrules:\n{rules}{schemas}", "p.yaml")


def one_condition(cond: str, action: str = "allow") -> PolicySet:
    """Rule 0 = ``action`` when ``cond``; rule 1 = human_approval (a marker for "not matched")."""
    return single(
        f"  - tools: [t]\n    action: {action}\n    when: [{cond}]\n"
        "  - tools: [t]\n    action: human_approval\n"
    )


# ----------------------------------------------------------------------------- order and provenance


SUPPORT = """\
name: support
agent: "support-*"
rules:
  - tools: ["get_order", "get_customer"]
    action: allow
  - tools: ["create_refund"]
    action: allow
    when: [{arg: amount, op: "<", value: 500}]
  - tools: ["create_refund"]
    action: human_approval
  - tools: ["delete_customer"]
    action: deny
"""
ADMIN = 'name: admin\nagent: "admin-*"\nrules:\n  - tools: ["*"]\n    action: allow\n'
DEFAULT = 'name: default\nagent: "*"\nrules:\n  - tools: ["*"]\n    action: deny\n'
SHARED = 'name: shared\nagent: "*"\nrules:\n  - tools: ["status"]\n    action: allow\n'


@pytest.fixture
def mesh() -> PolicySet:
    return policies(support=SUPPORT, admin=ADMIN, zz_default=DEFAULT, shared=SHARED)


def test_first_matching_rule_decides_with_provenance(mesh: PolicySet) -> None:
    d = evaluate(mesh, "support-bot", "get_order")
    assert (d.action, d.policy, d.source_file, d.rule_index, d.line, d.basis) == (
        A,
        "support",
        "support.yaml",
        0,
        4,
        Basis.RULE,
    )
    assert d.reason == "allow by rule 0 of policy 'support' (support.yaml:4)"
    assert d.as_dict() == {
        "action": "allow",
        "policy": "support",
        "source_file": "support.yaml",
        "rule_index": 0,
        "line": 4,
        "basis": "rule",
        "reason": "allow by rule 0 of policy 'support' (support.yaml:4)",
    }
    d = evaluate(mesh, "support-bot", "delete_customer")
    assert (d.action, d.policy, d.rule_index, d.line) == (D, "support", 3, 11)


def test_conditions_choose_between_rules(mesh: PolicySet) -> None:
    low = evaluate(mesh, "support-bot", "create_refund", {"amount": 100})
    high = evaluate(mesh, "support-bot", "create_refund", {"amount": 999.5})
    assert (low.action, low.rule_index) == (A, 1)
    assert (high.action, high.rule_index) == (H, 2)


def test_fall_through_to_less_specific_policy_in_file_order(mesh: PolicySet) -> None:
    # "shared" and "zz_default" are both "*": file-name order, so shared's rule is reached first.
    d = evaluate(mesh, "support-bot", "status")
    assert (d.action, d.policy, d.source_file, d.rule_index) == (A, "shared", "shared.yaml", 0)
    d = evaluate(mesh, "support-bot", "unknown_tool")
    assert (d.action, d.policy, d.source_file, d.rule_index) == (D, "default", "zz_default.yaml", 0)


def test_agent_glob_selects_policies(mesh: PolicySet) -> None:
    assert evaluate(mesh, "admin-1", "delete_customer").policy == "admin"
    assert evaluate(mesh, "support-bot", "delete_customer").policy == "support"
    assert evaluate(mesh, "other", "get_order").policy == "default"


def test_specificity_exact_then_longer_prefix_then_star() -> None:
    rule = "rules:\n  - tools: [t]\n    action: {}\n"
    ps = policies(
        a=f"name: star\nagent: '*'\n{rule.format('allow')}",
        b=f"name: short\nagent: 'ci-*'\n{rule.format('human_approval')}",
        c=f"name: long\nagent: 'ci-bot-*'\n{rule.format('deny')}",
        d=f"name: exact\nagent: 'ci-bot-7'\n{rule.format('allow')}",
    )
    assert evaluate(ps, "ci-bot-7", "t").policy == "exact"
    assert evaluate(ps, "ci-bot-8", "t").policy == "long"
    assert evaluate(ps, "ci-x", "t").policy == "short"
    assert evaluate(ps, "other", "t").policy == "star"


def test_no_rule_matched_is_default_deny() -> None:
    ps = single("  - tools: [a]\n    action: allow\n")
    d = evaluate(ps, "x", "b", {"k": 1})
    assert d is DEFAULT_DENY
    assert (d.action, d.policy, d.source_file, d.rule_index, d.line, d.reason, d.basis) == (
        D,
        None,
        None,
        None,
        None,
        "no rule matched",
        Basis.NO_RULE,
    )
    assert evaluate(PolicySet(()), "x", "y") is DEFAULT_DENY


def test_conditional_rule_that_fails_falls_through_to_default_deny() -> None:
    ps = single("  - tools: [t]\n    action: allow\n    when: [{arg: n, op: '>', value: 1}]\n")
    assert evaluate(ps, "a", "t", {"n": 2}).action is A
    assert evaluate(ps, "a", "t", {"n": 0}) is DEFAULT_DENY


def test_stricter() -> None:
    assert stricter(A, H) is H and stricter(H, A) is H
    assert stricter(D, H) is D and stricter(A, D) is D and stricter(A, A) is A
    assert [a.strictness for a in (A, H, D)] == [0, 1, 2]


# ----------------------------------------------------------------------------- operators


# (condition, arguments, expected truth) where truth is T (rule applies), F (skipped), U (undecidable)
T, F, U = "T", "F", "U"
OPERATOR_CASES: list[tuple[str, Any, str]] = [
    ("{arg: x, op: '==', value: 'a'}", {"x": "a"}, T),
    ("{arg: x, op: '==', value: 'a'}", {"x": "b"}, F),
    ("{arg: x, op: '==', value: 'a'}", {"x": 1}, U),
    ("{arg: x, op: '==', value: 500}", {"x": 500.0}, T),
    ("{arg: x, op: '==', value: 500}", {"x": "500"}, U),
    ("{arg: x, op: '==', value: 1}", {"x": True}, U),
    ("{arg: x, op: '==', value: true}", {"x": True}, T),
    ("{arg: x, op: '==', value: true}", {"x": False}, F),
    ("{arg: x, op: '==', value: true}", {"x": 1}, U),
    ("{arg: x, op: '==', value: null}", {"x": None}, T),
    ("{arg: x, op: '==', value: null}", {"x": "a"}, F),
    ("{arg: x, op: '!=', value: 'prod'}", {"x": "dev"}, T),
    ("{arg: x, op: '!=', value: 'prod'}", {"x": "prod"}, F),
    ("{arg: x, op: '!=', value: 'prod'}", {"x": ["prod"]}, U),
    ("{arg: x, op: '!=', value: null}", {"x": 0}, T),
    ("{arg: x, op: '<', value: 500}", {"x": 499}, T),
    ("{arg: x, op: '<', value: 500}", {"x": 500}, F),
    ("{arg: x, op: '<', value: 500}", {"x": "1"}, U),
    ("{arg: x, op: '<', value: 500}", {"x": True}, U),
    ("{arg: x, op: '<', value: 500}", {"x": float("nan")}, U),
    ("{arg: x, op: '<=', value: 500}", {"x": 500}, T),
    ("{arg: x, op: '<=', value: 500}", {"x": 500.01}, F),
    ("{arg: x, op: '>', value: 1.5}", {"x": 2}, T),
    ("{arg: x, op: '>', value: 1.5}", {"x": 1.5}, F),
    ("{arg: x, op: '>=', value: 2}", {"x": 2}, T),
    ("{arg: x, op: '>=', value: 2}", {"x": 10**30}, T),
    ("{arg: x, op: '>=', value: 2}", {"x": -1}, F),
    ("{arg: x, op: starts_with, value: 'prod-'}", {"x": "prod-db"}, T),
    ("{arg: x, op: starts_with, value: 'prod-'}", {"x": "dev-prod-db"}, F),
    ("{arg: x, op: starts_with, value: 'prod-'}", {"x": 5}, U),
    ("{arg: x, op: in, value: ['a', 'b', 3]}", {"x": "b"}, T),
    ("{arg: x, op: in, value: ['a', 'b', 3]}", {"x": 3.0}, T),
    ("{arg: x, op: in, value: ['a', 'b', 3]}", {"x": "c"}, F),
    ("{arg: x, op: in, value: ['a', 'b', 3]}", {"x": 4}, F),
    ("{arg: x, op: in, value: ['a', 'b', 3]}", {"x": True}, U),
    ("{arg: x, op: in, value: ['a', 'b', 3]}", {"x": None}, U),
    ("{arg: x, op: in, value: [null, true]}", {"x": None}, T),
    ("{arg: x, op: in, value: [null, true]}", {"x": False}, F),
    ("{arg: x, op: in, value: [1]}", {"x": {"a": 1}}, U),
    ("{arg: x, op: matches, value: 'prod-[a-z]+'}", {"x": "prod-db"}, T),
    ("{arg: x, op: matches, value: 'prod-[a-z]+'}", {"x": "prod-db; rm -rf /"}, F),  # full match
    ("{arg: x, op: matches, value: 'prod-[a-z]+'}", {"x": "xprod-db"}, F),
    ("{arg: x, op: matches, value: '.*'}", {"x": "a" * 1025}, U),  # too long to match safely
    ("{arg: x, op: matches, value: '.*'}", {"x": 3}, U),
    # paths
    ("{arg: a.b, op: '==', value: 1}", {"a": {"b": 1}}, T),
    ("{arg: a.b, op: '==', value: 1}", {"a": {"b": 2}}, F),
    ("{arg: a.b, op: '==', value: 1}", {"a": "b"}, U),
    ("{arg: a.b, op: '==', value: 1}", {"a": {}}, U),
    ("{arg: ['a.b'], op: '==', value: 1}", {"a.b": 1}, T),
    ("{arg: x, op: '==', value: 1}", {}, U),
    ("{arg: x, op: '==', value: 1}", None, U),
    ("{arg: x, op: '==', value: 1}", [1], U),
    # if_missing decides only absence
    ("{arg: x, op: '==', value: 1, if_missing: true}", {}, T),
    ("{arg: x, op: '==', value: 1, if_missing: false}", {}, F),
    ("{arg: x, op: '==', value: 1, if_missing: false}", None, F),
    ("{arg: x, op: '==', value: 1, if_missing: false}", {"x": "1"}, U),
    ("{arg: a.b, op: '==', value: 1, if_missing: true}", {"a": {}}, T),
]


@pytest.mark.parametrize(("cond", "args", "truth"), OPERATOR_CASES)
def test_operator(cond: str, args: Any, truth: str) -> None:
    # As an allow rule: applies only when TRUE (UNKNOWN is skipped like FALSE).
    allow = evaluate(one_condition(cond, "allow"), "a", "t", args)
    assert allow.action is (A if truth == T else H)
    # As a deny rule: applies when TRUE, and when UNKNOWN (the stricter outcome).
    deny = evaluate(one_condition(cond, "deny"), "a", "t", args)
    assert deny.action is (D if truth in (T, U) else H)
    assert deny.basis is {T: Basis.RULE, U: Basis.CONDITION_UNKNOWN, F: Basis.RULE}[truth]
    assert deny.rule_index == (0 if truth in (T, U) else 1)


def test_all_conditions_must_hold() -> None:
    cond = "{arg: a, op: '==', value: 1}, {arg: b, op: '==', value: 2}"
    ps = one_condition(cond, "deny")
    assert evaluate(ps, "x", "t", {"a": 1, "b": 2}).action is D
    assert evaluate(ps, "x", "t", {"a": 1, "b": 3}).action is H
    assert evaluate(ps, "x", "t", {"a": 0}).action is H  # one FALSE settles it, even with b missing
    assert evaluate(ps, "x", "t", {"a": 1}).basis is Basis.CONDITION_UNKNOWN


# ----------------------------------------------------------------------------- undecidable conditions


def test_unknown_on_human_approval_asks_unless_later_rule_denies() -> None:
    rules = (
        "  - tools: [t]\n    action: human_approval\n    when: [{arg: amount, op: '>', value: 100}]\n"
        "  - tools: [t]\n    action: allow\n    when: [{arg: who, op: '==', value: me}]\n"
        "  - tools: [t]\n    action: LAST\n"
    )
    ps = single(rules.replace("LAST", "allow"))
    d = evaluate(ps, "a", "t", {"amount": "5000"})  # string: cannot be compared
    assert (d.action, d.rule_index, d.basis) == (H, 0, Basis.CONDITION_UNKNOWN)
    assert "argument `amount` is a string" in d.reason and "5000" not in d.reason
    d = evaluate(ps, "a", "t", {"who": "me"})  # amount missing, then an allow that holds
    assert (d.action, d.rule_index) == (H, 0)
    assert "argument `amount` is missing" in d.reason
    ps = single(rules.replace("LAST", "deny"))
    d = evaluate(ps, "a", "t", {"amount": "5000"})
    assert (d.action, d.rule_index, d.basis) == (D, 2, Basis.RULE)
    ps = single("  - tools: [t]\n    action: human_approval\n    when: [{arg: n, op: '<', value: 1}]\n")
    assert evaluate(ps, "a", "t", {}) is DEFAULT_DENY  # asked-or-nothing: nothing is a deny


def test_unknown_reason_names_path_and_type_never_the_value() -> None:
    ps = one_condition("{arg: cfg.level, op: '>=', value: 3}", "deny")
    d = evaluate(ps, "a", "t", {"cfg": "top-secret-value"})
    assert "`cfg` is a string, not an object" in d.reason
    assert "top-secret-value" not in d.reason
    d = evaluate(ps, "a", "t", {"cfg": {"level": "sekrit-level"}})
    assert "argument `cfg.level` is a string" in d.reason and "sekrit" not in d.reason
    d = evaluate(one_condition("{arg: x, op: matches, value: 'a+'}", "deny"), "a", "t", {"x": "a" * 2000})
    assert "longer than 1024 characters" in d.reason and "aaaa" not in d.reason


_ACTIONS = [A, H, D]
_CONDS = [
    ("{arg: x, op: '<', value: 5}", lambda v: v < 5),
    ("{arg: x, op: '>=', value: 2}", lambda v: v >= 2),
    ("{arg: x, op: '==', value: 3}", lambda v: v == 3),
    ("{arg: x, op: '!=', value: 1}", lambda v: v != 1),
    ("{arg: x, op: in, value: [1, 4]}", lambda v: v in (1, 4)),
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(range(3)), st.one_of(st.none(), st.sampled_from(range(len(_CONDS))))),
        min_size=1,
        max_size=6,
    ),
    st.one_of(st.integers(0, 6), st.sampled_from(["3", None, True]), st.just("missing")),
)
def test_result_is_the_strictest_outcome_over_every_reading_of_unknown_conditions(
    spec: list[tuple[int, int | None]], x: Any
) -> None:
    """Oracle: try each UNKNOWN rule as applying and as not applying; take the strictest first match."""
    body = ""
    for action_i, cond_i in spec:
        body += f"  - tools: [t]\n    action: {_ACTIONS[action_i].value}\n"
        if cond_i is not None:
            body += f"    when: [{_CONDS[cond_i][0]}]\n"
    ps = single(body)
    args = {} if x == "missing" else {"x": x}
    numeric = isinstance(x, int) and not isinstance(x, bool)

    truths = []  # True, False or None (unknown) per rule
    for _, cond_i in spec:
        if cond_i is None:
            truths.append(True)
        else:
            truths.append(_CONDS[cond_i][1](x) if numeric else None)
    unknown = [i for i, t in enumerate(truths) if t is None]
    outcomes = []
    for choice in itertools.product([True, False], repeat=len(unknown)):
        reading = list(truths)
        for i, c in zip(unknown, choice, strict=True):
            reading[i] = c
        first = next((i for i, t in enumerate(reading) if t), None)
        outcomes.append(D if first is None else _ACTIONS[spec[first][0]])
    expected = max(outcomes, key=lambda a: a.strictness)
    assert evaluate(ps, "a", "t", args).action is expected


# ----------------------------------------------------------------------------- schemas


SCHEMA = """\
schemas:
  add_deploy_key:
    type: object
    required: [owner, repo]
    properties:
      owner: {type: string}
      repo: {type: string, pattern: "^[a-z-]+$"}
      key: {type: string, maxLength: 10}
"""


def test_schema_violation_denies_without_echoing_values() -> None:
    ps = single("  - tools: ['*']\n    action: allow\n", schemas=SCHEMA)
    ok = evaluate(ps, "a", "add_deploy_key", {"owner": "o", "repo": "r"})
    assert (ok.action, ok.rule_index) == (A, 0)
    secret = "ssh-ed25519 AAAA-very-secret-key-material"
    d = evaluate(ps, "a", "add_deploy_key", {"owner": "o", "repo": "r", "key": secret})
    assert (d.action, d.policy, d.source_file, d.rule_index, d.line, d.basis) == (
        D,
        "p",
        "p.yaml",
        None,
        7,
        Basis.SCHEMA,
    )
    assert "`maxLength` fails at /key" in d.reason
    assert "AAAA" not in d.reason and secret not in d.reason
    d = evaluate(ps, "a", "add_deploy_key", {"owner": "o", "repo": "Bad Repo Name"})
    assert "`pattern` fails at /repo" in d.reason and "Bad Repo" not in d.reason
    d = evaluate(ps, "a", "add_deploy_key", {"owner": 12345})
    assert "`required` fails at the top level (missing `repo`)" in d.reason
    d = evaluate(ps, "a", "add_deploy_key", None)
    assert "missing `owner`, `repo`" in d.reason
    # Other tools have no schema
    assert evaluate(ps, "a", "other", {"anything": 1}).action is A


def test_schema_regexes_never_run_on_overlong_input() -> None:
    schemas = "schemas:\n  t:\n    properties: {a: {pattern: '^[a-z]+$'}}\n"
    schemas += "    patternProperties: {'^x-': {type: integer}}\n"
    ps = single("  - tools: [t]\n    action: allow\n", schemas=schemas)
    assert evaluate(ps, "x", "t", {"a": "abc", "x-1": 2}).action is A
    assert "`pattern` fails at /a" in evaluate(ps, "x", "t", {"a": "ab1"}).reason
    d = evaluate(ps, "x", "t", {"a": "a" * 4097})
    assert d.action is D and "`pattern` fails at /a" in d.reason
    d = evaluate(ps, "x", "t", {"nested": {"k" * 4097: 1}})
    assert d.action is D
    assert "`patternProperties` fails at /nested (a property name is longer than 4096 characters)" in d.reason


def test_anchored_patterns_still_load_and_match() -> None:
    schemas = "schemas:\n  t:\n    properties: {a: {pattern: '^a*a*x'}, b: {pattern: '\\Aa*a*x'}}\n"
    ps = single("  - tools: [t]\n    action: allow\n", schemas=schemas)
    assert evaluate(ps, "x", "t", {"a": "aax", "b": "ax"}).action is A
    assert "`pattern` fails at /a" in evaluate(ps, "x", "t", {"a": "\nax"}).reason


def test_one_call_spends_one_regex_budget_however_many_strings_it_holds() -> None:
    """Each string is within the bound (16.7 million steps over 4,096 characters); 200 of them made one
    call take seconds. The call's budget covers one such run, and the rest fail ``pattern``."""
    schemas = "schemas:\n  t:\n    properties: {tags: {type: array, items: {type: string, pattern: '^.*.*x'}}}\n"
    ps = single("  - tools: [t]\n    action: allow\n", schemas=schemas)
    assert evaluate(ps, "x", "t", {"tags": ["a" * 100 + "x"] * 200}).action is A  # short strings: well within
    began = time.monotonic()
    d = evaluate(ps, "x", "t", {"tags": ["a" * 4096] * 200})
    assert time.monotonic() - began < scaled(1.5)
    assert (d.action, d.basis) == (D, Basis.SCHEMA)
    assert "`pattern` fails at /tags/" in d.reason
    assert "(the call's strings are too long, together, for the schema's patterns to be checked)" in d.reason


def test_property_names_are_charged_to_the_call_budget_before_jsonschema_matches_them() -> None:
    schemas = "schemas:\n  t:\n    patternProperties: {'^.*.*x': {type: string}}\n    additionalProperties: false\n"
    ps = single("  - tools: [t]\n    action: allow\n", schemas=schemas)
    assert evaluate(ps, "x", "t", {"a" * 50 + str(i) + "x": "v" for i in range(20)}).action is A
    began = time.monotonic()
    d = evaluate(ps, "x", "t", {"a" * 4000 + str(i): "v" for i in range(200)})
    assert time.monotonic() - began < scaled(1.5)
    assert d.action is D
    assert "`patternProperties` fails at the top level (the property names are too long, together" in d.reason


def test_matches_conditions_share_the_call_budget() -> None:
    """Each run of `.*.*q` over 1,024 characters is bounded by about a million steps: the call's budget
    covers 19 of them, so the 20th condition cannot be evaluated (a deny rule then denies)."""
    rule = "  - tools: [t]\n    action: deny\n    when: [{arg: m, op: matches, value: '.*.*q'}]\n"
    ps = single(rule * 25 + "  - tools: [t]\n    action: allow\n")
    assert evaluate(ps, "x", "t", {"m": "a" * 10}).action is A
    d = evaluate(ps, "x", "t", {"m": "a" * 1024})
    assert (d.action, d.rule_index, d.basis) == (D, 19, Basis.CONDITION_UNKNOWN)
    assert "the call's regexes ran out of their budget before argument `m` was matched" in d.reason
    assert evaluate(ps, "x", "t", {"m": "a" * 1024}).rule_index == 19  # a new call, a new budget


def test_schema_is_not_consulted_when_the_policy_denies() -> None:
    ps = single("  - tools: ['*']\n    action: deny\n", schemas=SCHEMA)
    d = evaluate(ps, "a", "add_deploy_key", {"owner": 1})
    assert (d.basis, d.rule_index) == (Basis.RULE, 0)


def test_schema_applies_to_human_approval_and_from_every_applicable_policy() -> None:
    ps = policies(
        agent="name: agent\nagent: bot\nrules:\n  - tools: ['*']\n    action: human_approval\n",
        shared=f"name: shared\nagent: '*'\nrules: []\n{SCHEMA}",
    )
    d = evaluate(ps, "bot", "add_deploy_key", {"owner": "o"})
    assert (d.action, d.policy, d.source_file, d.basis) == (D, "shared", "shared.yaml", Basis.SCHEMA)
    assert evaluate(ps, "bot", "add_deploy_key", {"owner": "o", "repo": "r"}).action is H


# ----------------------------------------------------------------------------- decision tables


def test_candidate_rules_and_explain() -> None:
    ps = policies(
        a="""\
name: claude
agent: claude
rules:
  - tools: ["gmail.*"]
    action: allow
    when: [{arg: to, op: starts_with, value: "me@"}]
  - tools: ["gmail.send"]
    action: deny
    when: [{arg: to, op: matches, value: ".*@evil\\\\.com"}]
  - tools: ["gmail.read"]
    action: allow
  - tools: ["gmail.send"]
    action: human_approval
  - tools: ["gmail.send"]
    action: allow
""",
        b='name: default\nagent: "*"\nrules:\n  - tools: ["*"]\n    action: deny\n',
    )
    cands = candidate_rules(ps, "claude", "gmail.send")
    assert [(c.policy.name, c.rule.index, c.conditional) for c in cands] == [
        ("claude", 0, True),
        ("claude", 1, True),
        ("claude", 3, False),
    ]
    view = explain(ps, "claude", "gmail.send")
    assert (view.fallthrough.action, view.fallthrough.policy, view.fallthrough.rule_index) == (H, "claude", 3)
    firsts = [(c.rule.action, c.rule.conditions[0]) for c in view.conditional]
    assert [(action, cond.arg_text, cond.op.value) for action, cond in firsts] == [
        (A, "to", "starts_with"),
        (D, "to", "matches"),
    ]
    assert view.possible_actions == {A, H, D} and view.possible_actions != {D}
    other = explain(ps, "claude", "slack.post")
    assert other.fallthrough.policy == "default" and other.possible_actions == {D}
    nothing = explain(PolicySet(()), "x", "y")
    assert nothing.fallthrough is DEFAULT_DENY and nothing.conditional == () and nothing.possible_actions == {D}
    conditional_only = single("  - tools: [t]\n    action: deny\n    when: [{arg: a, op: '==', value: 1}]\n")
    only_conditional = explain(conditional_only, "x", "t")
    assert only_conditional.fallthrough is DEFAULT_DENY and only_conditional.possible_actions == {D}


# ----------------------------------------------------------------------------- memo and speed


def test_memo_is_bounded_and_invisible() -> None:
    ps = one_condition("{arg: n, op: '<', value: 5}")
    assert evaluate(ps, "a", "t", {"n": 1}).action is A
    assert evaluate(ps, "a", "t", {"n": 9}).action is H  # same plan, other arguments
    for i in range(MEMO_MAX_ENTRIES + 10):
        evaluate(ps, "a", f"tool{i}")
    assert len(ps.memo) <= MEMO_MAX_ENTRIES
    evaluate(ps, "a" * 600, "t")  # over-long keys are not memoised
    assert ("a" * 600, "t") not in ps.memo


def _big_policy_set() -> PolicySet:
    lines = ["name: big", "agent: 'agent-*'", "rules:"]
    for i in range(900):
        lines += [f"  - tools: ['srv{i % 10}.tool_{i}']", "    action: allow"]
        if i % 3 == 0:
            lines.append("    when: [{arg: amount, op: '<', value: 500}]")
    for i in range(99):
        lines += [f"  - tools: ['glob{i}.*']", "    action: human_approval"]
    lines += ["  - tools: ['*']", "    action: deny"]
    return load_policy_text("\n".join(lines) + "\n", "big.yaml")


def counting_matches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every tool name a glob is tried on from now on (a scan of the rules would try one per pattern);
    the policies' agent globs, tried once per agent, are not counted."""
    tried: list[str] = []
    original = Glob.matches

    def matches(self: Glob, value: str) -> bool:
        if not value.startswith("agent-"):
            tried.append(value)
        return original(self, value)

    monkeypatch.setattr(Glob, "matches", matches)
    return tried


def test_a_thousand_rules_decide_through_the_index_and_the_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the speed rests on, counted rather than timed (bench/overhead.py prints the times): a
    repeated (agent, tool) pair tries no pattern at all, and a first one tries only the globs whose
    literal prefix the name starts with, never the 900 exact names nor the 99 other globs."""
    ps = _big_policy_set()
    assert sum(len(p.rules) for p in ps.policies) == 1000
    calls = [
        ("srv1.tool_1", {}, Action.ALLOW),
        ("srv0.tool_600", {"amount": 10}, Action.ALLOW),
        ("srv0.tool_600", {"amount": 900}, Action.DENY),
        ("glob42.anything", None, Action.HUMAN_APPROVAL),
        ("not.listed", None, Action.DENY),
    ]
    for tool, args, action in calls:
        assert evaluate(ps, "agent-1", tool, args).action is action, tool
    tried = counting_matches(monkeypatch)
    for _ in range(3):
        for tool, args, action in calls:
            assert evaluate(ps, "agent-1", tool, args).action is action, tool
    assert tried == []
    for i in range(200):
        assert evaluate(ps, "agent-1", f"cold.tool_{i}").action is Action.DENY
    assert tried == []  # no glob's prefix starts "cold.": the catch-all is certain, nothing is tried
    assert evaluate(ps, "agent-2", "glob42.other").action is Action.HUMAN_APPROVAL
    assert tried == ["glob42.other"]
