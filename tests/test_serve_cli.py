"""``drawbridge serve`` startup: every problem is reported before a child is spawned or a port opened.

Each upstream here is a command that would leave a marker file if it ever ran, so "nothing started"
is checked, not assumed. The documented full example is parsed with the real loader.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, child_env, scaled
from serve_support import GITHUB, serve_argv, write_config

from drawbridge.config import parse_config
from drawbridge.gateway.runtime.serve import secret_env_names


def _marker_upstream(marker: Path) -> dict[str, object]:
    return {
        "name": "marker",
        "transport": "stdio",
        "command": PYTHON,
        "args": ["-c", f"open({str(marker)!r}, 'w').close()"],
    }


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=child_env(env), timeout=scaled(60), stdin=subprocess.DEVNULL)


def test_a_config_error_is_located_and_nothing_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    config = write_config(tmp_path, [_marker_upstream(marker)])
    document = json.loads(config.read_text())
    document["surprise"] = 1
    config.write_text(json.dumps(document, indent=2) + "\n")
    line = next(i for i, text in enumerate(config.read_text().splitlines(), 1) if '"surprise"' in text)
    done = _run(serve_argv(config))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert re.match(rf"^{re.escape(str(config))}:{line}: unknown key 'surprise'", done.stderr)
    assert not marker.exists()


def test_a_policy_that_does_not_load_stops_the_start(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    config = write_config(
        tmp_path,
        [_marker_upstream(marker)],
        policies={"bad.yaml": "name: bad\nagent: '*'\nrules:\n  - tools: ['*']\n    action: alow\n"},
    )
    done = _run(serve_argv(config))
    assert done.returncode == 2
    assert "cannot load the policy" in done.stderr and "bad.yaml:5" in done.stderr
    assert not marker.exists()


def test_missing_upstream_credentials_stop_the_start(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    http = {
        "name": "search",
        "transport": "streamable_http",
        "url": "http://127.0.0.1:9/mcp",
        "headers_env": {"Authorization": "SEARCH_AUTH_FOR_TEST"},
    }
    config = write_config(tmp_path, [_marker_upstream(marker), http])
    env = child_env()
    env.pop("SEARCH_AUTH_FOR_TEST", None)
    done = subprocess.run(serve_argv(config), capture_output=True, text=True, env=env, timeout=scaled(60))
    assert done.returncode == 2
    assert "SEARCH_AUTH_FOR_TEST" in done.stderr and "Authorization" in done.stderr
    assert not marker.exists()


def test_a_port_in_use_stops_the_start(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = write_config(tmp_path, [_marker_upstream(marker)], listen={"host": "127.0.0.1", "port": port})
        done = _run(serve_argv(config))
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert not marker.exists()


def test_a_listener_beyond_loopback_without_allowed_hosts_stops_the_start(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    config = write_config(tmp_path, [_marker_upstream(marker)], listen={"host": "0.0.0.0", "port": 0})
    line = next(i for i, text in enumerate(config.read_text().splitlines(), 1) if '"0.0.0.0"' in text)
    done = _run(serve_argv(config))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"{config}:{line}: listen.host 0.0.0.0 is not a loopback address: list in listen.allowed_hosts the "
        "names agents reach the gateway by (their Host header), so that a DNS-rebinding web page cannot"
    )
    assert not marker.exists()
    assert not (tmp_path / "evidence").exists()


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The startup error: exit 2, one line, no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr.strip()


def test_an_upstream_command_that_does_not_exist_stops_the_start(tmp_path: Path) -> None:
    missing = {"name": "ghost", "transport": "stdio", "command": str(tmp_path / "no-such-server")}
    config = write_config(tmp_path, [GITHUB, missing])
    line = _one_line(_run(serve_argv(config, "--stdio")))
    assert "upstream 'ghost' could not be started" in line and "No such file or directory" in line


def test_a_missing_working_directory_is_named_not_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    config = write_config(tmp_path, [{**_marker_upstream(marker), "cwd": "./nope"}])
    line = _one_line(_run(serve_argv(config)))
    assert line == (
        f"drawbridge: upstream 'marker' could not be started: cannot start upstream {PYTHON!r}: "
        f"working directory {tmp_path / 'nope'} does not exist"
    )
    assert not marker.exists()


@pytest.mark.parametrize("name", ["Bad Header", "X-Token\r\nX-Injected", "X-T\u00f6ken"])
def test_an_upstream_header_name_that_is_not_an_http_token_stops_the_start(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "started"
    http = {"name": "search", "transport": "streamable_http", "url": "http://127.0.0.1:9/mcp",
            "headers_env": {name: "HOME"}}
    config = write_config(tmp_path, [_marker_upstream(marker), http])
    line = next(i for i, text in enumerate(config.read_text().splitlines(), 1) if '"HOME"' in text)
    text = _one_line(_run(serve_argv(config)))
    assert text.startswith(f"{config}:{line}: upstreams[1].headers_env: ") and "is not an HTTP header name" in text
    assert not marker.exists()


@pytest.mark.parametrize("value", ["Bearer s3cr3t\r\nX-Injected: 1", "Bearer s3cr3t\n", "Bearer s3cr3t\u007f", "Bearer\u0007s3cr3t"])
def test_an_upstream_header_value_that_cannot_be_sent_stops_the_start_unshown(tmp_path: Path, value: str) -> None:
    marker = tmp_path / "started"
    http = {"name": "search", "transport": "streamable_http", "url": "http://127.0.0.1:9/mcp",
            "headers_env": {"Authorization": "SEARCH_AUTH_FOR_TEST"}}
    config = write_config(tmp_path, [_marker_upstream(marker), http])
    env = child_env({"SEARCH_AUTH_FOR_TEST": value})
    done = subprocess.run(serve_argv(config), capture_output=True, text=True, env=env, timeout=scaled(60))
    text = _one_line(done)
    assert text == (
        f"{config}: upstream 'search': header Authorization takes the value of environment variable "
        "SEARCH_AUTH_FOR_TEST, which is not a valid header value (it holds a control character such as CR, LF "
        "or NUL, a non-ASCII character, or leading or trailing whitespace)"
    )
    assert "s3cr3t" not in done.stderr and "Bearer" not in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize(("env", "anchor", "said"), [
    ({"BAD=NAME": "v"}, '"BAD=NAME"', "cli_tools[0].env: a name given is not an environment variable name"),
    ({"OK": "s3cr3t\u0000inside"}, '"OK"', "cli_tools[0].env.OK: the value holds a NUL character"),
])
def test_a_cli_env_that_exec_cannot_carry_stops_the_start_unshown(
    tmp_path: Path, env: dict[str, str], anchor: str, said: str
) -> None:
    marker = tmp_path / "started"
    config = write_config(tmp_path, [_marker_upstream(marker)], cli_tools=[{"name": "e", "bin": "echo", "bare": {}, "env": env}])
    line = next(i for i, text in enumerate(config.read_text().splitlines(), 1) if anchor in text)
    text = _one_line(_run(serve_argv(config)))
    assert text.startswith(f"{config}:{line}: {said}") and "s3cr3t" not in text
    assert not marker.exists()


def test_agent_goes_with_stdio(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB])
    done = _run(serve_argv(config, "--agent", "claude"))
    assert done.returncode == 2 and "--agent goes with --stdio" in done.stderr


def test_the_documented_full_example_is_a_valid_configuration(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    env = {
        "DRAWBRIDGE_ADMIN_TOKEN": "admin-example-0123456789",
        "DRAWBRIDGE_TOKEN_CLAUDE": "claude-example-0123456789",
        "SEARCH_AUTHORIZATION": "Bearer x",
        "OTEL_COLLECTOR_AUTHORIZATION": "Bearer y",
        "SLACK_APPROVALS_URL": "https://hooks.example.com/services/T0/B0/x",
    }
    config = parse_config(blocks[0], str(tmp_path / "drawbridge.yaml"), env)
    assert [u.name for u in config.upstreams] == ["github", "search"]
    assert config.upstreams[1].headers_env == {"Authorization": "SEARCH_AUTHORIZATION"}
    agents = {a.agent: a.token_sha256 for a in config.agents}
    assert agents["ci-bot"] == hashlib.sha256(b"replace-me-ci-token").hexdigest()
    assert agents["claude-code"] == hashlib.sha256(b"claude-example-0123456789").hexdigest()
    assert config.anonymous_agent == "guest" and config.listen_port == 8787
    assert config.result_guards is not None
    (guard,) = config.result_guards
    assert (guard.max_bytes, guard.redact_secrets, [d.kind for d in guard.secret_patterns]) == (65536, True, ["acme_key"])
    # Every key the loader accepts appears in the example.
    for key in (
        "upstreams:", "name:", "transport:", "command:", "args:", "env:", "cwd:", "url:", "headers_env:",
        "policy_dir:", "policy_file:", "evidence_dir:", "state_path:", "fsync:", "listen:", "host:", "port:",
        "auth:", "admin:", "agents:", "agent:", "token_env:", "token_sha256:", "anonymous_agent:", "limits:",
        "max_message_bytes:", "call_timeout_seconds:", "tool_decision_truth:", "out:", "pin_tools:",
        "hide_denied_tools:", "approval:", "timeout_seconds:", "allowed_hosts:", "max_sessions_per_agent:",
        "max_sessions:", "control:",
        "openapi:", "file:", "backend_url:", "headers:", "timeout:", "operations:", "max_response_bytes:",
        "allow_private:", "cli_tools:", "bin:", "working_dir:", "commands:", "allowed_args:", "strict:",
        "default_action:", "max_output_bytes:", "bare:", "telemetry:", "endpoint:", "protocol:",
        "service_name:", "checkpoints:", "every_lines:", "every_seconds:", "keys_dir:", "origin:",
        "notify:", "url_env:", "format:", "console_url:", "result_guards:", "tools:", "max_bytes:",
        "on_oversize:", "redact_secrets:", "secret_patterns:", "on_secret:",
    ):
        assert key in blocks[0], key
    assert "SEARCH_AUTHORIZATION" in secret_env_names(config)
    assert "OTEL_COLLECTOR_AUTHORIZATION" in secret_env_names(config)  # the collector's credential: never an upstream's
    assert [o.name for o in config.openapi] == ["pets"] and [c.name for c in config.cli_tools] == ["git", "date"]
    assert "PETS_AUTHORIZATION" in secret_env_names(config)
    (hook,) = config.approval_notify  # a Slack webhook, its URL from the environment only
    assert (hook.url_env, hook.format, hook.timeout_seconds) == ("SLACK_APPROVALS_URL", "slack", 5.0)
    assert "SLACK_APPROVALS_URL" in secret_env_names(config)
