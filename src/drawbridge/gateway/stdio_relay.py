"""The stdio relay: an MCP server to the agent, an MCP client's pipe to the real server.

Invariant: every request the agent sends gets exactly one response, and that response is either the
upstream's own line, byte for byte, or an error or refusal written by the gateway; never both, never
none while the gateway runs. Only ``tools/call`` is decided; every other message, in both directions,
is passed on as the exact bytes received.

Theory of operation. Two loops run concurrently. The client loop frames the agent's stdin into lines,
parses each strictly (``jsonrpc.parse_client_message``) and either answers it (bad input), forwards it
(everything but tools/call), or starts a call task (tools/call). The upstream loop frames the child's
stdout, forwards server requests and notifications to the agent, and matches responses to the
``pending`` table, keyed by the agent's request id.

Ids. The relay rewrites no id in either direction. Requests from the agent keep their ids, so a
response from the upstream goes back unchanged; requests from the upstream (sampling, elicitation,
roots, ping) keep the upstream's ids, and the agent's responses to them go back unchanged. The two id
spaces never meet: JSON-RPC ids are scoped to the side that sends the request. The gateway itself
originates one kind of request: ``elicitation/create`` to the agent, asking a person to approve a
call (``request_client``). Those use an id space of their own, strings
``drawbridge-approval-<random>-<n>`` with a random part drawn per relay, so the upstream cannot
predict them; the agent's answers to them are consumed by the gateway and never forwarded, and an
upstream request that carries such an id is refused rather than relayed.

The one message the relay rewrites is a 2026-07-28 tools/call retry that carries the gateway's own
``requestState`` (``client_link``): it is forwarded without ``requestState`` and ``inputResponses``,
which answer the gateway's question, not the upstream's.

A pending entry is taken (removed from the table) by whoever answers first: the upstream loop (the
response arrived), the call task (a refusal, a timeout), the cancel handler (the agent gave up), or the
crash handler (the upstream exited). Whoever takes it writes the one response, if any; everyone else
sees it gone. The event loop is single-threaded and taking involves no await, so there is no race.

Call tasks. A tools/call gets its own task so that a slow decision never holds up other traffic. The
task asks the decider, then refuses, or forwards the original line and waits for the response with the
call timeout. On timeout the agent gets ``UPSTREAM_TIMEOUT`` and the upstream gets
``notifications/cancelled`` for the id. At the end the task gives the recorder one ``CallRecord`` and
only then writes the call's answer (the upstream's line, a refusal or an error), so every record
reaches the OS before the agent is answered.

Inline calls. When the decider can decide without waiting (``decide_now``, as the policy engine
does; it returns None for a call it must wait for, which then gets a call task) and the recorder
can record without waiting (``record_now``, as the evidence recorder does; it may hand back an
awaitable for the rest, an fsync, which the answer then waits for in a task of its own), a
tools/call needs no task: the client loop decides it, refuses it or queues its line, and whoever
settles it afterwards -- the upstream loop with the response, the cancel handler, the crash
handler, the shutdown, or the timeout watch -- records it and then writes its answer, in that
order, exactly as the call task would have.

Batches. What arrives in one read is handled together. The lines of the inline calls decided
from one read of the client go to the upstream in one write, at the end of that read (or sooner,
before any other line the upstream must see after them); when the pipe cannot take them at once,
a task waits for it while the client loop goes on reading. The inline calls answered in one read
of the upstream, and in what it wrote while they were handled (up to 64 calls), are recorded
together (one write per evidence file) and then answered in one write (or sooner, before any
other line the agent must see after them).
The timeout watch is one task for all inline calls: they share one timeout, so their deadlines
arrive in the order they were sent.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup

from drawbridge.gateway.client_link import (
    ClientLink,
    declares_form_elicitation,
    forwardable_params,
    is_gateway_retry,
    linked,
    retry_link,
)
from drawbridge.gateway.jsonrpc import (
    EVIDENCE_UNWRITTEN,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RESULT_WITHHELD,
    UPSTREAM_EXITED,
    UPSTREAM_TIMEOUT,
    IdKey,
    Kind,
    LineFramer,
    LineRefusal,
    Message,
    MessageError,
    Oversize,
    encode_line,
    error_line,
    id_key,
    notification_line,
    oversize_message,
    parse_upstream_message,
    read_client_line,
    result_line,
    valid_id,
)
from drawbridge.gateway.pipeline import (
    RECORDING_FAILED as RECORDING_FAILED,  # re-exported: the text of that refusal
)
from drawbridge.gateway.pipeline import (
    CallRecord,
    Decider,
    Outcome,
    Recorder,
    RelayEvent,
    RelayIncident,
    ToolCall,
    Verdict,
    guarded_decision,
    guarded_decision_now,
    parse_tool_call,
    refusal_for,
    refusal_result,
    requested_tool_name,
)
from drawbridge.gateway.relay_requests import (
    TOOLS_CALL,
    OwnRequest,
    Pending,
    RelayConfig,
    looks_like_tools_call,
    outcome_of_response,
)
from drawbridge.gateway.upstream import EnvFilter, UpstreamGone, UpstreamProcess

logger = logging.getLogger("drawbridge.gateway")

CANCELLED: Final = "notifications/cancelled"
READ_CHUNK: Final = 65536
MAX_ANSWERED_TOGETHER: Final = 64
RECORD_TIMEOUT_SECONDS: Final = 5.0
SETTLE_SECONDS: Final = RECORD_TIMEOUT_SECONDS + 1.0
OWN_ID_PREFIX: Final = "drawbridge-approval-"
"""Ids of the requests the gateway itself sends the agent start with this, then a per-relay random part."""


class ClientRequestFailed(Exception):
    """A gateway-originated request to the agent got an error, or no answer (the agent is gone)."""


class StdioRelay:
    def __init__(
        self,
        upstream: UpstreamProcess,
        client_in: ByteReceiveStream,
        client_out: ByteSendStream,
        *,
        decide: Decider,
        record: Recorder,
        config: RelayConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.upstream = upstream
        self.config = config or RelayConfig()
        self._client_in = client_in
        self._client_out = client_out
        self._decide = decide
        self._record_hook = record
        self._clock = clock
        # Inline calls (see the module docstring) when both hooks can work without waiting.
        decide_now = getattr(decide, "decide_now", None)
        record_now = getattr(record, "record_now", None)
        self._decide_now: Callable[[ToolCall], Verdict | None] | None = decide_now if callable(decide_now) else None
        self._record_now: Callable[[Sequence[RelayEvent]], Awaitable[None] | None] | None = (
            record_now if callable(record_now) else None
        )
        self._inline = self._decide_now is not None and self._record_now is not None
        self._to_send: list[Pending] = []
        """Inline calls decided from the client's last read, whose lines go to the upstream together."""
        self._timed: dict[Pending, None] = {}
        """Inline calls waiting for the upstream, in the order they were sent (= deadline order)."""
        self._watch_wake: anyio.Event | None = None
        self._out_lock = anyio.Lock(fast_acquire=True)
        send_now = getattr(client_out, "send_nowait", None)
        self._client_send_now: Callable[[bytes], int] | None = send_now if callable(send_now) else None
        self._pending: dict[IdKey, Pending] = {}
        self._upstream_gone: str | None = None
        self._upstream_done = anyio.Event()
        self._client_gone = False
        self._client_scope: anyio.CancelScope | None = None
        self._calls: TaskGroup | None = None
        self._record_failed = False
        self._session_version: str | None = None
        self._closing = False
        self._listed: set[str] = set()
        self._client_capabilities: Any = None
        self._own_prefix = f"{OWN_ID_PREFIX}{secrets.token_hex(6)}-"
        self._own_seq = 0
        self._own: dict[IdKey, OwnRequest] = {}

    # ------------------------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Relay until the agent closes its end, then stop the upstream. Returns when both are done."""
        async with anyio.create_task_group() as outer:
            outer.start_soon(self._upstream_loop)
            if self._inline:
                outer.start_soon(self._watch_deadlines)
            try:
                async with anyio.create_task_group() as calls:
                    self._calls = calls
                    with anyio.CancelScope() as scope:
                        self._client_scope = scope
                        await self._client_loop()
                    await self._shutdown()
                    # Every request is settled; call tasks only have to record. Bound that too.
                    calls.cancel_scope.deadline = anyio.current_time() + SETTLE_SECONDS
            finally:
                self._calls = None
                with anyio.CancelScope(shield=True):
                    await self.upstream.aclose(grace=0 if self._upstream_done.is_set() else 0.5)
                outer.cancel_scope.cancel()

    async def _shutdown(self) -> None:
        """The agent is gone: let the upstream exit on its own, settle what is pending, stop the child."""
        self._closing = True
        with anyio.move_on_after(self.config.shutdown_grace):
            # Calls still being decided were sent before the agent closed its end: as with the server
            # itself, they are forwarded (or refused) before the upstream hears the end of input.
            while any(p.call is not None and not p.forwarded and not p.finished for p in self._pending.values()):
                await anyio.sleep(0.005)
            await self._send_decided()
            # Bounded: closing waits for a write in progress, which a child that stopped reading blocks.
            await self.upstream.close_stdin()
            await self._upstream_done.wait()
        for pending in list(self._pending.values()):
            if self._take(pending):
                pending.finish(Outcome.CANCELLED, "the agent closed the connection before an answer")
                await self._settled(pending)

    # ----------------------------------------------------------------------------------- writing

    async def _to_client(self, data: bytes) -> None:
        """Write to the agent. Lines never interleave: a write that cannot finish at once holds the
        lock while it waits, and nobody writes without it while it is held. When it is free, what
        the pipe takes now is written without it (no await, so nobody can come in between)."""
        if self._client_gone:
            return
        try:
            if self._client_send_now is not None and not self._out_lock.locked():
                written = self._client_send_now(data)
                if written == len(data):
                    return
                data = data[written:]
            async with self._out_lock:
                await self._client_out.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._client_gone = True
            logger.warning("the agent's end of the connection is closed; shutting down")
            if self._client_scope is not None:
                self._client_scope.cancel()

    async def _to_upstream(self, data: bytes) -> bool:
        """Write to the upstream; False if it cannot be written (the upstream loop then sees it end).
        Inline calls decided earlier go first, so the upstream sees lines in the client's order."""
        if self._to_send:
            await self._send_decided()
        try:
            await self.upstream.send(data)
        except UpstreamGone as exc:
            await self._incident("upstream_unwritable", "upstream", str(exc))
            return False
        return True

    def _take(self, pending: Pending) -> bool:
        key = pending.message.key
        assert key is not None
        if self._pending.get(key) is pending:
            del self._pending[key]
            return True
        return False

    async def _respond(self, pending: Pending, line: bytes) -> None:
        """Answer a request: a tools/call's answer waits for its record (the call task sends it after
        recording); any other answer goes out now."""
        if pending.call is not None:
            pending.response = line
        else:
            await self._to_client(line)

    def _note_listed(self, result: Any) -> None:
        """Remember the tool names an upstream listed (the identity the truth carriers report)."""
        tools = result.get("tools") if isinstance(result, dict) else None
        if isinstance(tools, list):
            for tool in tools:
                name = tool.get("name") if isinstance(tool, dict) else None
                if isinstance(name, str):
                    self._listed.add(name)

    # ---------------------------------------------------------------------------------- recording

    async def _record(self, event: RelayEvent) -> None:
        try:
            with anyio.fail_after(RECORD_TIMEOUT_SECONDS):
                await self._record_hook(event)
        except Exception as exc:  # noqa: BLE001 -- any recorder failure is reported the same way
            self._record_failed = True
            logger.error("recording an event failed (%s); later tools/call requests are refused", type(exc).__name__)

    def _record_inline(self, events: Sequence[RelayEvent]) -> Awaitable[None] | None:
        """``_record`` through the recorder's synchronous form (inline calls), several at once. Returns
        what is left to await when the recorder says the records complete later (a batch fsync)."""
        assert self._record_now is not None
        try:
            return self._record_now(events)
        except Exception as exc:  # noqa: BLE001 -- any recorder failure is reported the same way
            self._record_failed = True
            logger.error("recording an event failed (%s); later tools/call requests are refused", type(exc).__name__)
            return None

    async def _await_record(self, rest: Awaitable[None]) -> None:
        try:
            with anyio.fail_after(RECORD_TIMEOUT_SECONDS):
                await rest
        except Exception as exc:  # noqa: BLE001 -- any recorder failure is reported the same way
            self._record_failed = True
            logger.error("recording an event failed (%s); later tools/call requests are refused", type(exc).__name__)

    async def _answer_when_recorded(self, rest: Awaitable[None], pendings: list[Pending]) -> None:
        await self._await_record(rest)
        await self._answer_recorded(*pendings)

    async def _answer_recorded(self, *pendings: Pending) -> None:
        """Send recorded calls' answers (one write); nothing that ran is answered without evidence:
        when recording has failed, a forwarded call's result is withheld (the agent is told why)."""
        out = []
        for pending in pendings:
            response = pending.response
            if self._record_failed and pending.forwarded:
                response = error_line(pending.message.id, EVIDENCE_UNWRITTEN, RESULT_WITHHELD)
            if response is not None:
                out.append(response)
        if out:
            await self._to_client(b"".join(out))

    async def _incident(self, kind: str, direction: str, detail: str, code: int | None = None) -> None:
        logger.warning("%s (%s): %s", kind, direction, detail)
        await self._record(RelayIncident(kind, direction, detail, code))

    # ----------------------------------------------------------------------------- client -> upstream

    async def _client_loop(self) -> None:
        framer = LineFramer(self.config.max_message_bytes)
        while True:
            try:
                chunk = await self._client_in.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
            for item in framer.feed(chunk):
                await self._on_client_line(item)
            if self._to_send:
                await self._send_decided()
        last = framer.close()
        if last is not None:
            await self._on_client_line(last)
        await self._send_decided()

    async def _on_client_line(self, item: bytes | Oversize) -> None:
        message = read_client_line(item)
        if isinstance(message, LineRefusal):
            await self._incident(message.kind, "client", message.detail, message.code)
            if message.reply is not None:
                await self._to_client(message.reply)
            return
        if message.kind is Kind.RESPONSE:
            if self._own_response(message):
                return
            if self._upstream_gone is None:
                await self._to_upstream(item + b"\n")
        elif message.kind is Kind.NOTIFICATION:
            await self._on_client_notification(message)
        else:
            await self._on_client_request(message)

    async def _on_client_notification(self, message: Message) -> None:
        method = message.method
        assert method is not None
        if method == TOOLS_CALL or looks_like_tools_call(method):
            await self._incident(
                "tools_call_notification", "client", "a tools/call without an id was dropped (it cannot be answered)"
            )
            return
        if method == CANCELLED and await self._cancel_from_client(message):
            return
        if self._upstream_gone is None:
            await self._to_upstream(message.raw + b"\n")

    async def _cancel_from_client(self, message: Message) -> bool:
        """Settle a cancelled request; True if the upstream must not hear of it (it never saw it)."""
        params = message.params
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if not valid_id(request_id):
            return False
        pending = self._pending.get(id_key(request_id))
        if pending is None or not self._take(pending):
            return False
        if pending.inline and pending in self._to_send:  # decided, but its line is not handed over yet
            self._to_send.remove(pending)
            pending.forwarded = False
        pending.finish(Outcome.CANCELLED, "the agent cancelled the request")
        await self._settled(pending)
        return not pending.forwarded

    async def _on_client_request(self, message: Message) -> None:
        key = message.key
        method = message.method
        assert key is not None and method is not None
        if key in self._pending:
            detail = f"request id {message.id!r} is already in use by a request in flight; the duplicate was dropped"
            await self._incident("duplicate_id", "client", detail, INVALID_REQUEST)
            await self._to_client(error_line(None, INVALID_REQUEST, f"invalid request: {detail}"))
            return
        if looks_like_tools_call(method):
            detail = "method not found: the method is not exactly 'tools/call' and is refused"
            await self._incident("invalid_message", "client", detail, METHOD_NOT_FOUND)
            await self._to_client(error_line(message.id, METHOD_NOT_FOUND, detail))
            return
        pending = Pending(message, method, self._clock())
        if method == TOOLS_CALL:
            await self._start_call(pending)
            return
        if method == "initialize" and isinstance(message.params, dict):
            self._client_capabilities = message.params.get("capabilities")
        if self._upstream_gone is not None:
            await self._to_client(error_line(message.id, UPSTREAM_EXITED, f"{self._upstream_gone}; {method} was not sent"))
            return
        self._pending[key] = pending
        pending.forwarded = True
        if not await self._to_upstream(message.raw + b"\n") and self._take(pending):
            await self._to_client(error_line(message.id, UPSTREAM_EXITED, f"the upstream is gone; {method} was not sent"))

    # --------------------------------------------------------------------------------- tools/call

    async def _start_call(self, pending: Pending) -> None:
        if is_gateway_retry(pending.message.params):
            # The gateway's requestState and the answers beside it are for the gateway: verified by
            # the decider, never forwarded (module docstring).
            params = pending.message.params
            pending.link = retry_link(params)
            body = {**pending.message.body, "params": forwardable_params(params)}
            pending.message = dataclasses.replace(pending.message, raw=encode_line(body)[:-1], body=body)
        message = pending.message
        try:
            pending.call = parse_tool_call(message, self.config.agent, self._session_version)
        except MessageError as exc:
            await self._record(
                CallRecord(
                    agent=self.config.agent,
                    request_id=message.id,  # type: ignore[arg-type]
                    tool=requested_tool_name(message),
                    action=None,
                    reason=None,
                    provenance=None,
                    outcome=Outcome.INVALID,
                    error=exc.message,
                    error_code=exc.code,
                    decision_ms=None,
                    latency_ms=(self._clock() - pending.started) * 1000.0,
                    protocol_version=self._session_version,
                )
            )
            await self._to_client(error_line(message.id, exc.code, exc.message))
            return
        key = message.key
        assert key is not None and self._calls is not None
        self._pending[key] = pending
        if self._inline and pending.link is None:
            verdict = self._decide_inline(pending.call)
            if verdict is not None:
                pending.inline = True
                await self._run_inline(pending, verdict)
                return
        pending.done = anyio.Event()
        self._calls.start_soon(self._run_call, pending)

    async def _decide_guarded(self, call: ToolCall) -> Verdict:
        refuse = self._record_failed and self.config.refuse_after_record_failure
        return await guarded_decision(self._decide, call, refuse=refuse)

    def _decide_inline(self, call: ToolCall) -> Verdict | None:
        """``_decide_guarded`` through the decider's synchronous form: the same guards. None: the
        decider cannot decide this call without waiting, and a call task will await it."""
        assert self._decide_now is not None
        refuse = self._record_failed and self.config.refuse_after_record_failure
        return guarded_decision_now(self._decide_now, call, refuse=refuse)

    async def _run_inline(self, pending: Pending, verdict: Verdict) -> None:
        """Refuse a tools/call decided just now, or hand its line to the upstream, without a task.

        Nothing here awaits before the call is either settled or handed over, so nobody else can
        settle it in between; from then on it is completed by whoever settles it (``_settled``).
        """
        call = pending.call
        assert call is not None
        pending.verdict = verdict
        pending.decided_at = self._clock()
        refusal = refusal_for(verdict)
        if refusal is not None:
            if self._take(pending):
                pending.response = result_line(call.request_id, refusal_result(verdict, refusal, call))
                pending.finish(refusal.outcome, refusal.reason)
                await self._complete(pending)
            return
        if self._upstream_gone is not None:
            if self._take(pending):
                pending.end_unsent(f"{self._upstream_gone}; the call was not sent")
                await self._complete(pending)
            return
        pending.forwarded = True
        pending.deadline = time.monotonic() + self.config.call_timeout
        self._timed[pending] = None
        self._to_send.append(pending)
        if self._watch_wake is not None:
            self._watch_wake.set()

    async def _send_decided(self) -> None:
        """Hand the lines of the inline calls decided since the last time to the upstream, in one write.

        A call settled meanwhile (cancelled by the agent) is not sent. When the pipe cannot take the
        lines now (it is full, or another write is waiting), a task of their own waits for it, so the
        client loop goes on reading (cancellations, the agent closing); the upstream's write lock
        keeps the order. When the upstream is gone, the calls are answered that they were not sent.
        """
        batch = [pending for pending in self._to_send if not pending.finished]
        self._to_send = []
        if not batch:
            return
        data = b"".join([pending.message.raw + b"\n" for pending in batch])
        try:
            if self.upstream.send_nowait(data):
                return
        except UpstreamGone as exc:
            await self._not_sent(batch, exc)
            return
        assert self._calls is not None
        self._calls.start_soon(self._send_waiting, batch, data)

    async def _send_waiting(self, batch: list[Pending], data: bytes) -> None:
        try:
            await self.upstream.send(data)
        except UpstreamGone as exc:
            await self._not_sent(batch, exc)

    async def _not_sent(self, batch: list[Pending], exc: UpstreamGone) -> None:
        await self._incident("upstream_unwritable", "upstream", str(exc))
        unsent = []
        for pending in batch:
            if self._take(pending):
                pending.end_unsent("the upstream is gone; the call was not sent")
                unsent.append(pending)
        await self._complete(*unsent)

    async def _settled(self, pending: Pending) -> None:
        """Called by whoever took and finished a request: an inline call is completed now."""
        if pending.inline:
            await self._complete(pending)

    async def _complete(self, *pendings: Pending) -> None:
        """Record inline calls, then answer them (evidence first), each once; several together get
        one write per evidence file and one write of their answers."""
        todo = [pending for pending in pendings if not pending.completed]
        if not todo:
            return
        for pending in todo:
            pending.completed = True
            self._timed.pop(pending, None)
        rest = self._record_inline([self._call_record(p, p.verdict, p.decided_at) for p in todo])
        if rest is not None:
            # The records wait for a batch fsync: their answers wait with them, in a task, so that
            # whoever settled the calls goes on serving the others meanwhile.
            if self._calls is not None:
                self._calls.start_soon(self._answer_when_recorded, rest, todo)
                return
            await self._await_record(rest)
        await self._answer_recorded(*todo)

    async def _watch_deadlines(self) -> None:
        """Time out inline calls the upstream does not answer within the call timeout."""
        while True:
            if not self._timed:
                self._watch_wake = anyio.Event()
                await self._watch_wake.wait()
                self._watch_wake = None
                continue
            pending = next(iter(self._timed))
            assert pending.deadline is not None
            delay = pending.deadline - time.monotonic()
            if delay > 0:
                # Every later entry has a later deadline; one settled meanwhile is skipped on waking.
                await anyio.sleep(delay)
                continue
            del self._timed[pending]
            if pending.finished or not self._take(pending):
                continue
            call = pending.call
            assert call is not None
            detail = f"the upstream did not answer tools/call within {self.config.call_timeout:g} seconds"
            pending.response = error_line(call.request_id, UPSTREAM_TIMEOUT, detail)
            pending.finish(Outcome.TIMEOUT, detail, UPSTREAM_TIMEOUT)
            if self._upstream_gone is None:
                await self._to_upstream(
                    notification_line(CANCELLED, {"requestId": call.request_id, "reason": "gateway timeout"})
                )
            await self._complete(pending)

    async def _run_call(self, pending: Pending) -> None:
        """A call task: decide, act, wait, then record and answer."""
        call = pending.call
        assert call is not None and pending.done is not None
        verdict: Verdict | None = None
        decided_at: float | None = None
        with anyio.CancelScope() as scope:
            pending.wait_scope = scope
            if not pending.finished:
                with linked(self._link(pending)):
                    verdict = await self._decide_guarded(call)
                decided_at = self._clock()
        pending.wait_scope = None
        if verdict is not None and not pending.finished:
            await self._act(pending, verdict)
        await pending.done.wait()
        # Evidence first: the record reaches the OS before the agent sees the answer.
        await self._record(self._call_record(pending, verdict, decided_at))
        await self._answer_recorded(pending)

    async def _act(self, pending: Pending, verdict: Verdict) -> None:
        call = pending.call
        assert call is not None
        message = pending.message
        refusal = refusal_for(verdict)
        if refusal is not None:
            if self._take(pending):
                pending.response = result_line(call.request_id, refusal_result(verdict, refusal, call))
                pending.finish(refusal.outcome, refusal.reason)
            return
        if self._upstream_gone is not None:
            if self._take(pending):
                pending.end_unsent(f"{self._upstream_gone}; the call was not sent")
            return
        pending.forwarded = True
        sent = False
        with anyio.CancelScope() as scope:
            # Cancelling this scope never tears a line: the write either has not started (waiting for the
            # lock) or is already buffered whole in the pipe transport (anyio on asyncio writes, then drains).
            pending.wait_scope = scope
            sent = await self._to_upstream(message.raw + b"\n")
            if sent:
                assert pending.done is not None
                with anyio.move_on_after(self.config.call_timeout):
                    await pending.done.wait()
        pending.wait_scope = None
        if not sent and not pending.finished:
            if self._take(pending):
                pending.end_unsent("the upstream is gone; the call was not sent")
            return
        if not pending.finished and self._take(pending):
            detail = f"the upstream did not answer tools/call within {self.config.call_timeout:g} seconds"
            pending.response = error_line(call.request_id, UPSTREAM_TIMEOUT, detail)
            pending.finish(Outcome.TIMEOUT, detail, UPSTREAM_TIMEOUT)
            if self._upstream_gone is None:
                await self._to_upstream(
                    notification_line(CANCELLED, {"requestId": call.request_id, "reason": "gateway timeout"})
                )

    def _call_record(self, pending: Pending, verdict: Verdict | None, decided_at: float | None) -> CallRecord:
        call = pending.call
        assert call is not None and pending.outcome is not None
        finished = pending.finished_at if pending.finished_at is not None else self._clock()
        return CallRecord(
            agent=call.agent,
            request_id=call.request_id,
            tool=call.tool,
            action=verdict.action if verdict is not None else None,
            reason=verdict.reason if verdict is not None else None,
            provenance=verdict.provenance if verdict is not None else None,
            outcome=pending.outcome,
            error=pending.error,
            error_code=pending.error_code,
            decision_ms=(decided_at - pending.started) * 1000.0 if decided_at is not None else None,
            latency_ms=(finished - pending.started) * 1000.0,
            protocol_version=call.protocol_version,
            call=call,
            tool_listed=call.tool in self._listed,
            approval=verdict.approval if verdict is not None else None,
        )

    # ------------------------------------------------------------------- the gateway's own requests

    def _is_own_id(self, request_id: Any) -> bool:
        return isinstance(request_id, str) and request_id.startswith(self._own_prefix)

    def _own_response(self, message: Message) -> bool:
        """Consume the agent's answer to a request the gateway sent; True if it was one (even a late one)."""
        if not self._is_own_id(message.id):
            return False
        key = message.key
        request = self._own.pop(key, None) if key is not None else None
        if request is not None:
            request.body = message.body
            request.done.set()
        return True

    async def request_client(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send the agent a request of the gateway's own and wait for its answer (the response body).

        Raises ``ClientRequestFailed`` when the agent is gone or closes before answering. A cancelled
        wait tells the agent (``notifications/cancelled``) that the answer is no longer wanted.
        """
        if self._client_gone or self._closing:
            raise ClientRequestFailed("the agent's connection is closing")
        self._own_seq += 1
        request_id = f"{self._own_prefix}{self._own_seq}"
        key = id_key(request_id)
        request = OwnRequest()
        self._own[key] = request
        try:
            line = encode_line({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            await self._to_client(line)
            if self._client_gone:
                raise ClientRequestFailed("the agent's connection is closed")
            await request.done.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if self._own.pop(key, None) is not None:
                    await self._to_client(
                        notification_line(CANCELLED, {"requestId": request_id, "reason": "no longer needed"})
                    )
            raise
        finally:
            self._own.pop(key, None)
        assert request.body is not None
        return request.body

    async def _elicit(self, call: ToolCall, params: Any) -> Any:
        """Ask the agent in-band (``elicitation/create``); its ``ElicitResult``, or raise."""
        body = await self.request_client("elicitation/create", dict(params))
        result = body.get("result")
        if "error" in body or not isinstance(result, dict):
            raise ClientRequestFailed("the agent answered the approval question with an error")
        return result

    def _link(self, pending: Pending) -> ClientLink:
        """What the decider may use to reach this call's agent (``client_link``)."""
        call = pending.call
        elicit = None
        if call is not None and not call.modern and declares_form_elicitation(self._client_capabilities):
            elicit = self._elicit
        link = pending.link
        if link is None:
            return ClientLink(elicit=elicit)
        return dataclasses.replace(link, elicit=elicit)

    # ----------------------------------------------------------------------------- upstream -> client

    async def _upstream_loop(self) -> None:
        answered: list[Pending] = []
        async for batch in self.upstream.line_batches():
            for item in batch:
                await self._on_upstream_line(item, answered)
            # Answers that came while these were handled join them (fewer writes per call).
            while answered and len(answered) < MAX_ANSWERED_TOGETHER:
                more = self.upstream.more_lines()
                if not more:
                    break
                for item in more:
                    await self._on_upstream_line(item, answered)
            await self._complete_answered(answered)
        await self._on_upstream_end()

    async def _complete_answered(self, answered: list[Pending]) -> None:
        if answered:
            pendings = tuple(answered)
            answered.clear()
            await self._complete(*pendings)

    async def _on_upstream_line(self, item: bytes | Oversize, answered: list[Pending]) -> None:
        """Relay one line from the upstream. An inline call it answers joins ``answered``, to be
        completed with the others of the same read; anything else first completes those, so the
        agent receives lines in the upstream's order."""
        if isinstance(item, Oversize):
            await self._complete_answered(answered)
            await self._incident("upstream_oversize", "upstream", oversize_message(item))
            return
        try:
            message = parse_upstream_message(item)
        except MessageError as exc:
            await self._complete_answered(answered)
            await self._incident("upstream_garbage", "upstream", f"a line from the upstream was dropped: {exc.message}")
            return
        if message.kind is not Kind.RESPONSE:
            await self._complete_answered(answered)
            if message.kind is Kind.REQUEST and self._is_own_id(message.id):
                detail = "a request from the upstream used an id of the gateway's own id space; refused"
                await self._incident("invalid_message", "upstream", detail, INVALID_REQUEST)
                await self._to_upstream(error_line(message.id, INVALID_REQUEST, f"invalid request: {detail}"))
                return
            await self._to_client(item + b"\n")
            return
        key = message.key
        assert key is not None
        pending = self._pending.get(key)
        # Only a request the upstream was actually sent can be answered by it: a response for a call
        # still being decided (a guessable id) must not settle it.
        if pending is None or not pending.forwarded or not self._take(pending):
            await self._complete_answered(answered)
            await self._incident(
                "unknown_response",
                "upstream",
                f"a response for id {message.id!r}, which has no request in flight, was dropped",
            )
            return
        if pending.call is not None:
            # Held until the call is recorded (evidence first); a call task sends it itself.
            pending.response = item + b"\n"
            pending.finish(*outcome_of_response(message.body))
            if pending.inline:
                answered.append(pending)
            return
        await self._complete_answered(answered)
        await self._respond(pending, item + b"\n")
        if pending.method == "tools/list":
            self._note_listed(message.body.get("result"))
        if pending.method == "initialize":
            result = message.body.get("result")
            version = result.get("protocolVersion") if isinstance(result, dict) else None
            if isinstance(version, str):
                self._session_version = version
        pending.finish(Outcome.OK)

    async def _on_upstream_end(self) -> None:
        await self.upstream.wait_exit(0.5)
        self._upstream_gone = self.upstream.exit_description()
        self._upstream_done.set()
        stranded = [p for p in list(self._pending.values()) if self._take(p)]
        if self._closing and not stranded:
            logger.info("%s after the agent closed the connection", self._upstream_gone)
        else:
            await self._incident(
                "upstream_exited", "upstream", f"{self._upstream_gone}; {len(stranded)} request(s) in flight"
            )
        for pending in stranded:
            detail = f"{self._upstream_gone} before answering {pending.method}"
            await self._respond(pending, error_line(pending.message.id, UPSTREAM_EXITED, detail))
            pending.finish(Outcome.UPSTREAM_EXITED, detail, UPSTREAM_EXITED)
            await self._settled(pending)


async def run_relay(
    argv: list[str],
    client_in: ByteReceiveStream,
    client_out: ByteSendStream,
    *,
    decide: Decider,
    record: Recorder,
    config: RelayConfig | None = None,
    env_filter: EnvFilter | None = None,
    cwd: str | None = None,
) -> None:
    """Spawn the upstream and relay between it and the given client streams until the client closes."""
    config = config or RelayConfig()
    upstream = await UpstreamProcess.spawn(
        argv, env_filter=env_filter, cwd=cwd, max_message_bytes=config.max_upstream_message_bytes
    )
    relay = StdioRelay(upstream, client_in, client_out, decide=decide, record=record, config=config)
    await relay.run()


async def serve_stdio(
    argv: list[str],
    *,
    decide: Decider,
    record: Recorder,
    config: RelayConfig | None = None,
    env_filter: EnvFilter | None = None,
    cwd: str | None = None,
) -> None:
    """``drawbridge wrap``: relay between this process's stdin/stdout and the upstream command."""
    from drawbridge.gateway.process_stdio import process_stdio

    async with process_stdio() as (client_in, client_out):
        await run_relay(
            argv, client_in, client_out, decide=decide, record=record, config=config, env_filter=env_filter, cwd=cwd
        )

