"""What an agent and a collector cannot do to the gateway's telemetry, against a real ``drawbridge
wrap`` and the real OTLP receiver of ``telemetry_support``: made-up tool names never become labels or
span names, a ``traceparent`` with flags 00 does not switch the spans off, a refusal is an error
(``tool_error``), a collector that hangs does not hold wrap's exit past its grace, and no worker
outlives the gateway. The collector's header and the service name are checked at startup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from approval_support import write_policy
from conftest import GITHUB_LIKE, PYTHON, SERVERS, child_env, eventually, raw_pipe, scaled, wrap_argv
from telemetry_support import KINDS, Receiver, attributes, metric_points

pytestmark = pytest.mark.anyio

MADE_UP = "made-up-tool-7c1e"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
POLICY = """\
name: bounds
agent: "*"
rules:
  - tools: ["list_repos"]
    action: allow
  - tools: ["*"]
    action: deny
"""
NOTEBOOK = [PYTHON, str(SERVERS / "notebook.py")]
STATUS_ERROR = 2


def _params(tool: str, arguments: dict[str, object], meta: dict[str, str] | None = None) -> dict[str, object]:
    params: dict[str, object] = {"name": tool, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return params


async def test_made_up_names_are_one_placeholder_and_refusals_and_unsampled_parents_still_make_error_spans(
    tmp_path: Path,
) -> None:
    receiver = Receiver()
    flags = ["--policy", str(write_policy(tmp_path, POLICY)), "--agent", "tester", "--fsync", "never",
             "--otlp-endpoint", receiver.url]
    try:
        async with raw_pipe(wrap_argv(GITHUB_LIKE, *flags)) as pipe:
            await pipe.initialize()
            unsampled = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"}
            listed = await pipe.request(1, "tools/call", _params("list_repos", {"owner": "acme"}, unsampled))
            assert "result" in listed
            for request_id in range(2, 12):  # unknown tools: refused before any decision
                assert "error" in await pipe.request(request_id, "tools/call", _params(f"{MADE_UP}-{request_id}", {}))
            refused = await pipe.request(20, "tools/call", _params("get_repo", {"owner": "acme", "name": "rocket"}))
            assert refused["result"]["isError"] is True  # denied by the policy
        # wrap has exited: its shutdown flushed spans and metrics.
        spans = receiver.spans()
        servers = [span for span in spans if KINDS[span.kind] == "SERVER"]
        names = sorted(span.name for span in servers)
        assert names == ["tools/call _OTHER"] * 10 + ["tools/call get_repo", "tools/call list_repos"], names
        assert not [body for _path, body in receiver.bodies if MADE_UP.encode() in body]
        points = {(name, found.get("gen_ai.tool.name")) for name, found in metric_points(receiver)}
        assert {tool for _name, tool in points} == {"list_repos", "get_repo", "_OTHER"}, points
        # Flags 00 on the agent's traceparent: the span is still there, under the agent's span.
        (listed,) = [span for span in servers if span.name == "tools/call list_repos"]
        assert listed.trace_id.hex() == TRACE_ID and listed.parent_span_id.hex() == PARENT_ID
        # A policy refusal is a CallToolResult with isError: true: error.type tool_error, status ERROR.
        (denied,) = [span for span in servers if span.name == "tools/call get_repo"]
        assert attributes(denied)["error.type"] == "tool_error" and denied.status.code == STATUS_ERROR
        assert "rpc.response.status_code" not in attributes(denied)
        other = next(span for span in servers if span.name == "tools/call _OTHER")
        assert attributes(other)["gen_ai.tool.name"] == "_OTHER" and attributes(other)["error.type"] == "-32602"
    finally:
        receiver.close()


def _wrap(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", *flags, "--", *NOTEBOOK]
    return subprocess.run(argv, input="", capture_output=True, text=True, env=child_env(env), timeout=scaled(60))


@pytest.mark.parametrize(("header", "value", "said"), [
    ("Authorization=OTLP_TOKEN_VAR", "Bearer sekrit-f00\r\nX-Injected: 1", "OTLP_TOKEN_VAR"),
    ("Authorization=OTLP_TOKEN_VAR", " Bearer sekrit-f00", "OTLP_TOKEN_VAR"),
    ("Bad Name=OTLP_TOKEN_VAR", "Bearer sekrit-f00", "is not an HTTP header name"),
])
def test_a_collector_header_that_cannot_be_sent_is_one_line_exit_2_without_its_value(
    header: str, value: str, said: str
) -> None:
    done = _wrap("--otlp-endpoint", "http://127.0.0.1:9", "--otlp-header", header, env={"OTLP_TOKEN_VAR": value})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert said in lines[0] and "sekrit" not in done.stderr + done.stdout, lines[0]


@pytest.mark.parametrize(("header", "said"), [
    ("Authorization: Bearer HDRSECRET1", "the value given is not NAME=ENV_VAR"),
    ("Authorization=Bearer HDRSECRET2", "telemetry header Authorization: the value given is not an environment variable"),
    ("Authorization: Bearer HDRSECRET3=X", "a telemetry header's name is not an HTTP header name"),
])
def test_a_collector_credential_written_in_place_of_its_variable_is_refused_unrepeated(header: str, said: str) -> None:
    done = _wrap("--otlp-endpoint", "http://127.0.0.1:9", "--otlp-header", header)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert said in " ".join(done.stderr.split()) and "HDRSECRET" not in done.stderr + done.stdout, done.stderr


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_service_name_is_refused(name: str) -> None:
    done = _wrap("--otlp-endpoint", "http://127.0.0.1:9", "--service-name", name)
    assert done.returncode == 2 and "service name must not be empty" in done.stderr, done.stderr


def _workers_of(parent: int) -> list[int]:
    """The telemetry workers whose parent is ``parent`` (or that init adopted after it died)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"telemetry_worker" in command and f"BOUNDS_TEST_OWNER={parent}".encode() in environ:
            found.append(int(entry.name))
    return found


def test_a_hung_collector_does_not_hold_wraps_exit_and_no_worker_outlives_it(tmp_path: Path) -> None:
    hang = threading.Event()
    receiver = Receiver(hang)  # takes each export and never answers it
    owner = os.getpid()
    argv = wrap_argv(NOTEBOOK, "--allow-all", "--otlp-endpoint", receiver.url, "--fsync", "never",
                     "--evidence-dir", str(tmp_path / "ev"), "--checkpoint-every-lines", "1")
    env = child_env({"BOUNDS_TEST_OWNER": str(owner)})
    try:
        for ending in ("stdin closed", "SIGKILL"):
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=env)
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
                                b'"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}\n')
            process.stdin.flush()
            assert b'"id":1' in process.stdout.readline()
            process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
                                b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_note",'
                                b'"arguments":{"name":"n"}}}\n')
            process.stdin.flush()
            assert b'"id":2' in process.stdout.readline()
            eventually(lambda: receiver.bodies, scaled(30), "an export held by the hung collector")
            assert _workers_of(owner)
            began = time.monotonic()
            if ending == "stdin closed":
                process.stdin.close()
                process.wait(scaled(20))
                # The server's second to exit, then the worker's bounded last export: within wrap's grace.
                assert time.monotonic() - began < 2.0 * max(1.0, scaled(1.0)) + 0.5, time.monotonic() - began
                assert "dropped" in process.stderr.read().decode(), "the drop is said once"
            else:
                process.kill()
                process.wait()
            eventually(lambda: not _workers_of(owner), scaled(2.0), "the worker gone with its gateway")
            if process.stderr is not None:
                process.stderr.close()
            process.stdout.close()
    finally:
        for pid in _workers_of(owner):
            os.kill(pid, signal.SIGKILL)
        hang.set()
        receiver.close()
