"""Strict policy loading: every error kind names file, line and problem; globs; the Assay format."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.policy import (
    Action,
    GlobError,
    GlobKind,
    Op,
    PolicyLoadError,
    PolicySource,
    compile_glob,
    evaluate,
    load_policies,
    load_policy_text,
)
from drawbridge.policy.assay import AssayPattern, OutsidePattern
from drawbridge.policy.model import Truth
from drawbridge.policy.schemas import check_arguments
from drawbridge.state.policy_files import load_policy_dir, load_policy_file, load_policy_path

EXAMPLES = Path(__file__).resolve().parent.parent / "src" / "drawbridge" / "examples" / "policies"


def text(s: str) -> str:
    return textwrap.dedent(s).lstrip("\n")


GOOD = text(
    """
    name: demo
    agent: "demo-agent"
    description: a demo
    rules:
      - tools: ["github.list_*", "get_repo"]
        action: allow
      - tools: ["add_deploy_key"]
        action: human_approval
        when:
          - {arg: "repo", op: "starts_with", value: "prod-"}
          - {arg: ["options", "a.b"], op: "in", value: [1, "x"], if_missing: false}
      - tools: ["*"]
        action: deny
    schemas:
      add_deploy_key: {type: object, required: [owner, repo]}
    """
)


def load_error(body: str, name: str = "p.yaml") -> PolicyLoadError:
    with pytest.raises(PolicyLoadError) as info:
        load_policy_text(body, name, f"/etc/policies/{name}")
    return info.value


def expect(body: str, line: int | None, pattern: str) -> PolicyLoadError:
    err = load_error(body)
    assert err.file == "/etc/policies/p.yaml"
    assert err.line == line, str(err)
    assert re.search(pattern, err.problem), str(err)
    where = f"/etc/policies/p.yaml:{line}: " if line is not None else "/etc/policies/p.yaml: "
    assert str(err) == where + err.problem
    return err


def with_rule(rule: str) -> str:
    """A policy whose rule 0 is ``rule`` (its first line is line 4)."""
    return "name: p\nagent: a\nrules:\n" + textwrap.indent(text(rule), "  ")


def with_condition(cond: str) -> str:
    """A policy whose only condition (on line 6) is ``cond``."""
    return f"name: p\nagent: a\nrules:\n  - tools: [t]\n    when:\n      - {cond}\n    action: allow\n"


# ----------------------------------------------------------------------------- success


def test_good_policy_is_parsed_with_lines_and_provenance() -> None:
    ps = load_policy_text(GOOD, "demo.yaml", "/x/demo.yaml")
    (p,) = ps.policies
    assert (p.name, p.agent.text, p.source_file, p.description, p.line) == (
        "demo",
        "demo-agent",
        "demo.yaml",
        "a demo",
        1,
    )
    assert [(r.index, r.line, r.action) for r in p.rules] == [
        (0, 5, Action.ALLOW),
        (1, 7, Action.HUMAN_APPROVAL),
        (2, 12, Action.DENY),
    ]
    assert [t.text for t in p.rules[0].tools] == ["github.list_*", "get_repo"]
    c0, c1 = p.rules[1].conditions
    assert (c0.arg, c0.op, c0.value, c0.if_missing, c0.line) == (("repo",), Op.STARTS_WITH, "prod-", None, 10)
    assert (c1.arg, c1.op, c1.value, c1.if_missing, c1.line) == (
        ("options", "a.b"),
        Op.IN,
        (1, "x"),
        False,
        11,
    )
    assert set(p.schemas) == {"add_deploy_key"}
    assert p.schemas["add_deploy_key"].line == 15
    assert p.rules[1].conditional and not p.rules[0].conditional


def test_dotted_arg_is_a_path() -> None:
    ps = load_policy_text(with_condition('{arg: "a.b.c", op: "==", value: 1}'))
    assert ps.policies[0].rules[0].conditions[0].arg == ("a", "b", "c")


def test_yaml_oddities_that_are_still_json_are_accepted() -> None:
    body = with_condition('{arg: x, op: "==", value: !!str 5}')
    body += "schemas:\n  t: &s {type: object}\n  u: *s\n"
    p = load_policy_text(body).policies[0]
    assert p.rules[0].conditions[0].value == "5"
    assert p.schemas["u"].schema == {"type": "object"}
    anchored = with_condition('{arg: x, op: "==", value: &v true}')
    assert load_policy_text(anchored).policies[0].rules[0].conditions[0].value is True


def test_empty_rules_list_is_allowed() -> None:
    ps = load_policy_text("name: p\nagent: '*'\nrules: []\n")
    (p,) = ps.policies
    assert (p.name, p.agent.text, p.agent.kind, p.rules, dict(p.schemas), p.source_file, p.line) == (
        "p", "*", GlobKind.CATCH_ALL, (), {}, "<policy>", 1
    )
    assert evaluate(ps, "anyone", "t").action is Action.DENY  # no rule: the default deny


# ----------------------------------------------------------------------------- YAML-level errors


def test_yaml_syntax_error_names_line() -> None:
    expect("name: p\nagent: a\nrules: [\n", 4, r"^invalid YAML: ")


def test_duplicate_yaml_key() -> None:
    expect("name: p\nagent: a\nname: q\nrules: []\n", 3, r"duplicate key")


def test_two_documents() -> None:
    expect("name: p\nagent: a\nrules: []\n---\nname: q\n", 4, r"more than one YAML document")


def test_empty_file() -> None:
    expect("# nothing\n", 1, r"the file is empty")


def test_top_level_not_a_mapping() -> None:
    expect("- name: p\n", 1, r"top level must be a mapping")


def test_too_deep_nesting() -> None:
    body = "name: p\nagent: a\nrules: []\nschemas:\n  t: " + "[" * 500 + "]" * 500 + "\n"
    expect(body, 5, r"^the file nests too deeply \(more than 64 levels of lists and mappings\)$")


def test_tool_globs_refuse_control_and_format_characters_as_names_do() -> None:
    for escaped, char in (("\\u0000", "\x00"), ("\\u200b", "\u200b"), ("\\n", "\n"), ("\\t", "\t")):
        body = with_rule(f'- tools: [ok, "a{escaped}b"]\n  action: allow\n')
        err = expect(body, 4, r"^bad glob 'a\\.*b' in `tools`: contains a control or format character \(U\+")
        assert char not in str(err)
    expect('name: "p\\u200b"\nagent: a\nrules: []\n', 1, r"^`name` contains a control or format character$")
    expect('name: p\nagent: "a\\u0000"\nrules: []\n', 2, r"^`agent` contains a control or format character$")


def test_non_json_values() -> None:
    expect(with_condition("{arg: x, op: '==', value: 2024-01-01}"), 6, r"YAML type date is not plain JSON")
    expect(with_condition("{arg: x, op: '<', value: .inf}"), 6, r"must be finite")
    expect("name: p\nagent: a\nrules: []\nschemas:\n  t: {const: !!binary aGk=}\n", 5, r"not plain JSON")
    int_key = "name: p\nagent: a\nrules: []\nschemas:\n  t: {properties: {1: {}}}\n"
    expect(int_key, 5, r"key 1 is not a string")


# ----------------------------------------------------------------------------- keys


def test_unknown_top_level_key() -> None:
    body = "name: p\nagent: a\nrules: []\nrate_limit: {max_total: 3}\n"
    expect(body, 4, r"unknown key `rate_limit` in policy")


def test_unknown_rule_key() -> None:
    expect(with_rule("- tools: [t]\n  action: allow\n  comment: x\n"), 6, r"unknown key `comment` in rule")


def test_who_may_approve_and_the_memory_key_are_read_from_human_approval_rules() -> None:
    body = with_rule(
        "- tools: [a]\n  action: human_approval\n  approval: operator\n"
        "- tools: [b]\n  action: human_approval\n  memory_key: [path, options.mode]\n"
        "- tools: [c]\n  action: human_approval\n"
    )
    operator, keyed, plain = load_policy_text(body).policies[0].rules
    assert (str(operator.approver), operator.memory_key) == ("operator", ())
    assert (str(keyed.approver), keyed.memory_key) == ("any", (("path",), ("options", "mode")))
    assert (str(plain.approver), plain.memory_key) == ("any", ())
    decision = load_policy_text(body).policies[0].decisions[0]
    assert str(decision.approver) == "operator" and decision.as_dict()["approval"] == "operator"
    assert decision.reason.endswith("an operator must approve")


@pytest.mark.parametrize(
    ("rule", "line", "pattern"),
    [
        ("- tools: [t]\n  action: allow\n  approval: operator\n", 6, r"`approval` applies to human_approval rules only"),
        ("- tools: [t]\n  action: deny\n  memory_key: [path]\n", 6, r"`memory_key` applies to human_approval rules"),
        ("- tools: [t]\n  action: human_approval\n  approval: client\n", 6, r"unknown approval 'client' \(allowed: any, operator\)"),
        ("- tools: [t]\n  action: human_approval\n  memory_key: path\n", 6, r"non-empty list of argument names"),
        ("- tools: [t]\n  action: human_approval\n  memory_key: []\n", 6, r"non-empty list"),
        ("- tools: [t]\n  action: human_approval\n  memory_key: [a..b]\n", 6, r"argument name or a dotted path"),
        ("- tools: [t]\n  action: human_approval\n  approval: operator\n  memory_key: [p]\n", 7,
         r"no use with `approval: operator`"),
    ],
)
def test_bad_approval_terms_are_load_errors(rule: str, line: int, pattern: str) -> None:
    expect(with_rule(rule), line, pattern)


def test_mesh7_condition_key_gets_a_hint() -> None:
    err = expect(
        with_rule("- tools: [t]\n  action: allow\n  condition: {field: x, operator: '<', value: 1}\n"),
        6,
        r"unknown key `condition` in rule",
    )
    assert "when:" in err.problem


def test_unknown_condition_key() -> None:
    expect(with_condition("{arg: x, op: '==', value: 1, field: y}"), 6, r"unknown key `field` in condition")


def test_missing_required_keys() -> None:
    expect("agent: a\nrules: []\n", 1, r"missing required key `name`")
    expect("name: p\nrules: []\n", 1, r"missing required key `agent`")
    expect("name: p\nagent: a\n", 1, r"missing required key `rules`")
    expect(with_rule("- action: allow\n"), 4, r"rule 0 is missing required key `tools`")
    expect(with_rule("- tools: [t]\n"), 4, r"rule 0 is missing required key `action`")
    expect(with_condition("{op: '==', value: 1}"), 6, r"missing required key `arg`")
    expect(with_condition("{arg: x, value: 1}"), 6, r"missing required key `op`")
    expect(with_condition("{arg: x, op: '=='}"), 6, r"missing required key `value`")


def test_bad_scalar_types_for_name_and_agent() -> None:
    expect("name: ''\nagent: a\nrules: []\n", 1, r"`name` must be a non-empty string")
    expect("name: [x]\nagent: a\nrules: []\n", 1, r"`name` must be a non-empty string")
    expect("name: p\nagent: 3\nrules: []\n", 2, r"`agent` must be a non-empty string")
    expect("name: p\nagent: a\nrules: {}\n", 3, r"`rules` must be a list")
    expect("name: p\nagent: a\nrules: [allow]\n", 3, r"rule 0 must be a mapping")


# ----------------------------------------------------------------------------- actions and globs


@pytest.mark.parametrize("action", ["alow", "Allow", "approve", "human-approval", "''"])
def test_unknown_action(action: str) -> None:
    body = with_rule(f"- tools: [t]\n  action: {action}\n")
    expect(body, 5, r"unknown action .* \(allowed: allow, human_approval, deny\)")


def test_non_string_action() -> None:
    expect(with_rule("- tools: [t]\n  action: [allow]\n"), 5, r"unknown action")


@pytest.mark.parametrize("glob", ["'a[b'", "'a\\'", "'[]a'", "'[a-]'", "'[^]'", "'a[\\'", "''"])
def test_bad_tool_glob(glob: str) -> None:
    expect(with_rule(f"- tools: [x, {glob}]\n  action: allow\n"), 4, r"bad glob .* in `tools`|empty glob")


def test_bad_agent_glob() -> None:
    body = "name: p\nagent: 'bot-[x'\nrules: []\n"
    expect(body, 2, r"bad agent glob 'bot-\[x': unterminated character class")


def test_tools_shape_errors() -> None:
    expect(with_rule("- tools: t\n  action: allow\n"), 4, r"`tools` must be a non-empty list")
    expect(with_rule("- tools: []\n  action: allow\n"), 4, r"`tools` must be a non-empty list")
    body = with_rule("- tools:\n    - a\n    - 3\n  action: allow\n")
    expect(body, 6, r"each entry of `tools` must be a string")


# ----------------------------------------------------------------------------- conditions


def test_when_shape_errors() -> None:
    body = with_rule("- tools: [t]\n  action: allow\n  when: {arg: x}\n")
    expect(body, 6, r"`when` must be a non-empty list")
    expect(with_rule("- tools: [t]\n  action: allow\n  when: []\n"), 6, r"`when` must be a non-empty list")
    expect(with_condition("x == 1"), 6, r"each entry of `when` must be a mapping")


@pytest.mark.parametrize(
    ("cond", "pattern"),
    [
        ("{arg: 'a..b', op: '==', value: 1}", r"empty path segment"),
        ("{arg: 3, op: '==', value: 1}", r"`arg` must be"),
        ("{arg: [], op: '==', value: 1}", r"`arg` must be"),
        (
            "{arg: x, op: '=~', value: 1}",
            r"unknown operator '=~' \(allowed: ==, !=, <, <=, >, >=, starts_with, in, matches\)",
        ),
        ("{arg: x, op: 3, value: 1}", r"`op` must be a string"),
        ("{arg: x, op: '<', value: '5'}", r"value for < must be a finite number"),
        ("{arg: x, op: '>=', value: true}", r"value for >= must be a finite number"),
        ("{arg: x, op: '==', value: [1]}", r"must be a string, number, boolean or null"),
        ("{arg: x, op: '!=', value: {a: 1}}", r"must be a string, number, boolean or null"),
        ("{arg: x, op: starts_with, value: 5}", r"value for starts_with must be a string"),
        ("{arg: x, op: in, value: a}", r"value for in must be a non-empty list"),
        ("{arg: x, op: in, value: []}", r"value for in must be a non-empty list"),
        ("{arg: x, op: in, value: [[1]]}", r"every item of the value for in"),
        ("{arg: x, op: matches, value: 5}", r"value for matches must be a string"),
        (
            "{arg: x, op: matches, value: 'a(b'}",
            r"regex is not valid: missing \), unterminated subpattern at position 1",
        ),
        ("{arg: x, op: matches, value: '(a+)+'}", r"nests repetition or alternation inside an unbounded"),
        ("{arg: x, op: matches, value: '(ab|a)*'}", r"nests repetition or alternation inside an unbounded"),
        ("{arg: x, op: matches, value: '(a)\\1'}", r"backreference"),
        ("{arg: x, op: matches, value: 'a*b*c*'}", r"could backtrack too much"),
        ("{arg: x, op: '==', value: 1, if_missing: 'no'}", r"`if_missing` must be true or false"),
    ],
)
def test_bad_condition(cond: str, pattern: str) -> None:
    expect(with_condition(cond), 6, pattern)


def test_regex_too_long() -> None:
    expect(with_condition("{arg: x, op: matches, value: '" + "a" * 513 + "'}"), 6, r"regex is longer than 512 characters")


@pytest.mark.parametrize(
    ("rx", "matching", "other"),  # `other` mostly holds a match, but the whole value must match
    [
        ("prod-[a-z0-9-]+", "prod-eu-1", "staging-prod-eu-1"),
        (".*foo.*", "a foo b", "a fo o b"),
        (r"\d{1,3}(\.\d{1,3}){3}", "10.0.0.255", "10.0.0.2555"),
        ("(?:ab)+", "ababab", "abababa"),
        ("x{2,5}y", "xxxy", "xxxxxxy"),
    ],
)
def test_acceptable_regexes_compile(rx: str, matching: str, other: str) -> None:
    ps = load_policy_text(with_condition(f"{{arg: x, op: matches, value: '{rx}'}}"), "p.yaml", "/etc/p.yaml")
    (p,) = ps.policies
    (rule,) = p.rules
    assert (p.name, p.agent.text, p.source_file) == ("p", "a", "p.yaml")
    assert (rule.index, rule.line, rule.action, [t.text for t in rule.tools]) == (0, 4, Action.ALLOW, ["t"])
    (condition,) = rule.conditions
    assert (condition.arg, condition.op, condition.value, condition.if_missing, condition.line) == (
        ("x",), Op.MATCHES, rx, None, 6
    )
    # The compiled regex is the one written: it decides the condition, and through it the call.
    assert condition.test(matching) is Truth.TRUE
    assert condition.test(other) is Truth.FALSE
    assert condition.test(5) is Truth.UNKNOWN
    assert evaluate(ps, "a", "t", {"x": matching}).action is Action.ALLOW
    assert evaluate(ps, "a", "t", {"x": other}).action is Action.DENY


# ----------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    ("schemas", "line", "pattern"),
    [
        ("schemas: [a]\n", 4, r"`schemas` must be a mapping"),
        ("schemas:\n  'github.*': {type: object}\n", 5, r"exact tool names; 'github\.\*' looks like a glob"),
        (
            "schemas:\n  t: {type: objekt}\n",
            5,
            r"schema for tool 't': not a valid Draft 2020-12 schema: .* \(at /type\)",
        ),
        ("schemas:\n  t: {required: x}\n", 5, r"not a valid Draft 2020-12 schema"),
        ("schemas:\n  t: 'object'\n", 5, r"a schema must be a mapping"),
        (
            "schemas:\n  t: {$schema: 'http://json-schema.org/draft-07/schema#'}\n",
            5,
            r"\$schema must be .*2020-12",
        ),
        (
            "schemas:\n  t: {$ref: 'https://example.com/s.json'}\n",
            5,
            r"leaves the schema; only '#\.\.\.' is allowed",
        ),
        ("schemas:\n  t: {properties: {a: {$ref: '#/$defs/nope'}}}\n", 5, r"points nowhere"),
        ("schemas:\n  t: {$defs: {a: {$id: 'x', type: string}}}\n", 5, r"nested \$id"),
        (
            "schemas:\n  t: {properties: {a: {pattern: '^(a+)+$'}}}\n",
            5,
            r"regex at /properties/a/pattern nests repetition",
        ),
        (
            "schemas:\n  t: {properties: {a: {pattern: '[a-z]+-[0-9]+$'}}}\n",
            5,
            r"could backtrack too much .*\(anchor it with \^, without \(\?m\)\)",
        ),
        # Under (?m), ^ matches after every line break: 4096 of them made one call run for 80 s.
        (
            "schemas:\n  t: {properties: {a: {pattern: '(?m)^[\\s\\S]*[\\s\\S]*x'}}}\n",
            5,
            r"regex at /properties/a/pattern could backtrack too much",
        ),
        ("schemas:\n  t: {properties: {a: {pattern: '(?m)^a*a*x'}}}\n", 5, r"could backtrack too much"),
        # A property named like a value keyword holds a schema: its pattern is checked as any other.
        (
            "schemas:\n  t: {properties: {default: {pattern: '(a+)+$'}}}\n",
            5,
            r"regex at /properties/default/pattern nests repetition",
        ),
        (
            "schemas:\n  t: {$defs: {const: {patternProperties: {'(x|xy)+': {}}}}}\n",
            5,
            r"regex at /\$defs/const/patternProperties/",
        ),
        ("schemas:\n  t: {patternProperties: {'(x|xy)+': {}}}\n", 5, r"regex at /patternProperties/"),
        # additionalProperties runs them as '^a|(?i)^b', which does not compile: every call raised re.error.
        (
            "schemas:\n  t: {patternProperties: {'^a': {}, '(?i)^b': {}}, additionalProperties: false}\n",
            5,
            r"the regexes at /patternProperties, joined with \| as a validator runs them, is not valid: global "
            r"flags not at the start .*scoped: \(\?i:\.\.\.\)\)$",
        ),
    ],
)
def test_bad_schema(schemas: str, line: int, pattern: str) -> None:
    expect("name: p\nagent: a\nrules: []\n" + schemas, line, pattern)


def test_good_schema_with_local_refs_and_value_keywords() -> None:
    body = "name: p\nagent: a\nrules: []\nschemas:\n  t:\n    $defs: {s: {type: string}}\n"
    body += "    properties: {a: {$ref: '#/$defs/s'}, b: {const: {$ref: 'https://not-a-ref'}}}\n"
    body += "    patternProperties: {'^x-': {pattern: '^[a-z]+-[0-9]+$'}, 'y': {pattern: '[a-z]+'}}\n"
    (p,) = load_policy_text(body, "p.yaml").policies
    assert (p.name, p.rules, list(p.schemas)) == ("p", (), ["t"])
    schema = p.schemas["t"]
    assert (schema.tool, schema.line) == ("t", 5)
    assert schema.schema == {
        "$defs": {"s": {"type": "string"}},
        "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"const": {"$ref": "https://not-a-ref"}}},
        "patternProperties": {"^x-": {"pattern": "^[a-z]+-[0-9]+$"}, "y": {"pattern": "[a-z]+"}},
    }
    # The local $ref resolves, a $ref inside `const` is a value, and both patterns apply.
    valid = {"a": "s", "b": {"$ref": "https://not-a-ref"}, "x-1": "abc-12", "zyz": "a1"}
    assert check_arguments(schema, valid) is None
    wrong = [({"a": 5}, "/a", "type"), ({"b": "x"}, "/b", "const"), ({"x-1": "ABC"}, "/x-1", "pattern"),
             ({"zyz": "1"}, "/zyz", "pattern")]
    for arguments, pointer, keyword in wrong:
        violation = check_arguments(schema, arguments)
        assert violation is not None and (violation.pointer, violation.keyword) == (pointer, keyword), arguments
    boolean = load_policy_text("name: p\nagent: a\nrules: []\nschemas:\n  t: false\n")
    (refusing,) = boolean.policies[0].schemas.values()
    assert (refusing.tool, refusing.schema, refusing.line) == ("t", False, 5)
    assert check_arguments(refusing, {}) is not None  # `false` accepts nothing


# ----------------------------------------------------------------------------- several files


def test_duplicate_policy_name_across_files() -> None:
    a = PolicySource("a.yaml", "name: same\nagent: x\nrules: []\n", "/d/a.yaml")
    b = PolicySource("b.yaml", "# second\nname: same\nagent: y\nrules: []\n", "/d/b.yaml")
    with pytest.raises(PolicyLoadError) as info:
        load_policies([b, a])  # given out of order: files are sorted by name first
    assert str(info.value) == "/d/b.yaml:2: duplicate policy name 'same' (also in /d/a.yaml)"


def test_error_without_line_formats_as_file_colon_problem() -> None:
    err = PolicyLoadError("/x/p.yaml", None, "file does not exist")
    assert str(err) == "/x/p.yaml: file does not exist"
    assert str(PolicyLoadError("f", 3, "bad")) == "f:3: bad"


def test_specificity_orders_policies(tmp_path: Path) -> None:
    files = {
        "a-star.yaml": "*",
        "b-short.yaml": "bot-*",
        "c-exact.yaml": "bot-7",
        "d-long.yaml": "bot-7*",
        "e-class.yaml": "[b]ot-7",
        "f-exact.yaml": "bot-7",
        "g-question.yaml": "bot-?",
    }
    for name, agent in files.items():
        (tmp_path / name).write_text(f"name: {name[:-5]}\nagent: '{agent}'\nrules: []\n")
    ps = load_policy_dir(tmp_path)
    # exact (file order) > longer literal prefix ("bot-7*") > "bot-" prefixes (file order)
    # > "" prefix > "*"
    assert [p.name for p in ps.policies] == [
        "c-exact",
        "f-exact",
        "d-long",
        "b-short",
        "g-question",
        "e-class",
        "a-star",
    ]


def test_directory_reading_rules(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: a\nagent: x\nrules: []\n")
    (tmp_path / "b.yml").write_text("name: b\nagent: x\nrules: []\n")
    (tmp_path / ".hidden.yaml").write_text("broken: [\n")
    (tmp_path / "a.yaml.bak").write_text("broken: [\n")
    (tmp_path / "notes.txt").write_text("broken: [\n")
    (tmp_path / "sub.yaml").mkdir()
    (tmp_path / "c.yaml").write_bytes(b"\xef\xbb\xbfname: c\nagent: x\nrules: []\n")  # BOM dropped
    loaded = load_policy_dir(tmp_path).policies
    assert [(p.name, p.agent.text, p.source_file, p.line, p.rules) for p in loaded] == [
        ("a", "x", "a.yaml", 1, ()), ("b", "x", "b.yml", 1, ()), ("c", "x", "c.yaml", 1, ()),
    ]


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match=r"policy directory does not exist$"):
        load_policy_dir(tmp_path / "nope")
    with pytest.raises(PolicyLoadError, match=r"nope\.yaml: file does not exist$"):
        load_policy_file(tmp_path / "nope.yaml")
    with pytest.raises(PolicyLoadError, match=r"gone: policy directory does not exist$"):
        load_policy_path(tmp_path / "gone")  # what serve's policy_dir and --policy are read with
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: p\nagent: a\nrules: [\xff]\n")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    assert (info.value.file, info.value.line) == (str(bad), 3)
    assert "not valid UTF-8" in info.value.problem


def test_example_policies_load_and_decide_as_documented() -> None:
    ps = load_policy_dir(EXAMPLES)
    assert [p.name for p in ps.policies] == ["demo", "default"]
    key = {"owner": "o", "repo": "r"}
    assert evaluate(ps, "demo-agent", "list_repos").action is Action.ALLOW
    assert evaluate(ps, "demo-agent", "github.get_repo", {}).action is Action.ALLOW
    assert evaluate(ps, "demo-agent", "add_deploy_key", key).action is Action.HUMAN_APPROVAL
    read_only = {**key, "read_only": True}
    assert evaluate(ps, "demo-agent", "add_deploy_key", read_only).action is Action.HUMAN_APPROVAL
    assert evaluate(ps, "demo-agent", "add_deploy_key", {**key, "read_only": False}).action is Action.DENY
    assert evaluate(ps, "demo-agent", "add_deploy_key", {"owner": "o"}).action is Action.DENY
    assert evaluate(ps, "demo-agent", "delete_repo", {}).action is Action.DENY
    other = evaluate(ps, "demo-agent", "create_issue", {})
    assert (other.action, other.policy, other.source_file) == (Action.DENY, "default", "default.yaml")
    assert evaluate(ps, "someone-else", "list_repos").policy == "default"


# ----------------------------------------------------------------------------- globs (mesh7 semantics)


GLOB_CASES = [
    # mesh7's own table (internal/match/match_test.go)
    ("*", "anything", True),
    ("foo", "foo", True),
    ("foo", "bar", False),
    ("foo.*", "foo.bar", True),
    ("foo.*", "baz.bar", False),
    ("test-*", "test-agent", True),
    # "*" alone crosses "/"; a "*" inside a pattern does not; "." is not special
    ("*", "a/b", True),
    ("github.*", "github.a/b", False),
    ("github.*", "github.repos.list", True),
    ("*.read_*", "filesystem.read_file", True),
    ("?", "a", True),
    ("?", "/", False),
    ("?", "ab", False),
    ("[abc]x", "bx", True),
    ("[^abc]x", "dx", True),
    ("[^abc]x", "ax", False),
    ("[a-c]", "b", True),
    ("[z-a]", "a", False),  # empty range matches nothing
    ("[/]", "/", True),  # a class may match the separator
    ("a\\*", "a*", True),
    ("a\\*", "ab", False),
    ("[\\]]", "]", True),
    ("Foo", "foo", False),  # case-sensitive
    ("get_*", "get_", True),
    ("get_*", "xget_a", False),  # anchored
    ("[ab]", "[ab]", True),  # mesh7's GlobAny: a pattern equal to the value matches
]


@pytest.mark.parametrize(("pattern", "value", "expected"), GLOB_CASES)
def test_glob_semantics(pattern: str, value: str, expected: bool) -> None:
    assert compile_glob(pattern).matches(value) is expected


def test_glob_kinds_and_prefixes() -> None:
    assert compile_glob("*").kind is GlobKind.CATCH_ALL
    assert compile_glob("demo-agent").kind is GlobKind.EXACT
    assert compile_glob("a\\*b").exact_value == "a*b"
    g = compile_glob("bot-\\?x*")
    assert (g.kind, g.literal_prefix) == (GlobKind.PARTIAL, "bot-?x")
    with pytest.raises(GlobError):
        compile_glob("a[")


def _go_match(pattern: str, name: str) -> bool:
    """Independent reference: Go's filepath.Match for patterns of literals, '*' and '?'."""
    if not pattern:
        return not name
    head = pattern[0]
    if head == "*":
        for i in range(len(name) + 1):
            if "/" in name[:i]:
                break
            if _go_match(pattern[1:], name[i:]):
                return True
        return False
    if not name:
        return False
    if head == "?":
        return name[0] != "/" and _go_match(pattern[1:], name[1:])
    return head == name[0] and _go_match(pattern[1:], name[1:])


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab./*?", max_size=7), st.text(alphabet="ab./", max_size=7))
def test_glob_agrees_with_a_reference_matcher(pattern: str, name: str) -> None:
    if pattern == "":
        return
    expected = True if pattern == "*" else (pattern == name or _go_match(pattern, name))
    assert compile_glob(pattern).matches(name) is expected


# ----------------------------------------------------------------------------- Assay format


ASSAY = text(
    """
    version: "1"
    name: base
    tools:
      allow: ["deploy", "read_*"]
      deny: ["delete_all", "*secret*"]
      approval_required: ["deploy"]
      deny_classes: ["danger"]
    tool_classes:
      wipe: ["danger"]
    schemas:
      $defs:
        env: {enum: ["staging", "prod"]}
      deploy:
        type: object
        properties:
          env: {$ref: "#/$defs/env"}
        required: ["env"]
    """
)


def test_assay_format_is_detected_and_converted() -> None:
    ps = load_policy_text(ASSAY, "assay.yaml", "/p/assay.yaml")
    (p,) = ps.policies
    assert (p.name, p.agent.text, p.source_file) == ("base", "*", "assay.yaml")
    assert p.assay_policy is not None and p.assay_policy["tools"]["deny"] == ["delete_all", "*secret*"]
    assert [r.action for r in p.rules] == [Action.DENY, Action.DENY, Action.HUMAN_APPROVAL, Action.ALLOW]
    assert isinstance(p.rules[0].tools[0], AssayPattern)
    assert isinstance(p.rules[1].tools[0], OutsidePattern)
    assert p.rules[0].line == 5 and p.rules[1].line == 4 and p.rules[2].line == 6

    def act(tool: str, args: object = None) -> Action:
        return evaluate(ps, "any-agent", tool, args).action

    assert act("delete_all") is Action.DENY  # tools.deny, exact
    assert act("get_secret_key") is Action.DENY  # *secret*: Assay substring, not a glob
    assert act("wipe") is Action.DENY  # deny_classes through tool_classes
    assert act("write_file") is Action.DENY  # outside the allowlist
    assert act("read_a/b") is Action.ALLOW  # Assay's prefix form crosses "/"
    assert act("deploy", {"env": "prod"}) is Action.HUMAN_APPROVAL  # approval obligation enforced
    refused = evaluate(ps, "any-agent", "deploy", {"env": "dev"})
    assert (refused.action, refused.rule_index, refused.line) == (Action.DENY, None, 13)
    assert "`enum` fails at /env" in refused.reason


def test_an_assay_format_file_in_a_policy_directory_is_refused_with_its_line(tmp_path: Path) -> None:
    """In a directory it became an allow-all policy for every agent, sorted before the native ones."""
    (tmp_path / "assay.yaml").write_text('# Assay\nversion: "2.0"\ntools:\n  deny: ["exec*"]\n', encoding="utf-8")
    (tmp_path / "team.yaml").write_text("name: team\nagent: bot\nrules:\n  - tools: ['*']\n    action: deny\n",
                                        encoding="utf-8")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    assert (info.value.file, info.value.line) == (str(tmp_path / "assay.yaml"), 2)
    assert info.value.problem.startswith(
        "an Assay-format policy (`version`, no `agent` or `rules`) is read only as a single file"
    )
    with pytest.raises(PolicyLoadError, match="read only as a single file"):
        load_policy_path(tmp_path)
    single = load_policy_file(tmp_path / "assay.yaml").policies[0]  # as one file it is what §8 says
    assert (single.agent.text, single.assay_policy is not None) == ("*", True)


def test_assay_unconstrained_deny_and_no_allowlist() -> None:
    body = 'version: "2.0"\nenforcement: {unconstrained_tools: deny}\nschemas:\n  t: {type: object}\n'
    ps = load_policy_text(body, "u.yaml")
    assert ps.policies[0].name == "u"  # no Assay name: the file's stem
    assert evaluate(ps, "a", "t", {}).action is Action.ALLOW
    assert evaluate(ps, "a", "other", {}).action is Action.DENY


def test_assay_errors_name_file_and_line() -> None:
    err = load_error('version: "2.0"\ntools:\n  allow: read_file\n', "assay.yaml")
    assert err.line == 3 and err.problem.startswith("Assay-format policy: tools.allow: expected a list")
    err = load_error('version: "2.0"\ntools:\n  allow: []\n  frobnicate: []\n', "assay.yaml")
    assert (err.line, err.problem) == (4, "Assay-format policy: unknown key `tools.frobnicate`")
    err = load_error('version: "2.0"\nschemas:\n  t: {type: objekt}\n', "assay.yaml")
    assert err.line == 3 and "schema for tool 't'" in err.problem
