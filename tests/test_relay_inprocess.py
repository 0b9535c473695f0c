"""The relay in this process, over real OS pipes, with hooks the tests control."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from conftest import CRASHY, PYTHON, SERVERS, eventually_async, scaled, spy_upstream_writes

from drawbridge.gateway.pipeline.call import CallPipeline
from drawbridge.gateway.pipeline.deciders import RECORDING_FAILED, allow_all
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.records import CallRecord, RelayEvent, null_recorder
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Provenance, Verdict
from drawbridge.gateway.protocol.jsonrpc import EVIDENCE_UNWRITTEN, RESULT_WITHHELD
from drawbridge.gateway.transports.relay_requests import RelayConfig
from drawbridge.gateway.transports.wrap_relay import StdioRelay
from drawbridge.gateway.upstreams.child_process import UpstreamProcess
from drawbridge.gateway.upstreams.pipes import FdReceiveStream, FdSendStream

pytestmark = pytest.mark.anyio

SCRIPTED = [PYTHON, str(SERVERS / "scripted.py")]
INITIALIZE = {"jsonrpc": "2.0", "id": "init", "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


class Client:
    def __init__(self, to_gateway: FdSendStream, from_gateway: FdReceiveStream) -> None:
        self.to_gateway = to_gateway
        self.from_gateway = from_gateway
        self._buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        await self.to_gateway.send(json.dumps(message).encode() + b"\n")

    async def recv(self, timeout: float = scaled(10)) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while b"\n" not in self._buffer:
                self._buffer += await self.from_gateway.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    async def call(self, request_id: Any, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.send(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments or {}}}
        )
        return await self.recv()


@asynccontextmanager
async def relay_over_pipes(
    server: list[str], decide: Any = allow_all, record: Any = null_recorder, config: RelayConfig | None = None,
    *, handshake: bool = True,
) -> AsyncIterator[tuple[Client, StdioRelay, anyio.Event]]:
    """The relay over real pipes; with ``handshake`` the agent's ``initialize`` is answered first (wrap
    takes no other request before it)."""
    to_gateway_r, to_gateway_w = os.pipe()
    from_gateway_r, from_gateway_w = os.pipe()
    upstream = await UpstreamProcess.spawn(server, max_message_bytes=1 << 20)
    pipeline = CallPipeline(policy=decide, guard=EvidenceGuard(record))
    relay = StdioRelay(
        upstream, FdReceiveStream(to_gateway_r), FdSendStream(from_gateway_w), pipeline=pipeline, config=config
    )
    client = Client(FdSendStream(to_gateway_w), FdReceiveStream(from_gateway_r))
    finished = anyio.Event()

    async def run() -> None:
        await relay.run()
        finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            if handshake:
                await client.send(INITIALIZE)
                assert "result" in await client.recv()
            yield client, relay, finished
        finally:
            await client.to_gateway.aclose()
            with anyio.fail_after(scaled(10)):
                await finished.wait()
            await client.from_gateway.aclose()


async def test_a_failing_recorder_makes_later_calls_fail_closed() -> None:
    async def broken(event: RelayEvent) -> None:
        raise OSError("disk full")

    async with relay_over_pipes(SCRIPTED, record=broken) as (client, _relay, _done):
        first = await client.call(1, "echo", {"a": 1})
        # The call ran but its record failed: nothing is answered without evidence.
        assert first["error"]["code"] == EVIDENCE_UNWRITTEN and first["error"]["message"] == RESULT_WITHHELD
        second = await client.call(2, "echo", {"a": 2})
        assert second["result"]["isError"] is True
        assert second["result"]["content"][0]["text"] == f'drawbridge refused this call: policy "drawbridge": {RECORDING_FAILED}'


async def test_a_decider_returning_nonsense_is_a_deny() -> None:
    async def nonsense(call: ToolCall) -> Any:
        return {"action": "allow"}

    async with relay_over_pipes(SCRIPTED, decide=nonsense) as (client, _relay, _done):
        refused = await client.call(1, "echo")
        assert refused["result"]["isError"] is True
        assert "the decision failed (TypeError)" in refused["result"]["content"][0]["text"]


async def test_closing_stdin_forwards_what_the_upstream_says_while_it_exits() -> None:
    records: list[RelayEvent] = []

    async def record(event: RelayEvent) -> None:
        records.append(event)

    async with relay_over_pipes(CRASHY, record=record, handshake=False) as (client, relay, finished):
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": "init",
                "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
            }
        )
        assert (await client.recv())["result"]["protocolVersion"] == "2025-11-25"
        await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hang"}})
        assert (await client.call(2, "echo", {"text": "later"}))["id"] == 2  # sent after 1: 1 is upstream
        await client.to_gateway.aclose()
        # The SDK server answers requests in flight when its stdin ends; the answer is relayed.
        answer = await client.recv()
        assert answer["id"] == 1 and "error" in answer
        with anyio.fail_after(scaled(10)):
            await finished.wait()
        assert relay.upstream.returncode is not None
    (call,) = [r for r in records if isinstance(r, CallRecord) and r.tool == "hang"]
    assert (call.tool, call.outcome.value, call.protocol_version) == ("hang", "upstream_error", "2025-11-25")


async def test_closing_stdin_settles_calls_a_stuck_upstream_never_answers() -> None:
    records: list[RelayEvent] = []

    async def record(event: RelayEvent) -> None:
        records.append(event)

    config = RelayConfig(shutdown_grace=0.5)
    async with relay_over_pipes(SCRIPTED, record=record, config=config) as (client, relay, finished):
        await client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hang"}})
        assert (await client.call(2, "echo"))["id"] == 2  # sent after 1 and answered: 1 is upstream
        await client.to_gateway.aclose()
        with anyio.fail_after(scaled(10)):
            await finished.wait()
        assert relay.upstream.returncode is not None  # the stuck child was killed, not left behind
    (call,) = [r for r in records if isinstance(r, CallRecord) and r.tool == "hang"]
    assert (call.tool, call.outcome.value) == ("hang", "cancelled")
    assert call.error == "the agent closed the connection before an answer"


async def test_an_agent_that_stops_reading_does_not_wedge_shutdown() -> None:
    async with relay_over_pipes(SCRIPTED) as (client, _relay, finished):
        await client.from_gateway.aclose()
        for request_id in range(3):
            await client.send(
                {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
            )
        with anyio.fail_after(scaled(10)):
            await finished.wait()


async def test_decisions_see_the_agent_and_the_record_carries_provenance() -> None:
    seen: list[ToolCall] = []
    records: list[RelayEvent] = []

    async def decide(call: ToolCall) -> Verdict:
        seen.append(call)
        return Verdict(Action.ALLOW, "fine", Provenance("p", "p.yaml", 3))

    async def record(event: RelayEvent) -> None:
        records.append(event)

    config = RelayConfig(agent="claude")
    async with relay_over_pipes(SCRIPTED, decide=decide, record=record, config=config) as (client, _relay, _done):
        await client.call("x", "echo", {"k": [1, 2]})
    assert [(c.agent, c.tool, dict(c.arguments), c.request_id) for c in seen] == [("claude", "echo", {"k": [1, 2]}, "x")]
    (call,) = records
    assert isinstance(call, CallRecord)
    assert call.provenance == Provenance("p", "p.yaml", 3)
    assert call.call is seen[0]
    assert call.outcome.value == "ok" and call.action is Action.ALLOW


# Answers initialize, lists one tool, then never reads its stdin again.
DEAF_AFTER_LISTING = """
import json, sys, time
for line in sys.stdin:
    message = json.loads(line)
    if message.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": "2025-11-25"}}), flush=True)
    if message.get("method") == "tools/list":
        tools = [{"name": "t", "inputSchema": {"type": "object"}}]
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": tools}}), flush=True)
        time.sleep(60)
"""


async def test_an_upstream_that_stops_reading_does_not_wedge_shutdown() -> None:
    records: list[RelayEvent] = []

    async def record(event: RelayEvent) -> None:
        records.append(event)

    config = RelayConfig(shutdown_grace=0.5)
    async with relay_over_pipes([PYTHON, "-c", DEAF_AFTER_LISTING], record=record, config=config) as (client, relay, finished):
        # Far more than a pipe buffer: once the call is forwarded, its write to the child blocks for good.
        await client.send(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {"x": "y" * 2_000_000}}}
        )
        transport = relay.upstream._writer.transport
        await eventually_async(lambda: transport.get_write_buffer_size() > 0, what="the call's write held by the pipe")
        await client.to_gateway.aclose()
        with anyio.fail_after(scaled(10)):
            await finished.wait()
        assert relay.upstream.returncode is not None
    (call,) = [r for r in records if isinstance(r, CallRecord)]
    assert call.forwarded and call.outcome.value == "cancelled"


def test_process_stdio_keeps_stray_output_off_the_protocol_pipe() -> None:
    import subprocess

    script = """
import anyio
from drawbridge.gateway.transports.process_stdio import process_stdio

async def main():
    async with process_stdio() as (client_in, client_out):
        print("stray print")
        data = await client_in.receive()
        await client_out.send(b"echo:" + data)
    print("after, on stdout again")

anyio.run(main)
"""
    result = subprocess.run(
        [PYTHON, "-c", script], input=b"hello\n", capture_output=True, timeout=scaled(30)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"echo:hello\nafter, on stdout again\n"
    assert b"stray print" in result.stderr
