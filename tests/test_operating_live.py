"""What an operator sees of a running ``drawbridge serve``: the startup summary, one log line per
decision and per refused login (never an argument value or a token), ``/healthz`` and ``/readyz``
without a credential, ``/metrics`` behind the control plane's credential, a line on SIGTERM, and the
same lines as JSON objects with ``--log-format json``.

The gateway is a real subprocess in front of a real fixture server (github_like) and an upstream
that exits at once (down); its stderr is captured and parsed.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import PYTHON, child_env, scaled
from prometheus_client.parser import text_string_to_metric_families
from serve_support import (
    GITHUB, Running, background, dump, fields_of, http_client, http_gateway, serve_argv, sha256, write_config,
)

ALICE = "alice-live-token"
WRONG = "wrong-token-never-logged-5f1c"
SECRET = "argument-value-never-logged-93ab"
POLICIES = {
    "alice.yaml": (
        "name: alice\nagent: alice\nrules:\n"
        "  - tools: ['github.list_repos']\n    action: allow\n"
        "  - tools: ['github.*']\n    action: deny\n"
        "schemas:\n  github.list_repos:\n    type: object\n    properties:\n"
        "      owner: {not: {const: refused-by-schema}}\n"
    ),
}
DOWN = {
    "name": "gone", "transport": "stdio", "command": PYTHON,
    "args": ["-c", "import sys; print('cannot open the database', file=sys.stderr); sys.exit(1)"],
}
LINE_WAIT = scaled(20.0)


def wait_for(running: Running, event: str, count: int = 1) -> list[dict[str, str]]:
    if not running.wait_until(lambda text: len(fields_of(text, event)) >= count, LINE_WAIT):
        raise AssertionError(f"no {count} {event!r} line(s) within {LINE_WAIT} s:\n{running.text()}")
    return fields_of(running.text(), event)


def _config(directory: Path) -> Path:
    return write_config(
        directory, [GITHUB, DOWN], policies=POLICIES,
        auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}]},
        evidence_dir=str(directory / "evidence"), control={"port": 0},
    )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with http_gateway(_config(tmp_path_factory.mktemp("live"))) as running:
        yield running


def _base(running: Running) -> str:
    assert running.url is not None
    return running.url.rsplit("/mcp", 1)[0]


def test_the_startup_summary_names_listener_control_plane_upstreams_policies_and_evidence(gateway: Running) -> None:
    text = gateway.text()
    assert f"serving 2 upstream(s) on {gateway.url} (1 up, 1 down)\n" in text  # its address is allowed as it is
    assert re.search(r"upstream github: up, 4 tools", text), text
    assert re.search(r"upstream gone: down: upstream 'gone' is (disconnected|reconnecting) .*exited with status 1", text), text
    assert re.search(r"policies: 1 from \S+policies \(\S*alice.yaml\)", text), text
    assert re.search(r"evidence: \S+evidence", text), text
    assert gateway.control().startswith("http://127.0.0.1:")


@pytest.mark.anyio
async def test_each_decision_is_one_line_without_argument_values(gateway: Running) -> None:
    assert gateway.url is not None
    async with http_client(gateway.url, "legacy", ALICE) as alice:
        allowed = dump(await alice.call_tool("github.list_repos", {"owner": SECRET}))
        denied = dump(await alice.call_tool("github.delete_repo", {"owner": SECRET, "name": SECRET}))
    assert not allowed.get("isError") and denied.get("isError")
    lines = wait_for(gateway, "decision", 2)
    by_tool = {line["tool"]: line for line in lines}
    allow, deny = by_tool["github.list_repos"], by_tool["github.delete_repo"]
    assert allow["agent"] == "alice" and allow["action"] == "allow" and allow["outcome"] == "ok"
    # ``file:N`` is the rule's line, as the reason and ``approvals show`` write it, never its index.
    assert allow["rule"].endswith("alice.yaml:4"), allow
    assert deny["action"] == "deny" and deny["outcome"] == "refused" and deny["rule"].endswith("alice.yaml:6")
    assert float(allow["ms"]) > 0
    assert SECRET not in gateway.text()


@pytest.mark.anyio
async def test_a_schema_refusal_names_its_file_in_the_decision_line(gateway: Running) -> None:
    """A schema has no rule index: the line says ``file:schema``, never just the policy's name."""
    assert gateway.url is not None
    async with http_client(gateway.url, "legacy", ALICE) as alice:
        refused = dump(await alice.call_tool("github.list_repos", {"owner": "refused-by-schema"}))
    assert refused.get("isError")
    def refused_lines(text: str) -> list[dict[str, str]]:
        return [line for line in fields_of(text, "decision") if line["action"] == "deny" and line["tool"] == "github.list_repos"]

    # Other tests' calls on this gateway log decision lines too: wait for this call's own.
    assert gateway.wait_until(lambda text: bool(refused_lines(text)), LINE_WAIT), gateway.text()
    (line,) = refused_lines(gateway.text())
    assert line["rule"].endswith("alice.yaml:schema") and line["outcome"] == "refused", line


def test_upstream_stderr_is_prefixed_and_each_failure_is_one_warning_with_one_cause(gateway: Running) -> None:
    text = gateway.text()
    assert "[gone] cannot open the database" in text
    failures = [line for line in text.splitlines() if "WARNING" in line and "'gone'" in line]
    assert failures, text
    assert all("exited with status 1" in line and "stdin is closed" not in line for line in failures), failures
    # One warning per failed attempt: as many as the attempts the upstream printed its error in (+-1 in flight).
    attempts = text.count("[gone] cannot open the database")
    assert abs(len(failures) - attempts) <= 1, text


def test_a_refused_login_is_a_warning_that_never_echoes_the_token(gateway: Running) -> None:
    assert gateway.url is not None
    response = httpx.post(gateway.url, json={}, headers={"authorization": f"Bearer {WRONG}"})
    assert response.status_code == 401
    control = httpx.get(gateway.control() + "/approvals", headers={"authorization": f"Bearer {WRONG}"})
    assert control.status_code == 401
    lines = wait_for(gateway, "login_refused", 2)
    assert {line["listener"] for line in lines} == {"mcp", "control_plane"}
    assert all(line["problem"] == "unknown_token" for line in lines)
    assert "WARNING login_refused" in gateway.text()
    assert WRONG not in gateway.text()


def test_a_request_without_or_with_an_empty_credential_is_a_warning_too(gateway: Running) -> None:
    assert gateway.url is not None
    before = len(fields_of(gateway.text(), "login_refused"))
    assert httpx.post(gateway.url, json={}).status_code == 401
    assert httpx.post(gateway.url, json={}, headers={"authorization": ""}).status_code == 401
    lines = wait_for(gateway, "login_refused", before + 2)[before:]
    assert [(line["listener"], line["problem"]) for line in lines] == [("mcp", "missing"), ("mcp", "not_bearer")]
    # Static tokens: each refused login is a WARNING (under OAuth a request with none is an INFO line).
    refusals = [line for line in gateway.text().splitlines() if "login_refused" in line][before:]
    assert len(refusals) == 2 and all(line.startswith("drawbridge: WARNING login_refused") for line in refusals), refusals


def test_healthz_and_readyz_need_no_credential_and_say_only_status(gateway: Running) -> None:
    base = _base(gateway)
    assert httpx.get(base + "/healthz").json() == {"status": "alive"}
    ready = httpx.get(base + "/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready", "policies": "loaded", "policy_reload_failed": False, "evidence": "writable",
        "upstreams_down": ["gone"],
    }


@pytest.mark.anyio
async def test_metrics_are_behind_the_credential_and_parse_as_prometheus_text(gateway: Running) -> None:
    assert gateway.url is not None
    async with http_client(gateway.url, "legacy", ALICE) as alice:
        await alice.call_tool("github.list_repos", {"owner": "acme"})
    assert httpx.get(gateway.control() + "/metrics").status_code == 401
    response = httpx.get(gateway.control() + "/metrics", headers=gateway.control_headers())
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert samples[("drawbridge_calls_total", (("action", "allow"), ("outcome", "ok")))] >= 1
    assert samples[("drawbridge_decision_seconds_count", ())] >= 1
    assert samples[("drawbridge_forward_seconds_count", ())] >= 1
    assert samples[("drawbridge_evidence_write_seconds_count", ())] >= 1
    assert samples[("drawbridge_upstream_up", (("upstream", "github"),))] == 1
    assert samples[("drawbridge_upstream_up", (("upstream", "gone"),))] == 0
    assert samples[("drawbridge_approvals_pending", ())] == 0
    assert ("drawbridge_evidence_fsync_lag_seconds", ()) in samples
    assert not any("alice" in str(key) or "list_repos" in str(key) for key in samples)


def test_json_log_format_and_the_line_on_sigterm(tmp_path: Path) -> None:
    with background(serve_argv(_config(tmp_path), "--log-format", "json")) as running:
        assert running.wait_until(lambda text: '"listener"' in text, LINE_WAIT * 2), running.text()
        objects = [json.loads(line) for line in running.text().splitlines() if line.startswith("{")]
        summary = next(o for o in objects if "listener" in o)
        assert summary["level"] == "INFO" and summary["upstreams_up"] == 1 and summary["upstreams_down"] == 1
        assert {o.get("upstream") for o in objects} >= {"github", "gone"}
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(LINE_WAIT) == 0
    lines = [json.loads(line) for line in running.text().splitlines() if line.startswith("{")]
    assert any(o.get("signal") == "SIGTERM" for o in lines), running.text()


def _raw(port: int, data: bytes) -> bytes:
    """``data`` sent on a connection of its own; what comes back until the gateway closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=LINE_WAIT) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


NOT_HTTP = (
    b"GARBAGE\r\n\r\n",
    b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
)


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_what_the_http_server_logs_follows_the_log_format_on_both_listeners(tmp_path: Path, log_format: str) -> None:
    """A request that is not HTTP (sent by anyone, before any credential) is logged by the HTTP server
    itself; its line is one JSON object like every other under ``--log-format json``, and a
    ``drawbridge:`` line in text, on the agents' listener and on the control plane's."""
    with background(serve_argv(_config(tmp_path), "--log-format", log_format)) as running:
        assert running.wait_until(lambda _: running.url is not None and running.control_url is not None), running.text()
        assert running.url is not None and running.control_url is not None
        for url in (running.url, running.control_url):
            for data in NOT_HTTP:
                assert _raw(httpx.URL(url).port or 0, data).startswith(b"HTTP/1.1 400 "), url
        invalid = "Invalid HTTP request received."
        assert running.wait_until(lambda text: text.count(invalid) >= 4, LINE_WAIT), running.text()
    lines = [line for line in running.text().splitlines() if line.strip()]
    if log_format == "json":
        objects = [json.loads(line) for line in lines]  # every line, none of them plain text
        assert all(isinstance(o, dict) and {"ts", "level", "logger"} <= o.keys() for o in objects), lines
        told = [o for o in objects if o.get("message") == invalid]
        assert len(told) == 4 and all(o["level"] == "WARNING" for o in told), told
    else:
        told = [line for line in lines if invalid in line]
        assert told == [f"drawbridge: WARNING {invalid}"] * 4, lines


def test_sigterm_is_said_in_text_too(tmp_path: Path) -> None:
    process = subprocess.Popen(
        serve_argv(_config(tmp_path)), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=child_env(None),
    )
    assert process.stderr is not None
    seen = b""
    try:
        for line in process.stderr:
            seen += line
            if b"serving 2 upstream(s)" in line:
                break
        process.send_signal(signal.SIGTERM)  # the control plane may still be starting: it must stop too
        _, rest = process.communicate(timeout=LINE_WAIT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert b"drawbridge: SIGTERM received: stopping" in rest, seen + rest


@pytest.mark.anyio
async def test_an_approval_asked_and_resolved_is_two_lines_naming_who_and_which_channel(tmp_path: Path) -> None:
    policies = {"alice.yaml": "name: alice\nagent: alice\nrules:\n  - tools: ['github.get_repo']\n    action: human_approval\n"}
    config = write_config(
        tmp_path, [GITHUB], policies=policies, auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}]},
        evidence_dir=str(tmp_path / "evidence"),
    )
    with http_gateway(config) as running:
        assert running.url is not None
        async with http_client(running.url, "legacy", ALICE) as alice:
            async with anyio.create_task_group() as tg:
                results: list[dict[str, Any]] = []

                async def call() -> None:
                    results.append(dump(await alice.call_tool("github.get_repo", {"owner": "acme", "name": "rocket"})))

                tg.start_soon(call)
                asked = (await anyio.to_thread.run_sync(wait_for, running, "approval_asked"))[0]
                approve = httpx.post(
                    f"{running.control()}/approvals/{asked['approval_id']}/approve", json={"resolved_by": "op-ida"},
                    headers=running.control_headers(),
                )
                assert approve.status_code == 200, approve.text
        resolved = wait_for(running, "approval_resolved")[0]
        decision = wait_for(running, "decision")[0]
    assert asked["agent"] == "alice" and asked["tool"] == "github.get_repo" and asked["rule"].endswith("alice.yaml:4")
    assert resolved["approval_id"] == asked["approval_id"] and resolved["status"] == "approved"
    assert resolved["by"] == "op-ida" and resolved["channel"] == "control_plane"
    assert decision["action"] == "allow" and decision["outcome"] == "ok", json.dumps(decision)
    assert decision["approval"] == "approved by op-ida via control_plane" and not results[0].get("isError")
    assert "rocket" not in running.text()


def test_each_command_asks_only_for_the_secrets_it_uses(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, [GITHUB], policies=POLICIES,
        auth={"admin": {"token_env": "UNSET_ADMIN_TOKEN"}, "agents": [{"agent": "alice", "token_env": "UNSET_ALICE"}]},
    )
    env = child_env(None)
    for name in ("UNSET_ADMIN_TOKEN", "UNSET_ALICE"):
        env.pop(name, None)
    discover = subprocess.run(
        [PYTHON, "-m", "drawbridge", "discover", "--config", str(config), "--format", "json"],
        capture_output=True, text=True, env=env, timeout=LINE_WAIT * 3,
    )
    assert discover.returncode == 0, discover.stderr
    assert any(tool["name"] == "github.list_repos" for tool in json.loads(discover.stdout)["tools"])
    stdio = subprocess.run(
        serve_argv(config, "--stdio"), input="", capture_output=True, text=True, env=env, timeout=LINE_WAIT * 3,
    )
    assert stdio.returncode == 0, stdio.stderr
    assert "UNSET_" not in stdio.stderr
    http = subprocess.run(serve_argv(config), capture_output=True, text=True, env=env, timeout=LINE_WAIT * 3)
    assert http.returncode == 2 and "UNSET_ADMIN_TOKEN" in http.stderr  # serve over HTTP uses both


def test_a_startup_error_follows_the_log_format(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies=POLICIES, auth={"anonymous_agent": "anon"})
    for policy in (tmp_path / "policies").iterdir():
        policy.unlink()
    (tmp_path / "policies").rmdir()
    text = subprocess.run(serve_argv(config), capture_output=True, text=True, env=child_env(None), timeout=LINE_WAIT * 3)
    assert text.returncode == 2 and text.stderr.count("\n") == 1, text.stderr
    assert text.stderr.startswith("drawbridge: ") and "does not exist" in text.stderr
    json_run = subprocess.run(
        serve_argv(config, "--log-format", "json"), capture_output=True, text=True, env=child_env(None),
        timeout=LINE_WAIT * 3,
    )
    assert json_run.returncode == 2
    (line,) = json_run.stderr.splitlines()
    error = json.loads(line)
    assert error["level"] == "ERROR" and error["event"] == "startup_failed"
    assert error["message"] == text.stderr.rstrip("\n")


def test_discover_shows_progress_per_upstream_on_a_terminal(tmp_path: Path) -> None:
    import os
    import pty

    config = write_config(tmp_path, [GITHUB, DOWN], policies=POLICIES)
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [PYTHON, "-m", "drawbridge", "discover", "--config", str(config), "--timeout", "20"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal, env=child_env(None),
        )
        os.close(terminal)
        terminal = -1
        stdout, _ = process.communicate(timeout=LINE_WAIT * 3)
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end is closed: all was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    text = shown.decode("utf-8", "replace")
    assert re.search(r"discover: github: 4 tools \(\d+\.\d s\)", text), text
    assert "discover: gone: not read" in text and "exited with status 1" in text
    assert b"github.list_repos" in stdout  # the table itself is on stdout, as before
    piped = subprocess.run(
        [PYTHON, "-m", "drawbridge", "discover", "--config", str(config), "--timeout", "20"],
        capture_output=True, text=True, env=child_env(None), timeout=LINE_WAIT * 3,
    )
    assert "discover: github" not in piped.stderr  # not on a terminal: no progress lines
