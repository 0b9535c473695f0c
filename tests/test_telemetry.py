"""Live telemetry from a real ``drawbridge wrap``, received by a real OTLP receiver in this process that
decodes the exporter's protobuf with opentelemetry-proto: spans, kinds, parents and attributes as the
MCP conventions name them, no argument value anywhere, the checkpoints as log records, the duration
metrics; and a collector that is down or hangs costs no call."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from approval_support import Person, write_policy
from conftest import GITHUB_LIKE, connect, eventually_async, scaled, wrap_params
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from serve_support import GITHUB, http_gateway, initialize_request, sha256, write_config
from telemetry_support import KINDS, WAIT, Receiver, attributes

from drawbridge.state.signing_keys import read_vkey

pytestmark = pytest.mark.anyio

SECRET = "zz-planted-argument-9a8b7c"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
POLICY = """\
name: telemetry
agent: "*"
rules:
  - tools: ["list_repos"]
    action: allow
  - tools: ["get_repo"]
    action: deny
  - tools: ["add_deploy_key"]
    action: human_approval
  - tools: ["*"]
    action: deny
"""

async def test_spans_metrics_and_checkpoints_reach_a_real_otlp_receiver(tmp_path: Path) -> None:
    receiver = Receiver()
    evidence = tmp_path / "evidence"
    flags = ["--policy", str(write_policy(tmp_path, POLICY)), "--agent", "tester", "--evidence-dir", str(evidence),
             "--fsync", "never", "--otlp-endpoint", receiver.url, "--service-name", "gw-under-test"]
    try:
        async with connect(wrap_params(GITHUB_LIKE, *flags), elicitation_callback=Person()) as client:
            meta = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
            listed = await client.call_tool("list_repos", {"owner": f"acme{SECRET}"}, meta=meta)  # type: ignore[arg-type]
            assert not listed.is_error
            denied = await client.call_tool("get_repo", {"owner": "acme", "name": SECRET})
            assert denied.is_error
            approved = await client.call_tool(
                "add_deploy_key", {"owner": "acme", "repo": "rocket", "title": SECRET, "key": "ssh-ed25519 A"})
            assert not approved.is_error
        # wrap has exited: its shutdown flushed the spans, the metrics and the final checkpoint.
        spans = receiver.spans()
        servers = {span.name: span for span in spans if KINDS[span.kind] == "SERVER"}
        clients = {span.name: span for span in spans if KINDS[span.kind] == "CLIENT"}
        assert set(servers) == {"tools/call list_repos", "tools/call get_repo", "tools/call add_deploy_key"}
        assert set(clients) == {"tools/call list_repos", "tools/call add_deploy_key"}  # nothing forwarded when denied
        listed_span = servers["tools/call list_repos"]
        assert listed_span.trace_id.hex() == TRACE_ID and listed_span.parent_span_id.hex() == PARENT_ID
        assert listed_span.trace_state == "vendor=1"
        client_span = clients["tools/call list_repos"]
        assert client_span.trace_id == listed_span.trace_id and client_span.parent_span_id == listed_span.span_id
        assert client_span.start_time_unix_nano >= listed_span.start_time_unix_nano
        assert client_span.end_time_unix_nano <= listed_span.end_time_unix_nano
        found = attributes(listed_span)
        trace = [json.loads(line) for line in (evidence / "trace.ndjson").read_text().splitlines()]
        index = next(e["seq"] for e in trace if e["kind"] == "tool_decision" and e["body"]["tool"] == "list_repos")
        origin = read_vkey(evidence / "keys" / "checkpoint.vkey").name
        assert found == {
            "mcp.method.name": "tools/call", "gen_ai.tool.name": "list_repos", "gen_ai.operation.name": "execute_tool",
            "jsonrpc.request.id": found["jsonrpc.request.id"], "mcp.protocol.version": found["mcp.protocol.version"],
            "network.transport": "pipe", "drawbridge.decision.effect": "allow", "drawbridge.decision.policy": "telemetry",
            "drawbridge.decision.rule_index": 0, "drawbridge.trace.origin": origin, "drawbridge.trace.index": index,
        }
        assert found["mcp.protocol.version"] == "2025-11-25" and found["jsonrpc.request.id"].isdigit()
        refused = attributes(servers["tools/call get_repo"])
        assert refused["drawbridge.decision.effect"] == "deny" and refused["drawbridge.decision.rule_index"] == 1
        held = servers["tools/call add_deploy_key"]
        assert attributes(held)["drawbridge.decision.effect"] == "allow"  # settled by a person: the event says how
        (event,) = [e for e in held.events if e.name == "drawbridge.approval"]
        assert attributes(event)["settled"] == "allow" and attributes(event)["channel"] == "elicitation"
        assert servers["tools/call list_repos"].trace_id != held.trace_id  # no traceparent: a trace of its own
        resources = [attributes(rs.resource) for r in receiver.decoded("/v1/traces") for rs in r.resource_spans]
        assert {r["service.name"] for r in resources} == {"gw-under-test"}
        # Never an argument: not in any byte the collector received.
        assert receiver.bodies and not [path for path, body in receiver.bodies if SECRET.encode() in body]
        metrics = {m.name: m for r in receiver.decoded("/v1/metrics") for rm in r.resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics}
        server_duration = metrics["mcp.server.operation.duration"].histogram
        assert sum(point.count for point in server_duration.data_points) == 3
        assert list(server_duration.data_points[0].explicit_bounds)[:3] == [0.01, 0.02, 0.05]
        assert sum(p.count for p in metrics["mcp.client.operation.duration"].histogram.data_points) == 2
        notes = [record.body.string_value for r in receiver.decoded("/v1/logs") for rl in r.resource_logs
                 for sl in rl.scope_logs for record in sl.log_records]
        assert (evidence / "checkpoint").read_text() in notes  # the final checkpoint left the machine
    finally:
        receiver.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("collector", ["down", "hung"])
async def test_a_collector_that_is_down_or_hangs_costs_no_call(tmp_path: Path, collector: str) -> None:
    hang = threading.Event()
    receiver = Receiver(hang) if collector == "hung" else None
    endpoint = receiver.url if receiver is not None else f"http://127.0.0.1:{_closed_port()}"
    flags = ["--policy", str(write_policy(tmp_path)), "--agent", "tester", "--evidence-dir", str(tmp_path / "ev"),
             "--fsync", "never", "--otlp-endpoint", endpoint, "--checkpoint-every-lines", "1"]
    try:
        async with connect(wrap_params(GITHUB_LIKE, *flags)) as client:
            began = time.monotonic()
            for owner in ("acme", "octo", "acme", "octo", "acme", "octo"):
                result = await client.call_tool("list_repos", {"owner": owner})
                assert not result.is_error
            elapsed = time.monotonic() - began
            # Were the export on the calls' path, each would wait for the collector's 5 s timeout.
            assert elapsed < 15.0, elapsed
            if receiver is not None:
                # the batch did try to reach it, from its own thread
                await eventually_async(lambda: receiver.bodies, WAIT, "an export reaching the collector")
    finally:
        hang.set()
        if receiver is not None:
            receiver.close()
    trace = [json.loads(line) for line in (tmp_path / "ev" / "trace.ndjson").read_text().splitlines()]
    assert [e["body"]["outcome"] for e in trace if e["kind"] == "tool_decision"] == ["ok"] * 6


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:  # noqa: N802
        self.requests.append(request)
        return ExportTraceServiceResponse()


async def test_spans_over_grpc(tmp_path: Path) -> None:
    service = _TraceService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    flags = ["--policy", str(write_policy(tmp_path)), "--agent", "tester", "--fsync", "never",
             "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", "grpc"]
    try:
        async with connect(wrap_params(GITHUB_LIKE, *flags)) as client:
            assert not (await client.call_tool("list_repos", {"owner": SECRET})).is_error
    finally:
        server.stop(grace=None)
    spans = [span for request in service.requests for rs in request.resource_spans for ss in rs.scope_spans
             for span in ss.spans]
    assert sorted((span.name, KINDS[span.kind]) for span in spans) == [
        ("tools/call list_repos", "CLIENT"), ("tools/call list_repos", "SERVER")]
    assert "drawbridge.trace.index" not in attributes(spans[0])  # no evidence directory: no trace to point into
    assert not [r for r in service.requests if SECRET.encode() in r.SerializeToString()]


def test_telemetry_configured_but_not_installed_is_a_one_line_startup_error(tmp_path: Path) -> None:
    """Without opentelemetry-sdk (hidden here by a package that refuses to import), a gateway asked
    for telemetry does not start without it: one line, exit 2, what to install."""
    import os
    import subprocess

    from conftest import PYTHON, SERVERS, child_env

    hidden = tmp_path / "hide" / "opentelemetry" / "sdk"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden for the test')\n")
    env = child_env({"PYTHONPATH": os.pathsep.join([str(tmp_path / "hide"), os.environ.get("PYTHONPATH", "")])})
    argv = [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--otlp-endpoint", "http://127.0.0.1:9",
            "--", PYTHON, str(SERVERS / "notebook.py")]
    done = subprocess.run(argv, input="", capture_output=True, text=True, env=env, timeout=scaled(60))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "telemetry is configured" in lines[0] and "drawbridge[telemetry]" in lines[0]


def _json_or_event(response: httpx.Response) -> Any:
    """The JSON-RPC answer of a POST, sent as JSON or as the last event of a stream."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


def test_a_serve_http_session_names_its_spans_and_stdio_does_not(tmp_path: Path) -> None:
    """``mcp.session.id`` only where a session id exists: the ``Mcp-Session-Id`` serve gave this
    2025-11-25 HTTP session, on the SERVER span of each of its calls."""
    receiver = Receiver()
    token = "telemetry-agent-token"
    config = write_config(
        tmp_path, [GITHUB], auth={"agents": [{"agent": "alice", "token_sha256": sha256(token)}]},
        telemetry={"endpoint": receiver.url}, checkpoints={"every_seconds": 3600},
    )
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "authorization": f"Bearer {token}"}
    try:
        with http_gateway(config) as running, httpx.Client(timeout=WAIT) as http:
            assert running.url is not None
            opened = http.post(running.url, json=initialize_request(), headers=headers)
            assert opened.status_code == 200, opened.text
            session = opened.headers["mcp-session-id"]
            headers["mcp-session-id"] = session
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert http.post(running.url, json=note, headers=headers).status_code == 202
            for request_id in (2, 3):
                call = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                        "params": {"name": "github.list_repos", "arguments": {"owner": SECRET}}}
                answered = http.post(running.url, json=call, headers=headers)
                assert answered.status_code == 200, answered.text
                assert _json_or_event(answered)["result"]["isError"] is False, answered.text
        # serve has stopped: its shutdown flushed the spans.
        servers = [span for span in receiver.spans() if KINDS[span.kind] == "SERVER"]
        assert [span.name for span in servers] == ["tools/call github.list_repos"] * 2
        for span in servers:
            found = attributes(span)
            assert found["mcp.session.id"] == session
            assert found["network.transport"] == "tcp" and found["mcp.protocol.version"] == "2025-11-25"
        assert not [path for path, body in receiver.bodies if SECRET.encode() in body]
    finally:
        receiver.close()


def test_under_json_logs_every_line_is_json_and_a_clean_stop_with_the_collector_down_is_quiet(tmp_path: Path) -> None:
    """The worker's (the SDK's) complaints about a collector that is down and the control plane's
    line follow ``--log-format json``; a SIGTERM to the whole process group (a service manager, Ctrl-C)
    stops the gateway cleanly, without an error about the worker it stopped."""
    import os
    import signal
    import subprocess

    from conftest import PYTHON, child_env
    from serve_support import serve_argv

    config = write_config(
        tmp_path, [GITHUB], telemetry={"endpoint": f"http://127.0.0.1:{_closed_port()}"},
        checkpoints={"every_seconds": 0.2}, control={"port": 0},
    )
    process = subprocess.Popen(
        serve_argv(config, "--log-format", "json"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env=child_env(), start_new_session=True, text=True,
    )
    lines: list[str] = []
    seen = threading.Condition()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            with seen:
                lines.append(line)
                seen.notify_all()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        with seen:
            complained = seen.wait_for(lambda: any("telemetry worker:" in line or "xport" in line for line in lines)
                                       and any("control plane on" in line for line in lines), WAIT)
        assert complained, "".join(lines)
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(WAIT) == 0, "".join(lines)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(WAIT)
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    assert any(r.get("message", "").startswith("control plane on http://") for r in records), records
    worker = [r for r in records if r["logger"] == "drawbridge.telemetry"]
    assert any(r["message"].startswith("telemetry worker: ") for r in worker), records
    # The collector being down is said by the SDK's lines; the gateway says nothing of a worker "gone".
    assert not [r for r in worker if r["message"].startswith("the telemetry worker")], worker
