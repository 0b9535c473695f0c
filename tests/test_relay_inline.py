"""Inline calls: the relay without a task per tools/call, in this process over real OS pipes.

When the decider offers ``decide_now`` and the recorder ``record_now``, a call is decided in the client
loop and completed by whoever settles it. These tests pin what must not change on that route: every
record is made before its answer is written (also when the recorder hands back an awaitable for a
batch fsync), a slow record holds only its own answer, a failed record makes later calls fail
closed, a decider that must wait gets a call task, timeouts and cancellations settle inline calls,
and lines the upstream cannot take at once wait in a task while the client loop reads on. What
arrives in one read is handled together: the calls decided from one read of the agent reach the
upstream in one write, the calls answered in one read of the upstream are recorded together and
answered in one write, and neither changes the order of lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import ByteSendStream
from conftest import PYTHON, SERVERS, eventually_async, scaled, spy_upstream_writes

from drawbridge.gateway.pipeline.call import CallPipeline
from drawbridge.gateway.pipeline.deciders import RECORDING_FAILED
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.records import CallRecord, RelayEvent
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
BATCHED = [PYTHON, str(SERVERS / "batched.py")]
ALLOW = Verdict(Action.ALLOW, "fine", Provenance("p", "p.yaml", 0))
DENY = Verdict(Action.DENY, "no", Provenance("p", "p.yaml", 1))


class SyncDecider:
    """Allows everything but ``deny_me``; ``wait_for_me`` cannot be decided without waiting."""

    def __init__(self) -> None:
        self.awaited: list[str] = []

    async def __call__(self, call: ToolCall) -> Verdict:
        self.awaited.append(call.tool)
        await anyio.sleep(0.05)
        return ALLOW

    def decide_now(self, call: ToolCall) -> Verdict | None:
        if call.tool == "wait_for_me":
            return None
        if call.tool == "explode":
            raise RuntimeError("boom")
        return DENY if call.tool == "deny_me" else ALLOW


class SyncRecorder:
    """Logs each record; ``hold`` maps a request id to an event the record's completion waits for."""

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.log = log
        self.events: list[RelayEvent] = []
        self.batches: list[int] = []
        self.hold: dict[Any, anyio.Event] = {}
        self.fail_later: set[Any] = set()

    async def __call__(self, event: RelayEvent) -> None:
        rest = self.record_now([event])
        if rest is not None:
            await rest

    def record_now(self, events: list[RelayEvent]) -> Any:
        """Records written together complete together: later, if one of them is held or fails."""
        later = []
        self.batches.append(len(events))
        for event in events:
            self.events.append(event)
            request_id = event.request_id if isinstance(event, CallRecord) else None
            self.log.append(("record", request_id))
            if request_id in self.hold or request_id in self.fail_later:
                later.append(request_id)
        return self._rest(later) if later else None

    async def _rest(self, request_ids: list[Any]) -> None:
        for request_id in request_ids:
            if request_id in self.hold:
                await self.hold[request_id].wait()
            self.log.append(("synced", request_id))
        if any(request_id in self.fail_later for request_id in request_ids):
            raise OSError("fsync failed")


class SpyOut(ByteSendStream):
    """The client's end of the pipe, logging each answer's id as it is written."""

    def __init__(self, inner: FdSendStream, log: list[tuple[str, Any]]) -> None:
        self.inner = inner
        self.log = log

    async def send(self, item: bytes) -> None:
        self.log.append(("write", item.count(b"\n")))
        for line in item.splitlines():
            self.log.append(("answer", json.loads(line).get("id")))
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Client:
    def __init__(self, to_gateway: FdSendStream, from_gateway: FdReceiveStream) -> None:
        self.to_gateway = to_gateway
        self.from_gateway = from_gateway
        self._buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        await self.to_gateway.send(json.dumps(message).encode() + b"\n")

    async def call(self, request_id: Any, name: str, arguments: dict[str, Any] | None = None) -> None:
        await self.send(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments or {}}}
        )

    async def recv(self, timeout: float = scaled(10)) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while b"\n" not in self._buffer:
                self._buffer += await self.from_gateway.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)


@asynccontextmanager
async def inline_relay(
    server: list[str], decide: Any, record: Any, log: list[tuple[str, Any]], config: RelayConfig | None = None,
    *, spy: bool = True, call_timeout: float = 120.0, handshake: bool = True,
) -> AsyncIterator[tuple[Client, StdioRelay, anyio.Event]]:
    """The relay over real pipes; with ``handshake`` the agent's ``initialize`` is answered first (wrap
    takes no other request before it), and the log starts after it."""
    to_gateway_r, to_gateway_w = os.pipe()
    from_gateway_r, from_gateway_w = os.pipe()
    upstream = await UpstreamProcess.spawn(server, max_message_bytes=1 << 20)
    out: Any = SpyOut(FdSendStream(from_gateway_w), log) if spy else FdSendStream(from_gateway_w)
    pipeline = CallPipeline(policy=decide, guard=EvidenceGuard(record), call_timeout=call_timeout)
    relay = StdioRelay(upstream, FdReceiveStream(to_gateway_r), out, pipeline=pipeline, config=config)
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
                log.clear()
            yield client, relay, finished
        finally:
            await client.to_gateway.aclose()
            with anyio.fail_after(scaled(10)):
                await finished.wait()
            await client.from_gateway.aclose()


def _calls(recorder: SyncRecorder) -> dict[Any, CallRecord]:
    return {e.request_id: e for e in recorder.events if isinstance(e, CallRecord)}


async def test_every_record_is_made_before_its_answer() -> None:
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log) as (client, _relay, _done):
        for request_id, tool in enumerate(["echo", "deny_me", "explode", "echo", "echo"]):
            await client.call(request_id, tool, {"n": request_id})
        answers = {(await client.recv())["id"]: None for _ in range(5)}
    assert set(answers) == {0, 1, 2, 3, 4}
    for request_id in range(5):
        assert log.index(("record", request_id)) < log.index(("answer", request_id)), log
    calls = _calls(recorder)
    assert [calls[i].outcome.value for i in range(5)] == ["ok", "refused", "refused", "ok", "ok"]
    assert calls[2].reason == "the decision failed (RuntimeError); failing closed"
    assert calls[1].provenance == Provenance("p", "p.yaml", 1) and calls[0].decision_ms is not None


async def test_a_record_that_completes_later_holds_only_its_own_answer() -> None:
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    recorder.hold["slow"] = anyio.Event()
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log) as (client, _relay, _done):
        await client.call("slow", "echo", {"a": 1})
        # recorded (its answer held) before the next call
        await eventually_async(lambda: ("record", "slow") in log, what="the slow call's record")
        await client.call("fast", "echo", {"a": 2})
        first = await client.recv()
        assert first["id"] == "fast"  # served while the other record waits for its fsync
        assert ("answer", "slow") not in log
        recorder.hold["slow"].set()
        second = await client.recv()
        assert second["id"] == "slow" and second["result"]["content"][0]["text"] == '{"a": 1}'
    assert log.index(("synced", "slow")) < log.index(("answer", "slow"))


async def test_a_record_that_fails_later_makes_later_calls_fail_closed() -> None:
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    recorder.fail_later.add(1)
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log) as (client, _relay, _done):
        await client.call(1, "echo", {"a": 1})
        withheld = await client.recv()  # it ran, but its record failed: the result is withheld
        assert withheld["error"]["code"] == EVIDENCE_UNWRITTEN and withheld["error"]["message"] == RESULT_WITHHELD
        await client.call(2, "echo", {"a": 2})
        refused = await client.recv()
    assert refused["result"]["isError"] is True
    assert refused["result"]["content"][0]["text"] == f'drawbridge refused this call: policy "drawbridge": {RECORDING_FAILED}'


async def test_a_decider_that_must_wait_gets_a_call_task() -> None:
    log: list[tuple[str, Any]] = []
    decider = SyncDecider()
    recorder = SyncRecorder(log)
    async with inline_relay(SCRIPTED, decider, recorder, log) as (client, _relay, _done):
        await client.call(1, "wait_for_me", {"x": 1})
        await client.call(2, "echo", {"x": 2})
        answers = {}
        for _ in range(2):
            answer = await client.recv()
            answers[answer["id"]] = answer
    assert decider.awaited == ["wait_for_me"]
    assert answers[1]["result"]["content"][0]["text"] == '{"x": 1}'
    assert log.index(("record", 1)) < log.index(("answer", 1))
    assert _calls(recorder)[1].outcome.value == "ok"


async def test_inline_calls_time_out_in_order_and_the_rest_go_on() -> None:
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log, call_timeout=0.4) as (client, _relay, _done):
        await client.call("h1", "hang")
        await anyio.sleep(0.1)
        await client.call("h2", "hang")
        await client.call("e", "echo", {"still": "here"})
        answers = [await client.recv() for _ in range(3)]
    assert [a["id"] for a in answers] == ["e", "h1", "h2"]
    for answer in answers[1:]:
        assert answer["error"] == {"code": -32001, "message": "the upstream did not answer tools/call within 0.4 seconds"}
    calls = _calls(recorder)
    assert (calls["h1"].outcome.value, calls["h2"].outcome.value, calls["e"].outcome.value) == ("timeout", "timeout", "ok")
    assert calls["h1"].latency_ms >= 400


async def test_a_cancelled_inline_call_is_recorded_and_not_answered() -> None:
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log) as (client, _relay, _done):
        await client.call(7, "hang")
        await client.call(6, "echo", {"before": 1})
        assert (await client.recv())["id"] == 6  # sent after 7 and answered: 7 went upstream first
        await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
        await client.call(8, "echo", {"after": 1})
        assert (await client.recv())["id"] == 8
    assert ("answer", 7) not in log
    assert _calls(recorder)[7].outcome.value == "cancelled"
    assert _calls(recorder)[7].error == "the agent cancelled the request"


LIST_THEN_STOP_READING = """
import json, sys, time
request = json.loads(sys.stdin.readline())  # the agent's initialize
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"protocolVersion": "2025-11-25"}}) + "\\n")
sys.stdout.flush()
request = json.loads(sys.stdin.readline())  # the gateway's own tools/list
tools = [{"name": "t", "inputSchema": {"type": "object"}}]
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"tools": tools}}) + "\\n")
sys.stdout.flush()
time.sleep(60)
"""


async def test_lines_the_upstream_cannot_take_now_wait_in_a_task_while_the_client_loop_reads_on() -> None:
    deaf = [PYTHON, "-c", LIST_THEN_STOP_READING]
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    config = RelayConfig(shutdown_grace=0.5)
    async with inline_relay(deaf, SyncDecider(), recorder, log, config) as (client, relay, finished):
        written = spy_upstream_writes(relay)
        # The first line fills the pipe's buffer past its limit; the second cannot be handed over.
        await client.call(1, "t", {"x": "y" * 2_000_000})
        await client.call(2, "t", {"x": "small"})
        await eventually_async(lambda: any(b'"small"' in data for data in written), what="the second line's hand-over")
        assert relay.upstream.send_nowait(b"{}\n") is False
        await client.to_gateway.aclose()
        with anyio.fail_after(scaled(10)):
            await finished.wait()
        assert relay.upstream.returncode is not None
    calls = _calls(recorder)
    assert (calls[1].outcome.value, calls[2].outcome.value) == ("cancelled", "cancelled")


def _call_line(request_id: Any, name: str, arguments: dict[str, Any] | None = None) -> bytes:
    params = {"name": name, "arguments": arguments or {}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode() + b"\n"


async def test_calls_decided_from_one_read_reach_the_upstream_in_one_write_in_order() -> None:
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log) as (client, relay, _done):
        await client.call("first", "echo")  # the gateway lists the server's tools for the first call
        assert (await client.recv())["id"] == "first"
        written = spy_upstream_writes(relay)
        await client.to_gateway.send(b"".join(_call_line(i, "echo", {"n": i}) for i in range(5)))
        answers = sorted([(await client.recv())["id"] for _ in range(5)])
    assert answers == [0, 1, 2, 3, 4]
    assert len(written) == 1
    assert [json.loads(line)["id"] for line in written[0].splitlines()] == [0, 1, 2, 3, 4]


async def test_a_call_cancelled_in_the_read_that_brought_it_never_reaches_the_upstream(tmp_path: Any) -> None:
    seen = tmp_path / "seen.ndjson"
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    async with inline_relay([*BATCHED, str(seen)], SyncDecider(), recorder, log) as (client, _relay, _done):
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}
        await client.to_gateway.send(_call_line(9, "echo") + json.dumps(cancel).encode() + b"\n" + _call_line(10, "echo"))
        assert (await client.recv())["id"] == 10
    received = [json.loads(line) for line in seen.read_text().splitlines()]
    calls = [m for m in received if m.get("method") not in ("initialize", "tools/list")]  # the calls only
    assert [m.get("id") for m in calls] == [10]  # neither call 9 nor its cancellation was sent
    assert ("answer", 9) not in log
    assert _calls(recorder)[9].outcome.value == "cancelled"


async def _arrived(seen: Any, request_id: str) -> None:
    """Wait until the batched server has read the call ``request_id`` (each call its own read)."""
    await eventually_async(lambda: seen.exists() and f'"id": "{request_id}"' in seen.read_text(), what=f"call {request_id} upstream")


async def test_calls_answered_in_one_read_are_recorded_together_then_answered_in_one_write(tmp_path: Any) -> None:
    seen = tmp_path / "seen.ndjson"
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    async with inline_relay([*BATCHED, str(seen)], SyncDecider(), recorder, log) as (client, _relay, _done):
        for request_id, name in (("a", "hold"), ("b", "hold"), ("c", "release")):
            await client.call(request_id, name)
            await _arrived(seen, request_id)
        answers = [(await client.recv())["id"] for _ in range(3)]
    assert answers == ["a", "b", "c"]
    assert 3 in recorder.batches
    tail = log[log.index(("record", "a")) :]
    assert tail[:5] == [("record", "a"), ("record", "b"), ("record", "c"), ("write", 3), ("answer", "a")]


async def test_a_line_between_answers_read_together_keeps_its_place(tmp_path: Any) -> None:
    seen = tmp_path / "seen.ndjson"
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    async with inline_relay([*BATCHED, str(seen)], SyncDecider(), recorder, log) as (client, _relay, _done):
        for request_id, name in (("a", "hold"), ("b", "hold")):
            await client.call(request_id, name)
            await _arrived(seen, request_id)
        await client.call("c", "release", {"notify": True})
        received = [await client.recv() for _ in range(4)]
    assert [m.get("id", m.get("method")) for m in received] == ["a", "notifications/message", "b", "c"]
    assert log.index(("record", "a")) < log.index(("answer", "a"))
    assert log.index(("record", "c")) < log.index(("answer", "c"))


async def test_answers_larger_than_the_pipe_never_interleave_with_others() -> None:
    """The agent reads late: a big answer is written in part at once and the rest under the lock,
    and the answers behind it wait for it whole (also the ones that would fit in the pipe)."""
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    big = "x" * 300_000  # several times a pipe's buffer
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log, spy=False) as (client, relay, _done):
        assert relay._client_send_now is not None  # the route under test
        await client.call("big", "echo", {"blob": big})
        await anyio.sleep(scaled(0.5))  # the upstream loop now waits, mid-answer, for the agent to read
        for i in range(10):  # refused by the client loop, which writes while that answer waits
            await client.call(i, "deny_me", {"n": i})
            await client.call(f"e{i}", "echo", {"n": i})
        await anyio.sleep(scaled(0.3))  # the refusals are written while the big answer waits
        answers = {}
        for _ in range(21):
            answer = await client.recv()
            answers[answer["id"]] = answer
    assert set(answers) == {"big", *range(10), *(f"e{i}" for i in range(10))}
    assert json.loads(answers["big"]["result"]["content"][0]["text"]) == {"blob": big}
    assert all(answers[i]["result"]["isError"] is True for i in range(10))
    assert all(json.loads(answers[f"e{i}"]["result"]["content"][0]["text"]) == {"n": i} for i in range(10))


class HalfThenWait(ByteSendStream):
    """The agent's pipe, scripted: the first write takes half of what it is given at once and the
    rest only when ``release`` is set; later writes take everything at once."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.release = anyio.Event()
        self.first = True

    def send_nowait(self, item: bytes) -> int:
        if self.first:
            self.first = False
            half = len(item) // 2
            self.data += item[:half]
            return half
        self.data += item
        return len(item)

    async def send(self, item: bytes) -> None:
        await self.release.wait()
        self.data += item

    async def aclose(self) -> None:
        return None


async def test_a_write_that_must_wait_keeps_later_lines_behind_it() -> None:
    out = HalfThenWait()
    pipeline = CallPipeline(policy=SyncDecider(), guard=EvidenceGuard(SyncRecorder([])))
    relay = StdioRelay(None, FdReceiveStream(os.pipe()[0]), out, pipeline=pipeline)  # type: ignore[arg-type]
    big = b'{"id":"big","pad":"' + b"x" * 1000 + b'"}\n'
    small = b'{"id":"small"}\n'
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay._to_client, big)
        await eventually_async(lambda: out.data, what="half of the big line")  # the rest waits, holding the lock
        tg.start_soon(relay._to_client, small)
        await anyio.wait_all_tasks_blocked()
        assert bytes(out.data) == big[: len(big) // 2]  # the small line waits too
        out.release.set()
    assert bytes(out.data) == big + small


async def test_shutdown_settles_and_records_inline_calls_in_flight() -> None:
    log: list[tuple[str, Any]] = []
    recorder = SyncRecorder(log)
    config = RelayConfig(shutdown_grace=0.5)
    async with inline_relay(SCRIPTED, SyncDecider(), recorder, log, config) as (client, _relay, finished):
        await client.call(1, "hang")
        await client.call(2, "echo", {"after": 1})
        assert (await client.recv())["id"] == 2  # sent after 1 and answered: 1 is in flight upstream
        await client.to_gateway.aclose()
        with anyio.fail_after(scaled(10)):
            await finished.wait()
    call = _calls(recorder)[1]
    assert call.outcome.value == "cancelled" and call.error == "the agent closed the connection before an answer"


async def test_a_pipe_read_waits_without_spinning_and_a_close_wakes_the_reader() -> None:
    read_end, write_end = os.pipe()
    stream = FdReceiveStream(read_end)
    try:
        results: list[Any] = []

        async def reader() -> None:
            try:
                results.append(await stream.receive())
                results.append(await stream.receive())
            except anyio.ClosedResourceError:
                results.append("closed")

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.wait_all_tasks_blocked()  # the reader waits for the pipe
            os.write(write_end, b"one\n")
            await eventually_async(lambda: results, what="the first read")
            await anyio.wait_all_tasks_blocked()
            assert results == [b"one\n"]
            await stream.aclose()
        assert results == [b"one\n", "closed"]
    finally:
        os.close(write_end)

    # Data that arrives while nobody reads does not wake the loop again and again, and is read later.
    read_end, write_end = os.pipe()
    stream = FdReceiveStream(read_end)
    try:
        with anyio.move_on_after(0.05):
            await stream.receive()  # registers the descriptor, then gives up
        os.write(write_end, b"later\n")
        # the loop sees it readable once, with nobody waiting, and lets go
        await eventually_async(lambda: stream._loop is None, what="the loop letting go of the descriptor")
        assert await stream.receive() == b"later\n"
    finally:
        await stream.aclose()
        os.close(write_end)


async def test_after_a_short_read_the_next_read_waits_for_data_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import drawbridge.gateway.transports.process_stdio as process_stdio

    reads: list[int] = []
    real_read = os.read

    def counting_read(fd: int, size: int) -> bytes:
        reads.append(fd)
        return real_read(fd, size)

    read_end, write_end = os.pipe()
    stream = FdReceiveStream(read_end)
    monkeypatch.setattr(process_stdio.os, "read", counting_read)
    try:
        os.write(write_end, b"x" * 150)
        assert await stream.receive(100) == b"x" * 100  # a full read: more may be there
        assert await stream.receive(100) == b"x" * 50  # read at once, without waiting
        assert len(reads) == 2
        got: list[bytes] = []

        async def reader() -> None:
            got.append(await stream.receive(100))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.wait_all_tasks_blocked()
            assert len(reads) == 2  # the pipe is empty: no read that could only fail
            os.write(write_end, b"next")
        assert got == [b"next"] and len(reads) == 3
    finally:
        await stream.aclose()
        os.close(write_end)


async def test_lines_written_since_the_last_read_are_taken_without_waiting() -> None:
    script = "import sys, time; print('one', flush=True); time.sleep(0.3); print('two', flush=True); time.sleep(0.3)"
    upstream = await UpstreamProcess.spawn([PYTHON, "-c", script], max_message_bytes=1 << 20)
    try:
        batches = upstream.line_batches()
        assert await batches.__anext__() == [b"one"]
        assert upstream.more_lines() == []  # nothing yet, and no waiting for it
        assert await eventually_async(upstream.more_lines, what="the second line") == [b"two"]
        with anyio.fail_after(scaled(5)):
            assert [batch async for batch in batches] == []  # then the end of its stdout
    finally:
        await upstream.aclose(grace=0)


async def test_a_read_that_must_not_wait_says_so() -> None:
    read_end, write_end = os.pipe()
    stream = FdReceiveStream(read_end)
    try:
        assert stream.receive_nowait(100) is None
        os.write(write_end, b"abc")
        assert stream.receive_nowait(100) == b"abc"
        os.close(write_end)
        assert stream.receive_nowait(100) == b""  # the end of the stream
    finally:
        await stream.aclose()
