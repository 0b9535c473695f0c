"""``drawbridge policy check|explain|test``: a policy checked before it runs, as a real subprocess.

``check --config`` reads the catalogue of a real fixture server (github_like) and finds a rule written
without the upstream's prefix; ``test`` passes and fails on tables; ``explain`` names the deciding rule.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import PYTHON, child_env, scaled
from serve_support import GITHUB, write_config

POLICY = (
    "name: team\nagent: '*'\nrules:\n"
    "  - tools: ['github.list_repos']\n    action: allow\n"          # 0
    "  - tools: ['delete_repo']\n    action: deny\n"                  # 1: no prefix, dead
    "  - tools: ['github.*']\n    action: human_approval\n"          # 2
    "  - tools: ['github.get_repo']\n    action: allow\n"             # 3: shadowed by 2
    "  - tools: ['github.get_repo']\n    action: deny\n"              # 4
    "    when:\n      - arg: owner\n        op: '=='\n        value: evil\n"
)


def drawbridge(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", *args], capture_output=True, text=True, env=child_env(None), cwd=cwd,
        timeout=scaled(90),
    )


def _policies(directory: Path, text: str = POLICY) -> Path:
    policies = directory / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "team.yaml").write_text(text, encoding="utf-8")
    return policies


def test_check_without_a_catalogue_warns_about_a_shadowed_rule_and_exits_0(tmp_path: Path) -> None:
    result = drawbridge("policy", "check", "--policy", str(_policies(tmp_path)))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, result.stdout
    assert "rule 3: never decides: rule 2" in warnings[0] and "team.yaml:" in warnings[0]
    assert "rule 4: never decides: rule 2" in warnings[1]
    assert "1 policies, 5 rules: 2 warning(s)" in result.stdout


def test_check_with_the_live_catalogue_finds_the_rule_that_matches_no_tool(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies={"team.yaml": POLICY})
    result = drawbridge("policy", "check", "--config", str(config))
    assert result.returncode == 0, result.stderr
    dead = [line for line in result.stdout.splitlines() if "matches no tool" in line]
    assert len(dead) == 1 and "rule 1" in dead[0] and "did you mean github.delete_repo?" in dead[0], result.stdout
    assert "4 served tools" in result.stdout


def test_check_with_the_live_catalogue_flags_a_dead_pattern_in_a_live_rule(tmp_path: Path) -> None:
    """`delete_repo` (no prefix) does nothing beside the live `github.get_repo`: the rule was meant to deny both."""
    policy = ("name: team\nagent: '*'\nrules:\n"
              "  - tools: ['delete_repo', 'github.get_repo']\n    action: deny\n"
              "  - tools: ['github.*']\n    action: allow\n")
    config = write_config(tmp_path, [GITHUB], policies={"team.yaml": policy})
    result = drawbridge("policy", "check", "--config", str(config))
    assert result.returncode == 0, result.stderr
    dead = [line for line in result.stdout.splitlines() if "matches no tool" in line]
    assert dead == [
        "warning: team.yaml:4: policy 'team' rule 0: pattern 'delete_repo' matches no tool the upstreams serve "
        "(its other patterns do); did you mean github.delete_repo?"
    ], result.stdout
    assert "1 warning(s)" in result.stdout


def test_check_exits_1_on_a_policy_that_does_not_load(tmp_path: Path) -> None:
    policies = _policies(tmp_path, "name: broken\nagent: '*'\nrules:\n  - tools: ['x']\n    action: maybe\n")
    result = drawbridge("policy", "check", "--policy", str(policies))
    assert result.returncode == 1
    assert "team.yaml" in result.stderr and "maybe" in result.stderr
    # A missing path is a load error like any other (policy-format.md section 7: ``file: problem``); the
    # check's answer is that the policy does not load (exit 1), not a startup error.
    for name, problem in (("nowhere", "policy directory does not exist"), ("gone.yaml", "policy file does not exist")):
        missing = drawbridge("policy", "check", "--policy", str(tmp_path / name))
        assert missing.returncode == 1 and missing.stderr == f"error: {tmp_path / name}: {problem}\n", missing.stderr


def test_explain_names_the_rule_the_gateway_would_apply(tmp_path: Path) -> None:
    policies = str(_policies(tmp_path))
    plain = drawbridge("policy", "explain", "--policy", policies, "--agent", "claude", "github.get_repo")
    assert plain.returncode == 0, plain.stderr
    assert "action: human_approval" in plain.stdout
    # Rule 2 stands on line 8: `file:N` is a line everywhere, the rule's index is said as one.
    assert "rule: rule 2 of team.yaml (line 8) in policy 'team'\n" in plain.stdout, plain.stdout
    assert "human_approval by rule 2 of policy 'team' (team.yaml:8)" in plain.stdout
    assert "team.yaml:2" not in plain.stdout
    nothing = drawbridge("policy", "explain", "--policy", policies, "--agent", "claude", "slack.post")
    assert "action: deny" in nothing.stdout and "rule: none (no rule matched)\n" in nothing.stdout
    bad = drawbridge("policy", "explain", "--policy", policies, "--agent", "c", "--args", "{nope", "x")
    assert bad.returncode == 2 and "not JSON" in bad.stderr


def test_explain_refuses_the_arguments_the_gateway_would_refuse_before_any_rule(tmp_path: Path) -> None:
    """Rule 4 denies owner "evil"; a call the gateway would never decide must not be explained as if it
    ran: not an object, a repeated key (which readers take first or last), keys that fold alike, a number
    no double holds exactly, a depth past the limit."""
    policies = str(_policies(tmp_path))
    refused = {
        "[1]": "must be a JSON object",
        "null": "must be a JSON object",  # the gateway never decides null arguments as {}
        '{"owner":"evil","owner":"ok"}': "repeats a key",
        '{"owner":"evil","OWNER":"ok"}': "differ only in case",
        '{"owner":"ok","n":9007199254740993}': "no double holds exactly",
        '{"owner":"ok","n":' + "[" * 70 + "]" * 70 + "}": "deeper than 64 levels",
        '{"owner":NaN}': "NaN",
    }
    for args, problem in refused.items():
        result = drawbridge("policy", "explain", "--policy", policies, "--agent", "c", "--args", args, "github.get_repo")
        assert result.returncode == 2, (args, result.stdout)
        assert "refuses such a call before any rule" in result.stderr and problem in result.stderr, (args, result.stderr)
        assert "action:" not in result.stdout
    name = drawbridge("policy", "explain", "--policy", policies, "--agent", "c", "github.get\x1brepo")
    assert name.returncode == 2 and "refuses such a call before any rule" in name.stderr, name.stderr
    assert "tool name contains a control or format character (U+001B" in name.stderr and "action:" not in name.stdout
    decided = drawbridge("policy", "explain", "--policy", policies, "--agent", "c", "--args", '{"owner":"evil"}',
                         "github.get_repo")
    assert decided.returncode == 0 and "action: human_approval" in decided.stdout, decided.stderr


def test_policy_test_passes_and_fails_on_its_tables(tmp_path: Path) -> None:
    _policies(tmp_path)
    good = tmp_path / "good.yaml"
    good.write_text(json.dumps({"policy": "./policies", "cases": [
        {"agent": "claude", "tool": "github.list_repos", "expect": "allow", "rule": 0},
        {"agent": "claude", "tool": "github.get_repo", "arguments": {"owner": "evil"}, "expect": "human_approval"},
        {"agent": "claude", "tool": "slack.post", "expect": "deny"},
    ]}), encoding="utf-8")
    passing = drawbridge("policy", "test", str(good))
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "3 passed, 0 failed" in passing.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"policy": "./policies", "cases": [
        {"agent": "claude", "tool": "github.delete_repo", "expect": "deny"},
        {"agent": "claude", "tool": "github.list_repos", "expect": "allow", "rule": 2},
        {"agent": "claude", "tool": "slack.post", "expect": "deny", "rule": 2},
    ]}), encoding="utf-8")
    failing = drawbridge("policy", "test", str(good), str(bad))
    assert failing.returncode == 1
    assert "3 passed, 3 failed" in failing.stdout
    assert "expected rule 2, decided by the default deny (no rule matched)" in failing.stdout, failing.stdout
    assert "expected deny, got human_approval (rule 2 of team.yaml" in failing.stdout
    assert "expected rule 2, decided by rule 0" in failing.stdout


def _table(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text("policy: ./policies\n" + body, encoding="utf-8")
    return path


def test_policy_test_refuses_a_table_that_would_not_test_what_it_says(tmp_path: Path) -> None:
    _policies(tmp_path)
    case = "cases:\n  - {agent: claude, tool: github.list_repos, expect: allow"
    refused = {
        # `args` instead of `arguments` would be evaluated with {} and pass.
        "args": (case + ", args: {owner: evil}}\n", 3, "unknown key 'args' in case 1"),
        "rule_file": ("rule_file: ./rules.yaml\n" + case + "}\n", 2, "unknown key 'rule_file' in the table"),
        "list_arguments": (case + ", arguments: [1]}\n", 3, "`arguments` in case 1 must be an object"),
        "string_rule": (case + ', rule: "0"}\n', 3, "`rule` in case 1 must be a rule index (an integer from 0)"),
        "date": (case + ", arguments: {when: 2024-01-01}}\n", 3, "a value of YAML type date is not plain JSON"),
        "no_cases": ("cases: []\n", 2, "`cases` is empty: a table that tests nothing would always pass"),
        "bad_expect": (case.replace("expect: allow", "expect: allowed") + "}\n", 3, "unknown action 'allowed'"),
        "tagged": ("cases:\n  - !case {agent: claude, tool: t, expect: deny}\n", 3, 'custom tag "!case"'),
        "nan": (case + ", arguments: {x: .nan}}\n", 3, "a number must be finite"),
        "inf": (case + ", arguments: {x: .inf}}\n", 3, "a number must be finite"),
        "int_key": (case + ", arguments: {1: x}}\n", 3, "mapping key 1 is not a string"),
        # What the gateway refuses before any rule: a table must not assert a decision no call gets.
        "case_keys": (case + ", arguments: {max_count: 3, Max_count: 3}}\n", 3,
                      "case 1: the gateway refuses such a call before any rule: invalid request: a JSON object in "
                      "the message has keys that differ only in case"),
        "big_int": (case + ", arguments: {n: 9007199254740993}}\n", 3,
                    "case 1: the gateway refuses such a call before any rule: parse error: an integer no double"),
        "escape_name": ('cases:\n  - {agent: claude, tool: "git.\\e", expect: deny}\n', 3,
                        "case 1: the gateway refuses such a call before any rule: invalid params: tool name contains"),
    }
    for name, (body, line, problem) in refused.items():
        table = _table(tmp_path, f"{name}.yaml", body)
        result = drawbridge("policy", "test", str(table))
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: {table}:{line}: {problem}"), (name, result.stderr)
        assert "passed" not in result.stdout, (name, result.stdout)
    good = _table(tmp_path, "good.yaml", case + ", rule: 0, arguments: {owner: evil}}\n")
    passing = drawbridge("policy", "test", str(good))
    assert passing.returncode == 0 and "1 passed, 0 failed" in passing.stdout, passing.stdout + passing.stderr


def test_check_names_why_an_upstream_was_not_read(tmp_path: Path) -> None:
    """An upstream whose catalogue could not be read is named with the cause, not as a silence; an
    OpenAPI entry's header variable is not needed (no operation is called)."""
    fixtures = Path(__file__).resolve().parent / "fixtures" / "openapi"
    items = {"name": "items", "file": str(fixtures / "items.yaml"), "backend_url": "http://127.0.0.1:9/api",
             "allow_private": True, "headers": {"Authorization": "ITEMS_UNSET_TOKEN"}}
    gone = {"name": "gone", "file": str(tmp_path / "missing.yaml"), "backend_url": "http://127.0.0.1:9/api",
            "allow_private": True}
    config = write_config(tmp_path, [], policies={"team.yaml": POLICY}, openapi=[items, gone])
    result = drawbridge("policy", "check", "--config", str(config))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if "are not checked" in line]
    assert warnings == [
        f"warning: openapi 'gone': cannot read the OpenAPI document {tmp_path / 'missing.yaml'}: No such file or "
        "directory: rules naming its tools are not checked"
    ], result.stdout
