"""``tools/call`` from an agent connection: the one method that is decided, handed whole to the call
pipeline.

Invariant: the session makes no decision of its own and forwards nothing here. The pipeline
(``pipeline.call``) decides the call, forwards it through the hub's resolver (``Gateway.resolve``),
records it and hands back its answer, which the session only writes out: the upstream's with the
per-hop parts rewritten, or the gateway's result or refusal as the pipeline wrote it. The one call
the session refuses itself is one its era cannot make: a 2026-07-28 call to a tool that runs only as a
task (-32602 ``TASK_ONLY_IN_MODERN``; not decided, recorded as an ``invalid_message`` incident).

Theory of operation. The pipeline reaches the agent through a ``Replier`` (``_CallReplier``): the
session answers the call itself, so nothing is delivered through it, but it offers the approval gate a
way to ask this agent in-band (``elicit``): a gateway-originated ``elicitation/create`` on the
session's own request ids, when the agent is of the handshake era, its connection can take requests,
and it declared form elicitation. Otherwise ``elicit`` is None, and the approval gate has what else
the pipeline's link offers (``pipeline.client_link``: a 2026-07-28 retry's ``requestState``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drawbridge.gateway.pipeline.call import Flight, GatewayError, GatewayResult, UpstreamAnswer
from drawbridge.gateway.pipeline.client_link import Elicit, in_band
from drawbridge.gateway.protocol.hop import MCP_DEFINED_CODES
from drawbridge.gateway.protocol.jsonrpc import INVALID_PARAMS
from drawbridge.gateway.protocol.methods import ELICIT
from drawbridge.gateway.protocol.tasks import TASK_ONLY_IN_MODERN
from drawbridge.gateway.serve.agents import NoBackChannel
from drawbridge.gateway.serve.downstream_session import (
    DownstreamSession,
    Inflight,
    error_response,
    result_response,
)


async def tools_call(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    """Handed to the pipeline whole (``pipeline.call``): it decides, forwards, records, answers. But a
    2026-07-28 call to a tool that runs only as a task, which that era's agents are not shown and the
    upstream would refuse (the gateway sends no task then), is refused at once (``protocol.tasks``)."""
    params = entry.message.params
    if entry.modern and isinstance(params, dict) and session.gateway.runs_only_as_task(params.get("name")):
        detail = "a 2026-07-28 tools/call to a tool that runs only as a task was refused"
        await session.gateway.incident("invalid_message", "client", detail, INVALID_PARAMS)
        return error_response(entry.message.id, INVALID_PARAMS, TASK_ONLY_IN_MODERN)
    flight = await session.gateway.pipeline.call(
        entry.message, agent=session.agent, version=entry.version, replier=_CallReplier(session, entry),
        resolver=session.gateway,
    )
    answer = flight.answer
    message_id = entry.message.id
    if isinstance(answer, UpstreamAnswer):  # its error already as the era allows (pipeline.upstream_answers)
        return session.answer(entry, answer.body, passed=MCP_DEFINED_CODES)
    if isinstance(answer, GatewayResult):
        assert message_id is not None
        return result_response(message_id, answer.result)
    assert isinstance(answer, GatewayError)
    return error_response(message_id, answer.code, answer.message)


def _elicit(session: DownstreamSession, entry: Inflight) -> Elicit | None:
    """How the approval stage may ask this agent in-band: a gateway-originated
    ``elicitation/create`` on this session's own request ids (the mechanism that relays an
    upstream's elicitation), when the agent declared elicitation (form or URL mode: ``InBand``)."""
    if entry.modern or not session.back_channel:
        return None
    related = entry.message.id

    async def ask(_call: Any, params: Mapping[str, Any]) -> Mapping[str, Any]:
        answer = await session.request(ELICIT, dict(params), related)
        result = answer.get("result")
        if "error" in answer or not isinstance(result, dict):
            raise NoBackChannel("the agent answered the approval question with an error")
        return result

    return in_band(ask, session.client_capabilities)


class _CallReplier:
    """The pipeline's ``Replier`` for one tools/call of a session: the session answers it itself (the
    pipeline's ``call`` returns the flight), so nothing is delivered here. ``session`` is how serve's
    forwarder (``forwarding.py``) knows whose call it sends."""

    __slots__ = ("entry", "session")

    def __init__(self, session: DownstreamSession, entry: Inflight) -> None:
        self.session = session
        self.entry = entry

    @property
    def session_id(self) -> str | None:
        return self.session.session_id

    def elicit(self, flight: Flight) -> Elicit | None:
        return _elicit(self.session, self.entry)

    def deliver(self, flights: Sequence[Flight]) -> None:
        return None


__all__ = ["tools_call"]
