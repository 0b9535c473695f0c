"""A gateway that cannot start says why in one line and exits 2: no traceback, whatever stops it.

Two gateways on one evidence directory, and a trace that does not verify (a torn last line), are
refused before the server hears a line (wrap starts it while the gateway imports, and stops it); the
line names the file and what to do. wrap's default state file lives inside its evidence directory,
where no serve started beside it can share it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, SERVERS, child_env, scaled
from one_reading_support import LineGateway

NOTEBOOK = [PYTHON, str(SERVERS / "notebook.py")]


def _wrap(evidence: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--evidence-dir", str(evidence), *extra, "--", *NOTEBOOK]
    return subprocess.run(argv, input="", check=False, capture_output=True, text=True, env=child_env(env), timeout=scaled(60))


def _serve(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio"]
    return subprocess.run(argv, input="", check=False, capture_output=True, text=True, env=child_env(env), timeout=scaled(60))


def _serve_config(directory: Path, evidence: Path) -> Path:
    (directory / "policies").mkdir(parents=True, exist_ok=True)
    upstream = {"name": "nb", "transport": "stdio", "command": NOTEBOOK[0], "args": NOTEBOOK[1:]}
    config = directory / "drawbridge.yaml"
    config.write_text(json.dumps({"upstreams": [upstream], "policy_dir": "./policies",
                                  "evidence_dir": str(evidence), "state_path": str(directory / "state.db")}))
    return config


def _one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("second", ["wrap", "serve"])
def test_a_second_gateway_on_one_evidence_directory_is_one_line_exit_2(tmp_path: Path, second: str) -> None:
    first = LineGateway(tmp_path / "first")  # running, its trace open and locked
    try:
        evidence = first.evidence
        result = _wrap(evidence) if second == "wrap" else _serve(_serve_config(tmp_path / "serve", evidence))
        _one_line_error(result, str(evidence / "trace.ndjson"), "already open for writing", "another gateway")
        assert "ran safe_read" in json.dumps(first.call("safe_read"))  # the first one is untouched
    finally:
        assert first.close() == 0


@pytest.mark.parametrize("second", ["wrap", "serve"])
def test_a_trace_that_does_not_verify_is_one_line_exit_2(tmp_path: Path, second: str) -> None:
    evidence = tmp_path / "evidence"
    assert _wrap(evidence).returncode == 0
    trace = evidence / "trace.ndjson"
    before = trace.read_bytes()
    trace.write_bytes(before + b'{"schema":"drawbridge.trace_entry.v0","seq":')  # a torn last write
    result = _wrap(evidence) if second == "wrap" else _serve(_serve_config(tmp_path / "serve", evidence))
    line = _one_line_error(result, str(trace), "does not verify", "trailing_partial_line", "verify-chain", "move the file aside")
    assert "Traceback" not in line
    assert trace.read_bytes().startswith(before)  # nothing written to it, nothing cut from it


def test_the_error_follows_the_log_format(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    assert _wrap(evidence).returncode == 0
    trace = evidence / "trace.ndjson"
    trace.write_bytes(trace.read_bytes() + b'{"seq":')
    text = _one_line_error(_wrap(evidence), "does not verify")
    assert text.startswith("drawbridge: ")
    as_json = _wrap(evidence, "--log-format", "json")
    error = json.loads(_one_line_error(as_json))
    assert error["level"] == "ERROR" and error["event"] == "startup_failed" and error["message"] == text


def test_wraps_default_state_file_is_inside_its_evidence_directory(tmp_path: Path) -> None:
    gateway = LineGateway(tmp_path, extra=("--pin-tools",))  # the pins are written to the state file
    try:
        assert gateway.call("safe_read")["result"]["content"][0]["text"] == "ran safe_read"
    finally:
        assert gateway.close() == 0
    assert gateway.evidence == tmp_path / "evidence"
    assert (tmp_path / "evidence" / "drawbridge.db").is_file()
    assert not (tmp_path / "drawbridge.db").exists()  # where a serve beside it keeps ./drawbridge.db


def _yaml_config(directory: Path, extra: str) -> Path:
    """A serve configuration written as YAML (so that ``key:`` with no value can be written), plus ``extra``."""
    (directory / "policies").mkdir(parents=True, exist_ok=True)
    config = directory / "drawbridge.yaml"
    config.write_text(
        "upstreams:\n"
        f"  - {{name: nb, transport: stdio, command: {json.dumps(NOTEBOOK[0])}, args: [{json.dumps(NOTEBOOK[1])}]}}\n"
        "policy_dir: ./policies\n"
        f"evidence_dir: {json.dumps(str(directory / 'evidence'))}\n"
        f"state_path: {json.dumps(str(directory / 'state.db'))}\n" + extra,
        encoding="utf-8",
    )
    return config


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("pin_tools:\n", "pin_tools"),
        ("hide_denied_tools: null\n", "hide_denied_tools"),
        ("telemetry:\n", "telemetry"),
        ("telemetry: ~\n", "telemetry"),
        ("checkpoints: null\n", "checkpoints"),
        ("approval:\n  non_blocking:\n", "approval.non_blocking"),
        ("state:\n", "state"),
        ("cli_tools:\n  - name: git\n    bin: git\n    commands:\n      log:\n        allowed_args:\n",
         "cli_tools[0].commands.log.allowed_args"),
        ("cli_tools:\n  - name: git\n    bin: git\n    commands:\n      log:\n        timeout:\n",
         "cli_tools[0].commands.log.timeout"),
    ],
)
def test_a_key_without_a_value_is_one_line_exit_2_not_the_default(tmp_path: Path, extra: str, key: str) -> None:
    config = _yaml_config(tmp_path, extra)
    line = len(config.read_text().splitlines())
    _one_line_error(_serve(config), f"{config}:{line}: {key} has no value (null)")


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("http://user:pw-SECRETQ@127.0.0.1:4399", "must not hold a user name or password"),
        ("http://127.0.0.1:4399/?token=SECRETQ", "must not have a query"),
        ("http://127.0.0.1:4399/#SECRETQ", "must not have a fragment"),
        ("http://127.0.0.1:SECRETQ/", "is not a valid URL"),
    ],
)
def test_a_telemetry_endpoint_with_a_credential_in_it_is_refused_without_showing_it(
    tmp_path: Path, endpoint: str, problem: str
) -> None:
    config = _yaml_config(tmp_path, f"telemetry:\n  endpoint: {json.dumps(endpoint)}\n")
    result = _serve(config)
    error = _one_line_error(result, f"{config}:7: telemetry.endpoint {problem}")
    assert "SECRETQ" not in result.stderr + result.stdout, error
    evidence = tmp_path / "evidence"
    wrapped = _wrap(evidence, "--otlp-endpoint", endpoint)
    assert wrapped.returncode == 2 and problem in wrapped.stderr, wrapped.stderr
    assert "SECRETQ" not in wrapped.stderr + wrapped.stdout


@pytest.mark.parametrize("second", ["wrap", "serve"])
@pytest.mark.parametrize("key", ["Z", "SHORT" + "Q" * 26, "\u00e9" * 15 + "Q"])  # 1, 31 and 31 UTF-8 bytes
def test_a_truth_key_shorter_than_32_bytes_is_one_line_exit_2(tmp_path: Path, second: str, key: str) -> None:
    """A short HMAC key makes every ``args_digest`` brute-forceable offline: it is refused like a short
    argument digest key, without showing it, before a carrier or trace line is written."""
    env = {"DRAWBRIDGE_TDT_HMAC_KEY": key, "DRAWBRIDGE_TDT_HMAC_KEY_ID": "k"}
    carriers, evidence = tmp_path / "tdt.ndjson", tmp_path / "serve" / "evidence"
    if second == "wrap":
        evidence = tmp_path / "evidence"
        result = _wrap(evidence, "--tool-decision-truth-out", str(carriers), env=env)
    else:
        config = _yaml_config(tmp_path / "serve", f"tool_decision_truth: {{out: {json.dumps(str(carriers))}}}\n")
        result = _serve(config, env=env)
    line = _one_line_error(result, "DRAWBRIDGE_TDT_HMAC_KEY is too short", "at least 32 bytes")
    assert key not in line.split("KEY")[1]  # the value never shows (past the variable's name)
    assert not carriers.exists() and not (evidence / "trace.ndjson").exists()


@pytest.mark.parametrize("agent", ["a b", "a\nb", ""])
def test_an_agent_id_no_configuration_could_name_is_a_usage_error(tmp_path: Path, agent: str) -> None:
    wrapped = _wrap(tmp_path / "ev", "--agent", agent)
    assert wrapped.returncode == 2 and "an agent id uses only" in wrapped.stderr, wrapped.stderr
    served = subprocess.run(
        [PYTHON, "-m", "drawbridge", "serve", "--config", str(_serve_config(tmp_path, tmp_path / "ev2")),
         "--stdio", "--agent", agent],
        input="", check=False, capture_output=True, text=True, env=child_env(), timeout=scaled(60),
    )
    assert served.returncode == 2 and "an agent id uses only" in served.stderr, served.stderr


@pytest.mark.parametrize("option", ["--call-timeout", "--approval-timeout", "--checkpoint-every-seconds"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400", "0", "-1"])
def test_a_duration_that_is_not_a_positive_finite_number_is_a_usage_error(tmp_path: Path, option: str, value: str) -> None:
    """``nan`` passes every range check (each comparison with it is false): it used to crash the
    start (a traceback) or, as the call timeout, answer every call at once; ``inf`` never timed out."""
    done = _wrap(tmp_path / "evidence", option, value)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and f"Invalid value for '{option}'" in done.stderr
    assert not (tmp_path / "evidence").exists()  # refused before anything was opened


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        (["discover", "--config", "unused.yaml"], "--timeout", "nan"),
        (["policy", "check"], "--timeout", "nan"),
        (["policy", "explain", "--agent", "a", "t"], "--timeout", "nan"),
        (["approvals", "watch"], "--interval", "nan"),
        (["approvals", "watch"], "--interval", "inf"),
    ],
)
def test_every_seconds_option_refuses_what_is_not_a_finite_number(
    tmp_path: Path, command: list[str], option: str, value: str
) -> None:
    """``click.FloatRange`` lets ``nan`` through (and ``inf`` without an upper bound): a wait that ends
    at once or never. Each such option is a usage error before anything is read or contacted."""
    done = subprocess.run(
        [PYTHON, "-m", "drawbridge", *command, option, value], cwd=tmp_path,
        check=False, capture_output=True, text=True, env=child_env(), timeout=scaled(60),
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"Invalid value for '{option}'" in done.stderr and "not a finite number of seconds" in done.stderr


@pytest.mark.parametrize(
    ("auth", "variable"),
    [
        ("auth:\n  agents:\n    - {agent: bob, token_env: DRAWBRIDGE_TOKEN_BOB}\n", "DRAWBRIDGE_TOKEN_BOB"),
        ("auth:\n  admin: {token_env: DRAWBRIDGE_ADMIN_SHORT}\n", "DRAWBRIDGE_ADMIN_SHORT"),
    ],
)
@pytest.mark.parametrize("value", ["x", "abc", "short-token-15c", "a token with spaces inside"])
def test_a_token_too_short_or_odd_for_the_cli_is_refused_at_load(tmp_path: Path, auth: str, variable: str, value: str) -> None:
    """serve holds the tokens it reads to the CLI's rule (one line of 16 to 512 printable ASCII): exit 2
    naming the variable, never the value, before anything is opened."""
    config = _yaml_config(tmp_path, auth + "listen: {port: 0}\ncontrol: {port: 0}\n")
    argv = [PYTHON, "-m", "drawbridge", "serve", "--config", str(config)]
    result = subprocess.run(argv, input="", check=False, capture_output=True, text=True,
                            env=child_env({variable: value}), timeout=scaled(60))
    line = _one_line_error(result, f"environment variable {variable} does not hold a token",
                           "16 to 512 printable ASCII")
    assert len(value) < 4 or value not in line
    assert not (tmp_path / "state.db").exists() and not (tmp_path / "evidence").exists()


@pytest.mark.parametrize("listener", ["listen", "control"])
def test_a_port_in_use_is_one_line_exit_2_and_leaves_nothing_behind(tmp_path: Path, listener: str) -> None:
    """The listeners are bound before the state database, the admin token file or the trace is made."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        ports = {"listen": 0, "control": 0, listener: port}
        config = _yaml_config(tmp_path, f"listen: {{port: {ports['listen']}}}\ncontrol: {{port: {ports['control']}}}\n")
        argv = [PYTHON, "-m", "drawbridge", "serve", "--config", str(config)]
        result = subprocess.run(argv, input="", check=False, capture_output=True, text=True, env=child_env(),
                                timeout=scaled(60))
    _one_line_error(result, f"cannot listen on 127.0.0.1:{port} ({listener}:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drawbridge.yaml", "policies"]


@pytest.mark.parametrize("value", ["short-token-15c", "a token with spaces inside"])
def test_wraps_admin_token_is_held_to_the_same_rule(tmp_path: Path, value: str) -> None:
    """``DRAWBRIDGE_ADMIN_TOKEN`` opens wrap's control plane as an auth token opens serve's: the same rule,
    one line naming the variable, never the value, before the server or the evidence is started."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "ask.yaml").write_text('name: ask\nagent: "*"\nrules:\n  - tools: ["*"]\n    action: human_approval\n')
    argv = [PYTHON, "-m", "drawbridge", "wrap", "--policy", str(policies), "--evidence-dir", str(tmp_path / "evidence"),
            "--control-port", "0", "--", *NOTEBOOK]
    result = subprocess.run(argv, input="", check=False, capture_output=True, text=True,
                            env=child_env({"DRAWBRIDGE_ADMIN_TOKEN": value}), timeout=scaled(60))
    line = _one_line_error(result, "environment variable DRAWBRIDGE_ADMIN_TOKEN does not hold a token",
                           "16 to 512 printable ASCII")
    assert value not in line
    assert not (tmp_path / "evidence").exists()
