"""One strict YAML reading for policies and the configuration (``drawbridge.policy.strict_yaml``).

Every refusal is one line located ``file:line: problem``, whichever file it is in: malformed YAML,
duplicate keys (named, their values never shown), custom tags anywhere, values that are not plain
JSON, nesting past the depth bound and anchors that expand past the value bound (refused at once,
not after expanding them). The commands that read a configuration say it in one line and exit 2.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, child_env, scaled

from drawbridge.config import ConfigError, parse_config
from drawbridge.policy import PolicyLoadError, load_policy_text
from drawbridge.policy.strict_yaml import MAX_DEPTH, MAX_VALUES, YamlProblem, read_yaml

CONFIG_HEAD = "policy_dir: ./policies\nupstreams:\n  - {name: gh, transport: stdio, command: gh}\n"
POLICY_HEAD = "name: p\nagent: '*'\n"


def _bomb(levels: int = 9) -> str:
    """Anchors that each hold ten aliases of the one before: 10**levels values once expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def _config_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/drawbridge.yaml", {})
    return info.value


def _policy_error(text: str) -> PolicyLoadError:
    with pytest.raises(PolicyLoadError) as info:
        load_policy_text(text, "p.yaml", "/etc/policies/p.yaml")
    return info.value


def _one_line(error: Exception, file: str, line: int, problem: str) -> None:
    text = str(error)
    assert "\n" not in text, text
    assert text == f"{file}:{line}: {problem}", text


# ----------------------------------------------------------------------------- the configuration


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("upstreams: [\n", 2, "invalid YAML: expected the node content, but found '<stream end>'"),
        (CONFIG_HEAD + "listen: {port: 1}\nlisten: {port: 2}\n", 5, 'invalid YAML: duplicate key "listen"'),
        (CONFIG_HEAD + "listen: !listener {port: 1}\n", 4,
         'custom tag "!listener": custom tags are errors (values are plain JSON)'),
        ("!config\n" + CONFIG_HEAD, 1, 'custom tag "!config": custom tags are errors (values are plain JSON)'),
        (CONFIG_HEAD + "evidence_dir: 2024-01-01\n", 4, "a value of YAML type date is not plain JSON"),
        (CONFIG_HEAD + "state_path: !!binary aGk=\n", 4, "a value of YAML type binary is not plain JSON"),
        (CONFIG_HEAD + "x: " + "[" * 500 + "]" * 500 + "\n", 4,
         f"the file nests too deeply (more than {MAX_DEPTH} levels of lists and mappings)"),
        ("policy_dir: ./policies\nupstreams: {name: gh}\n", 2, "config.upstreams must be a list"),
        (CONFIG_HEAD + "auth: {agents: {a: 1}}\n", 4, "auth.agents must be a list"),
        (CONFIG_HEAD + "listen: [1]\n", 4, "listen must be a mapping"),
        # A plain value carries no position of its own: it is located by its key, or by its list.
        (CONFIG_HEAD + "rate_limits: 5\n", 4, "rate_limits must be a mapping"),
        (CONFIG_HEAD + "auth: {oauth: yes-please}\n", 4, "auth.oauth must be a mapping"),
        (CONFIG_HEAD + "auth:\n  agents: [claude]\n", 5, "auth.agents[0] must be a mapping"),
        (CONFIG_HEAD + "auth:\n  agents:\n    - {agent: a, token_sha256: '" + "a" * 64 + "'}\n    - claude\n", 7,
         "auth.agents[1] must be a mapping"),
        (CONFIG_HEAD + "auth:\n  oauth:\n    authorization_servers:\n      - 'http://127.0.0.1:1'\n", 7,
         "auth.oauth.authorization_servers[0] must be a mapping"),
        ("policy_dir: ./policies\nupstreams:\n  - {name: gh, transport: stdio, command: gh}\n  - gh\n", 4,
         "upstreams[1] must be a mapping"),
        (CONFIG_HEAD + "openapi: [spec.yaml]\n", 4, "openapi[0] must be a mapping"),
        (CONFIG_HEAD + "approval:\n  notify:\n    - WEBHOOK_URL\n", 6, "approval.notify[0] must be a mapping"),
    ],
)
def test_a_configuration_problem_is_one_located_line(text: str, line: int, problem: str) -> None:
    _one_line(_config_error(text), "/etc/drawbridge.yaml", line, problem)


def test_a_duplicate_key_never_shows_its_values() -> None:
    text = CONFIG_HEAD + 'auth:\n  admin: {token_sha256: "' + "a" * 64 + '", token_sha256: "' + "b" * 64 + '"}\n'
    error = _config_error(text)
    _one_line(error, "/etc/drawbridge.yaml", 5, 'invalid YAML: duplicate key "token_sha256"')
    assert "aaaa" not in str(error) and "bbbb" not in str(error)


def test_an_alias_bomb_in_a_configuration_is_refused_at_once() -> None:
    began = time.monotonic()
    error = _config_error(CONFIG_HEAD + _bomb())
    assert time.monotonic() - began < scaled(5)
    assert str(error).startswith("/etc/drawbridge.yaml:")
    assert f"more than {MAX_VALUES:,} values, counting each alias as a copy of its anchor" in str(error)


# ----------------------------------------------------------------------------- policies


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (POLICY_HEAD + "rules: !custom []\n", 3, 'custom tag "!custom"'),
        (POLICY_HEAD + "rules:\n  - !rule {tools: [a], action: allow}\n", 4, 'custom tag "!rule"'),
        ("!policy\n" + POLICY_HEAD + "rules: []\n", 1, 'custom tag "!policy"'),
        (POLICY_HEAD + "rules: []\nschemas: {t: !foo {type: object}}\n", 4, 'custom tag "!foo"'),
        (POLICY_HEAD + "rules:\n  - tools: [a]\n    action: !foo allow\n", 5, 'custom tag "!foo"'),
        (POLICY_HEAD + "rules:\n  - tools: [!<tag:example.com,2000:t> a]\n    action: allow\n", 4,
         'custom tag "tag:example.com,2000:t"'),
        (POLICY_HEAD + "rules: []\nschemas: {t: !!str {type: object}}\n", 4, 'the tag "!!str" does not fit a mapping'),
        (POLICY_HEAD + "rules: []\nschemas: {t: {maxLength: !!int ten}}\n", 4,
         'invalid YAML: the value does not read as its tag "!!int" says'),
    ],
)
def test_custom_tags_are_refused_anywhere_in_a_policy(text: str, line: int, problem: str) -> None:
    error = _policy_error(text)
    assert (error.line, error.problem.split(":")[0]) == (line, problem.split(":")[0]), str(error)
    assert error.problem.startswith(problem) and "\n" not in str(error), str(error)


@pytest.mark.parametrize(
    ("text", "line", "kind"),
    [
        ("name: 2024-01-01\nagent: '*'\nrules: []\n", 1, "date"),  # before "`name` must be a non-empty string"
        ("name: p\nagent: 2024-01-01T10:00:00Z\nrules: []\n", 2, "timestamp"),
        (POLICY_HEAD + "rules: []\nschemas:\n  t: {const: !!binary aGk=}\n", 5, "binary"),
        (POLICY_HEAD + "rules: []\nschemas:\n  t: {enum: !!set {a, b}}\n", 5, "set"),
        (POLICY_HEAD + "rules: []\nschemas:\n  t: !!omap [type: object]\n", 5, "omap"),
        (POLICY_HEAD + "description: ok\nrules: []\nschemas:\n  t: {type: object}\n  2024-01-01: {}\n", 7, "date"),
    ],
)
def test_values_that_are_not_plain_json_are_refused_where_they_stand(text: str, line: int, kind: str) -> None:
    _one_line(_policy_error(text), "/etc/policies/p.yaml", line, f"a value of YAML type {kind} is not plain JSON")


def test_str_tags_anchors_and_aliases_within_the_bounds_still_load() -> None:
    body = POLICY_HEAD + "rules:\n  - tools: [a]\n    action: allow\n    when: [{arg: x, op: '==', value: !!str 5}]\n"
    body += "schemas:\n  t: &s {type: object, properties: {a: {type: string}}}\n  u: *s\n"
    body += "  v: " + "{items: " * (MAX_DEPTH - 3) + "{}" + "}" * (MAX_DEPTH - 3) + "\n"  # the root is level 1
    policy = load_policy_text(body).policies[0]
    assert policy.rules[0].conditions[0].value == "5"
    assert policy.schemas["u"].schema == policy.schemas["t"].schema == {
        "type": "object", "properties": {"a": {"type": "string"}},
    }


_SPELLING = ("spelled so that YAML readers read it differently (such as 1_000, 012, 0b1, 0x_1, 1e_3): "
             "write it plainly (1000, 12) or quote it")
_RULE = "rules:\n  - tools: [x]\n    action: allow\n    when: [{arg: n, op: '==', value: %s}]\n"


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        # A merge key: `action: deny` overrode the merged allow without a duplicate-key error.
        (POLICY_HEAD + "rules:\n  - <<: {action: allow}\n    tools: [x]\n    action: deny\n", 4,
         "merge keys (`<<`) are refused: readers differ on what they merge and which value wins; write the keys out"),
        (POLICY_HEAD + "rules:\n  - &b {tools: [x], action: deny}\n  - <<: *b\n    tools: [y]\n", 5,
         "merge keys (`<<`) are refused: readers differ on what they merge and which value wins; write the keys out"),
        # YAML 1.1 reads `no` as false, `1:20` as 80 and `010` as 8.
        ("%YAML 1.1\n---\n" + POLICY_HEAD + _RULE % "no", 2,
         "a %YAML directive other than 1.2 is refused: YAML 1.1 reads values differently (no is false, 1:20 is 80, "
         "010 is 8); remove the directive"),
        (POLICY_HEAD + _RULE % "1_000", 6, "an integer " + _SPELLING),
        (POLICY_HEAD + _RULE % "0x_1", 6, "an integer " + _SPELLING),
        (POLICY_HEAD + _RULE % "0b11", 6, "an integer " + _SPELLING),
        (POLICY_HEAD + _RULE % "010", 6, "an integer " + _SPELLING),
        (POLICY_HEAD + _RULE % "0.1_0", 6, "a number " + _SPELLING),
        (POLICY_HEAD + _RULE % "!!int 1_000", 6, "an integer " + _SPELLING),
    ],
)
def test_text_whose_meaning_depends_on_the_reader_is_refused(text: str, line: int, problem: str) -> None:
    _one_line(_policy_error(text), "/etc/policies/p.yaml", line, problem)


def test_a_yaml_1_1_file_is_refused_before_ruamel_can_warn_about_a_value(capfd: pytest.CaptureFixture[str]) -> None:
    """ruamel warned on stderr, quoting the value and its line, about a 1.1 float such as 1e3."""
    error = _policy_error("%YAML 1.1\n---\n" + POLICY_HEAD + _RULE % "1e3")
    assert error.line == 2
    assert capfd.readouterr().err == ""


def test_the_configuration_refuses_what_readers_read_differently_without_quoting_it() -> None:
    error = _config_error(CONFIG_HEAD + "limits: {max_message_bytes: 4_194_304}\n")
    _one_line(error, "/etc/drawbridge.yaml", 4, "an integer " + _SPELLING)
    assert "4_194_304" not in str(error)
    error = _config_error("%YAML 1.1\n---\n" + CONFIG_HEAD)
    assert error.line == 2 and "%YAML directive other than 1.2" in error.problem


def test_numbers_every_reader_agrees_on_still_load() -> None:
    for text, value in (("1000", 1000), ("-0", 0), ("+7", 7), ("0x1F", 31), ("0o17", 15), ("1.5e3", 1500.0),
                        (".5", 0.5), ("'010'", "010"), ("!!str 1_000", "1_000"), ("1:20", "1:20")):
        policy = load_policy_text(POLICY_HEAD + _RULE % text).policies[0]
        assert policy.rules[0].conditions[0].value == value, text


def test_the_assay_reader_and_the_strict_reader_share_one_rule_for_numbers() -> None:
    from drawbridge.evidence.truth.assay_errors import AssayPolicyError
    from drawbridge.evidence.truth.assay_yaml import load_text

    for text in ("1_000", "012", "0b1", "0x_1"):
        with pytest.raises(AssayPolicyError, match="ambiguous integer spelling"):
            load_text(f"limits: {{n: {text}}}\n")
        assert _policy_error(POLICY_HEAD + _RULE % text).problem == "an integer " + _SPELLING


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (POLICY_HEAD.replace("name: p\n", "name: a\n!!str name: b\n") + "rules: []\n", 2,
         'invalid YAML: duplicate key "name"'),
        (POLICY_HEAD + "rules:\n  - tools: [x]\n    action: allow\n    !!str action: deny\n", 6,
         'invalid YAML: duplicate key "action"'),
    ],
)
def test_a_str_tagged_key_is_the_plain_key_so_a_duplicate_is_named(text: str, line: int, problem: str) -> None:
    _one_line(_policy_error(text), "/etc/policies/p.yaml", line, problem)


def test_str_tagged_values_load_as_their_plain_value() -> None:
    body = "name: !!str p\nagent: !!str '*'\nrules:\n  - tools: [!!str x, !!str 'y*']\n    action: !!str deny\n"
    policy = load_policy_text(body).policies[0]
    assert (policy.name, policy.agent.text) == ("p", "*")
    assert [t.text for t in policy.rules[0].tools] == ["x", "y*"]
    assert policy.rules[0].action.value == "deny"
    error = _policy_error(POLICY_HEAD + "rules:\n  - tools: [x]\n    action: !!str alow\n")
    _one_line(error, "/etc/policies/p.yaml", 5, "unknown action 'alow' (allowed: allow, human_approval, deny)")


def test_an_alias_bomb_in_a_policy_is_refused_at_once_and_a_recursive_alias_too() -> None:
    began = time.monotonic()
    error = _policy_error(POLICY_HEAD + "rules: []\nschemas:\n  t:\n    " + _bomb().replace("\n", "\n    "))
    assert time.monotonic() - began < scaled(5)
    assert error.line is not None and "counting each alias as a copy of its anchor" in error.problem
    recursive = _policy_error(POLICY_HEAD + "rules: []\nschemas:\n  t: &t {not: *t}\n")
    _one_line(recursive, "/etc/policies/p.yaml", 5, "a recursive alias: *t is inside its own anchor")


def test_depth_counts_the_levels_an_alias_brings() -> None:
    half = "[" * 40 + "]" * 40
    text = f"a: &x {half}\nb: " + "[" * 30 + "*x" + "]" * 30 + "\n"
    with pytest.raises(YamlProblem) as info:
        read_yaml(text)
    assert (info.value.line, info.value.problem) == (
        2, f"the file nests too deeply (more than {MAX_DEPTH} levels of lists and mappings)"
    )
    assert read_yaml(f"a: &x {half}\nb: [[*x]]\n")["b"][0][0] == read_yaml(f"a: {half}\n")["a"]


# ----------------------------------------------------------------------------- the commands


def _drawbridge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", *args], capture_output=True, text=True, env=child_env(None),
        timeout=scaled(90), stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "command",
    [("discover", "--config"), ("policy", "check", "--config"), ("serve", "--stdio", "--config")],
)
@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("x: " + "[" * 500 + "]" * 500 + "\n", "the file nests too deeply"),
        (_bomb(), "counting each alias as a copy of its anchor"),
        ("listen: {port: 1}\nlisten: {port: 2}\n", 'invalid YAML: duplicate key "listen"'),
    ],
)
def test_every_command_reading_a_configuration_says_its_problem_in_one_line(
    tmp_path: Path, command: tuple[str, ...], body: str, problem: str
) -> None:
    config = tmp_path / "drawbridge.yaml"
    config.write_text(CONFIG_HEAD + body, encoding="utf-8")
    result = _drawbridge(*command, str(config))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"{config}:") and problem in lines[0], lines[0]


def test_a_missing_policy_file_is_called_a_file(tmp_path: Path) -> None:
    config = tmp_path / "drawbridge.yaml"
    config.write_text(json.dumps({
        "policy_file": "./nothere.yaml",
        "upstreams": [{"name": "gh", "transport": "stdio", "command": PYTHON, "args": ["-c", "pass"]}],
    }), encoding="utf-8")
    checked = _drawbridge("policy", "check", "--config", str(config))
    assert checked.returncode == 1 and "policy file does not exist" in checked.stderr, checked.stderr
    assert "directory" not in checked.stderr
    served = _drawbridge("serve", "--stdio", "--config", str(config))
    assert served.returncode == 2 and "policy file does not exist" in served.stderr, served.stderr
    assert "directory" not in served.stderr
