"""What an agent and a collector cannot do to the gateway's telemetry, against a real ``drawbridge
wrap`` and the real OTLP receiver of ``telemetry_support``: made-up tool names never become labels or
span names, a ``traceparent`` with flags 00 does not switch the spans off, a refusal is an error
(``tool_error``), a collector that hangs does not hold wrap's exit past its grace, and no worker
outlives the gateway. The collector's header and the service name are checked at startup, and a
credential written in place of its variable's name is never repeated. An agent's made-up envelope
version is refused (as serve refuses it), no string makes a span longer than its bound, the spans a
collector refuses are counted in the line that says what was lost, and a collector's answer is read
only as far as a real one goes (over HTTP and gRPC).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from approval_support import trace, write_policy
from conftest import (
    GITHUB_LIKE, LEGACY_VERSION, MODERN, PYTHON, SERVERS, RawPipe, child_env, eventually, eventually_async, raw_pipe,
    scaled, wrap_argv,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from telemetry_support import KINDS, WAIT, Receiver, attributes, metric_points

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


VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
LONG = "2026-07-28-" + "v" * 200_000
"""A version an agent made up, long enough that a span carrying it would make a collector refuse the batch."""
SCRIPTED = [PYTHON, str(SERVERS / "scripted.py")]
SOON = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
"""The worker's span batches leave every 0.2 s (the SDK's setting; 5 s by default): a test waits for an
export during the run, not on the last one, which a loaded machine may not make within wrap's bound."""


def _read_note(meta: dict[str, object] | None = None) -> dict[str, object]:
    return _params("read_note", {"name": "n"}, meta)


@asynccontextmanager
async def _exporting_wrap(server: list[str], evidence: Path) -> AsyncIterator[tuple[RawPipe, Receiver]]:
    """wrap in front of ``server``, recording into ``evidence`` and exporting to a receiver of its own;
    the receiver keeps what it got once wrap has exited."""
    receiver = Receiver()
    flags = ["--allow-all", "--fsync", "never", "--evidence-dir", str(evidence), "--otlp-endpoint", receiver.url]
    try:
        async with raw_pipe(wrap_argv(server, *flags), env=SOON) as pipe:
            yield pipe, receiver
    finally:
        receiver.close()


async def test_a_made_up_envelope_version_is_refused_as_serve_refuses_it_and_never_exported(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    async with _exporting_wrap(NOTEBOOK, evidence) as (pipe, receiver):
        await pipe.initialize()  # a 2025-11-25 session
        made_up = (await pipe.request(1, "tools/call", _read_note({VERSION_KEY: LONG})))["error"]
        handshake = (await pipe.request(2, "tools/call", _read_note({VERSION_KEY: LEGACY_VERSION})))["error"]
        answered = await pipe.request(3, "tools/call", _read_note())
        assert "result" in answered, answered
        await eventually_async(lambda: len(receiver.spans()) >= 2, WAIT, "the answered call's spans exported")
    assert (made_up["code"], made_up["message"]) == (-32022, "Unsupported protocol version"), made_up["message"]
    assert made_up["data"]["requested"] == LONG and made_up["data"]["supported"][0] == MODERN
    assert handshake["code"] == -32022 and "handshake-era version" in handshake["message"], handshake
    incidents = [e["body"] for e in trace(evidence, "relay_incident") if e["body"]["kind"] == "invalid_message"]
    assert [(i["code"], i["detail"]) for i in incidents] == [(-32022, made_up["message"]), (-32022, handshake["message"])]
    assert "v" * 100 not in (evidence / "trace.ndjson").read_text()
    versions = {e["body"].get("protocol_version") for e in trace(evidence, "tool_decision")}
    assert versions == {LEGACY_VERSION}, versions
    spans = receiver.spans()
    assert [attributes(span)["mcp.protocol.version"] for span in spans] == [LEGACY_VERSION] * len(spans)
    assert len(spans) == 2 and not [path for path, body in receiver.bodies if b"v" * 100 in body]


async def test_a_version_the_server_echoes_is_kept_short_in_the_trace_and_the_spans(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    async with _exporting_wrap(SCRIPTED, evidence) as (pipe, receiver):
        await pipe.initialize(LONG)  # the server answers with the version asked for
        assert "result" in await pipe.request(1, "tools/call", _params("echo", {}))
        await eventually_async(receiver.spans, WAIT, "the call's spans exported")
    assert "v" * 100 not in (evidence / "trace.ndjson").read_text()
    [version] = {e["body"].get("protocol_version") for e in trace(evidence, "tool_decision")}
    assert LONG.startswith(version) and len(version) == 32, version
    spans = receiver.spans()
    assert spans and {attributes(span)["mcp.protocol.version"] for span in spans} == {version}


def test_no_string_a_summary_carries_makes_a_span_longer_than_its_bound() -> None:
    from drawbridge.gateway.recording import telemetry_worker as worker

    receiver = Receiver()
    settings = {"endpoint": receiver.url, "protocol": "http/protobuf", "headers": {}, "service_name": "bounds",
                "timeout_seconds": 5.0, "network_transport": "pipe", "origin": None, "version": "0"}
    try:
        exporter = worker.Exporter(settings)
        summary: list[object] = [None] * 18
        summary[worker.TOOL], summary[worker.REQUEST_ID], summary[worker.PROTOCOL] = "t", "1", "p" * 5000
        summary[worker.ERROR_CODE], summary[worker.ERROR], summary[worker.FORWARDED] = -32603, "e" * 5000, True
        summary[worker.LATENCY], summary[worker.END] = 1.0, time.time_ns()
        exporter.call(tuple(summary))
        exporter.shutdown(scaled(10))
        spans = receiver.spans()
        assert len(spans) == 2
        for span in spans:
            assert attributes(span)["mcp.protocol.version"] == "p" * worker.MAX_ATTRIBUTE_CHARS
            assert span.status.message == "e" * worker.MAX_ATTRIBUTE_CHARS
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


INITIALIZE = (b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
              b'"capabilities":{},"clientInfo":{"name":"t","version":"0"}}}\n')


def _calls_through_wrap(
    endpoint: str, count: int, *flags: str, exported: Callable[[], object] | None = None
) -> tuple[str, float]:
    """``count`` calls through wrap (each answered before the next is sent), then (once ``exported``
    holds, if given) its stdin closed: wrap's stderr, and how long it took to exit once it was closed."""
    argv = wrap_argv(NOTEBOOK, "--allow-all", "--fsync", "never", "--otlp-endpoint", endpoint, *flags)
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=child_env(SOON))
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    try:
        process.stdin.write(INITIALIZE + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        process.stdin.flush()
        assert b'"id":0' in process.stdout.readline()
        for request_id in range(1, count + 1):
            process.stdin.write(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"write_note",'
                                b'"arguments":{"name":"n","text":"t"}}}\n' % request_id)
            process.stdin.flush()
            assert b'"result"' in process.stdout.readline()
        if exported is not None:
            eventually(exported, WAIT, "an export during the run")
        began = time.monotonic()
        process.stdin.close()
        process.wait(scaled(30))
        return process.stderr.read().decode(), time.monotonic() - began
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()


def test_spans_the_collector_refuses_are_counted_in_the_line_that_says_they_are_lost() -> None:
    receiver = Receiver(status=500)  # takes every export, and refuses it
    try:
        stderr, _took = _calls_through_wrap(receiver.url, 30, exported=lambda: receiver.bodies)
    finally:
        receiver.close()
    assert receiver.bodies, "the exports reached the collector"
    lost = [line for line in stderr.splitlines() if "span(s)" in line]
    assert len(lost) == 1 and "WARNING" in lost[0], stderr
    assert "did not take 60 of the 60 span(s) made" in lost[0], lost  # a SERVER and a CLIENT span per call


def test_a_collector_answer_declared_gigabytes_long_is_left_unread() -> None:
    flood = 256 * 1024 * 1024
    receiver = Receiver(flood=flood)  # every answer: 200, Content-Length 3 GiB, and as much of it as is read
    try:
        stderr, took = _calls_through_wrap(receiver.url, 3, exported=lambda: receiver.bodies)
    finally:
        receiver.close()
    assert receiver.bodies, "the exports reached the collector"
    # Unread, the answers' connections are closed: what was written of them is what the sockets' buffers held.
    assert receiver.flooded < flood // 4, receiver.flooded
    assert "span(s)" not in stderr, stderr  # the status was read: every span was taken
    assert took < 2.0 * max(1.0, scaled(1.0)) + 0.5, took


class _LongAnswers(trace_service_pb2_grpc.TraceServiceServicer):
    """A gRPC collector that takes every export and answers it with a megabyte of text."""

    def __init__(self) -> None:
        self.requests = 0

    def Export(self, request: ExportTraceServiceRequest, context: object) -> ExportTraceServiceResponse:  # noqa: N802
        self.requests += 1
        answer = ExportTraceServiceResponse()
        answer.partial_success.error_message = "x" * (1024 * 1024)
        return answer


def test_a_grpc_collector_answer_over_the_bound_is_refused_not_read() -> None:
    service = _LongAnswers()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        stderr, _took = _calls_through_wrap(f"http://127.0.0.1:{port}", 2, "--otlp-protocol", "grpc",
                                            exported=lambda: service.requests)
    finally:
        server.stop(grace=None)
    assert "RESOURCE_EXHAUSTED" in stderr, stderr  # the channel refused the answer: nothing of it was kept
    assert re.search(r"WARNING .*\b4 (of the 4 )?span\(s\)", stderr), stderr  # the collector's answer was not read


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
