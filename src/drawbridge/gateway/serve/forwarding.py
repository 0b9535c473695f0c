"""serve's ``Forwarder``: a decided tools/call on its way to one upstream session, and back.

Invariant: what reaches the upstream is the request the pipeline decided, with only the per-hop parts
rewritten (``protocol.hop``): the namespace taken off the name, the progress token replaced by one
of the gateway's own, the agent's era envelope removed. While the call is in flight the hub knows
which agent it belongs to (``Gateway.track``), so the upstream's progress, sampling and elicitation
reach that agent and nobody else; the tables are cleared however the call ends.

A handshake-era agent's task-augmented call keeps its ``task`` when this upstream runs tool calls as
tasks (``protocol.tasks``): the upstream's ``CreateTaskResult`` is then held in the hub's task book
(``task_book.py``) as the line is read, before any later line of the upstream (its status
notifications) is routed, and the agent receives the gateway's task id; the call's progress token
stays routed to the agent until the task ends. A ``CreateTaskResult`` to a
call that was not sent as a task is not a ``CallToolResult``: it is answered as an upstream error.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from drawbridge.gateway.pipeline.call import CallPipeline, Flight
from drawbridge.gateway.protocol.hop import outbound_params, progress_token, relayed_codes
from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR, RequestId
from drawbridge.gateway.protocol.methods import TOOLS_CALL
from drawbridge.gateway.protocol.tasks import created_result, created_task, offers_task_calls
from drawbridge.gateway.serve.agents import AgentSession
from drawbridge.gateway.serve.task_book import HeldTask
from drawbridge.gateway.upstreams.requests import PendingCall, UpstreamLost, UpstreamUnavailable
from drawbridge.gateway.upstreams.session import UpstreamSession


class CallTables(Protocol):
    """The hub's tables of calls in flight, as a forwarder fills and clears them (``hub.Gateway``)."""

    def track(self, upstream: UpstreamSession, call: PendingCall, session: AgentSession, request_id: RequestId) -> None: ...

    def untrack(self, upstream: UpstreamSession, call: PendingCall) -> None: ...

    def new_progress_route(
        self, upstream: UpstreamSession, session: AgentSession, token: str | int, request_id: RequestId
    ) -> str: ...

    def drop_progress_route(self, upstream: UpstreamSession, gateway_token: str) -> None: ...

    def hold_task(
        self, upstream: UpstreamSession, session: AgentSession, flight: Flight, upstream_task_id: str, progress: str | None
    ) -> HeldTask: ...

    def drop_task(self, held: HeldTask) -> None: ...


@dataclass(eq=False, slots=True)
class _InFlight:
    call: PendingCall | None = None
    gateway_token: str | None = None
    task: bool = False
    """Sent with its task augmentation: the upstream may answer with a task."""


class UpstreamForwarder:
    """Forwards decided calls to one ``UpstreamSession`` (module docstring)."""

    def __init__(self, hub: CallTables, upstream: UpstreamSession, pipeline: CallPipeline) -> None:
        self._hub = hub
        self._upstream = upstream
        self._pipeline = pipeline

    def send(self, flight: Flight) -> Awaitable[None]:
        return self._send(flight)

    async def _send(self, flight: Flight) -> None:
        session: AgentSession = flight.replier.session  # type: ignore[attr-defined]
        assert flight.resolved is not None
        params: Any = flight.message.params
        state = _InFlight()
        flight.handle = state
        rewrite: dict[str, Any] = {"name": flight.resolved.route.tool, "agent_capabilities": self._upstream.modern}
        if flight.call is not None and not flight.call.modern and offers_task_calls(self._upstream.capabilities):
            state.task = rewrite["task"] = True
        token = progress_token(params)
        if token is not None:
            state.gateway_token = self._hub.new_progress_route(self._upstream, session, token, flight.request_id)
            rewrite["progress"] = state.gateway_token
        try:
            call = await self._upstream.send_request(TOOLS_CALL, outbound_params(params, **rewrite))
        except UpstreamUnavailable as exc:
            self._release(state)
            self._pipeline.lost(flight, f"{exc}; the call was not sent", sent=False)
            return
        except UpstreamLost as exc:
            self._release(state)
            self._pipeline.lost(flight, f"{exc} before answering tools/call")
            return
        state.call = call
        self._hub.track(self._upstream, call, session, flight.request_id)
        call.when_done(lambda ended: self._ended(flight, state, ended))

    def _ended(self, flight: Flight, state: _InFlight, call: PendingCall) -> None:
        progress, state.gateway_token = state.gateway_token, None
        self._release(state)
        try:
            body = call.outcome()
        except UpstreamLost as exc:
            self._dropped(progress)
            self._pipeline.lost(flight, f"{exc} before answering tools/call")
            return
        if call.unreadable is not None:  # its answer had to be dropped: an upstream error saying why
            self._dropped(progress)
            self._pipeline.unreadable(flight, call.unreadable)
            return
        result = body.get("result")
        task = created_task(result)
        held: HeldTask | None = None
        if task is not None and not state.task:
            body = {"error": {"code": INTERNAL_ERROR, "message": "the upstream answered with a task the call did not ask for"}}
        elif task is not None:
            session: AgentSession = flight.replier.session  # type: ignore[attr-defined]
            # The call's progress token stays the task's until it ends (the book drops it then).
            held = self._hub.hold_task(self._upstream, session, flight, task["taskId"], progress)
            progress = None
            body = {**body, "result": created_result(result, held.task_id)}  # type: ignore[arg-type]
        self._dropped(progress)
        passed = relayed_codes(capabilities=self._upstream.modern)  # its outbound_params(agent_capabilities=)
        if not self._pipeline.answered(flight, body, passed=passed) and held is not None:
            self._hub.drop_task(held)  # the call had ended (timed out, cancelled): nobody will ask for it

    def abandon(self, flight: Flight, reason: str, *, timed_out: bool) -> Awaitable[None] | None:
        state = flight.handle
        if not isinstance(state, _InFlight) or state.call is None:
            return None
        call = state.call
        self._release(state)
        return self._upstream.cancel(call, reason)

    def _dropped(self, gateway_token: str | None) -> None:
        if gateway_token is not None:
            self._hub.drop_progress_route(self._upstream, gateway_token)

    def _release(self, state: _InFlight) -> None:
        if state.call is not None:
            self._hub.untrack(self._upstream, state.call)
        if state.gateway_token is not None:
            self._hub.drop_progress_route(self._upstream, state.gateway_token)
            state.gateway_token = None


__all__ = ["UpstreamForwarder"]
