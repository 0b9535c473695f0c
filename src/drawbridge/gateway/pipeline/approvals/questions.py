"""What the gateway puts to a person about an open approval, and what it tells the agent meanwhile.

Invariant: a question shows the person the call's arguments as ``approval.shown_arguments`` renders
them (secret-like values masked, long values cut, control and format characters escaped) and names
the agent, the tool, the policy's reason, the approval id and the time left (and, when the arguments
look like injected instructions, which findings say so). The agent's interim answer repeats no
argument value: it names the approval and how to retry. Both say that exactly one call is at stake.

Theory of operation. One form serves every in-band route: ``question_params`` is the
``elicitation/create`` params (form mode, ``settlement.REQUESTED_SCHEMA``) that a 2025-11-25 client
gets as a gateway-originated request and a 2026-07-28 client gets inside the
``InputRequiredResult`` (``input_required_result``, under ``INPUT_KEY``, with the ``requestState``
that ``approvals.request_states`` sealed). Without an in-band route, in non-blocking mode,
``pending`` answers the call at once with an ``isError`` result that a retry with the same
arguments redeems once an operator has decided.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from drawbridge.approval.shown_arguments import show_arguments
from drawbridge.gateway.pipeline.approvals.settlement import (
    REQUESTED_SCHEMA,
    Settlement,
    SettlementKind,
    clip,
)
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import REFUSAL_META_KEY, Action
from drawbridge.gateway.protocol.methods import ELICIT
from drawbridge.state.approvals import Approval
from drawbridge.state.sqlite import to_db_time

ARGUMENTS_HEADING: Final = "Arguments (values under secret-like keys masked):"
INPUT_KEY: Final = "drawbridge_approval"
"""Key of the approval question in ``inputRequests`` / ``inputResponses``."""

Elicit = Callable[[ToolCall, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""Ask the client in-band: given the call and the ``elicitation/create`` params, return the client's
``ElicitResult`` (``{"action": "accept"|"decline"|"cancel", "content": {...}}``)."""


def question_params(call: ToolCall, approval: Approval, now: datetime) -> dict[str, Any]:
    """``elicitation/create`` params (form mode) asking a person about this approval."""
    seconds = int(max(approval.remaining(now), timedelta(0)).total_seconds())
    message = (
        f"drawbridge: agent {clip(call.agent, 128)} asks to run tool {clip(call.tool, 256)}. "
        f"{clip(approval.reason)}. Approve this one call? (approval {approval.short_id}, open for "
        f"{seconds} s)"
    )
    if approval.injection_findings:
        message += " Warning: the arguments look like injected instructions (" + ", ".join(
            approval.injection_findings
        ) + ")."
    message += "\n" + ARGUMENTS_HEADING + "\n" + "\n".join(show_arguments(call.arguments).lines())
    return {"mode": "form", "message": message, "requestedSchema": dict(REQUESTED_SCHEMA)}


def input_required_result(
    call: ToolCall, approval: Approval, request_state: str, now: datetime
) -> dict[str, Any]:
    """The ``InputRequiredResult`` (2026-07-28) asking about ``approval``, carrying ``request_state``."""
    return {
        "resultType": "input_required",
        "inputRequests": {INPUT_KEY: {"method": ELICIT, "params": question_params(call, approval, now)}},
        "requestState": request_state,
    }


def pending(call: ToolCall, approval: Approval, now: datetime) -> Settlement:
    """The non-blocking answer: nothing ran; ask an operator, then retry with the same arguments."""
    seconds = int(approval.remaining(now).total_seconds())
    retry = (
        f"Approval required (id: {approval.id}). Tool {clip(call.tool, 256)} needs a person's approval "
        f"({clip(approval.reason)}). Nothing was run. Ask an operator to approve it (for example "
        f"`drawbridge approvals approve {approval.short_id}`), then call {clip(call.tool, 256)} again "
        f"with exactly the same arguments. The approval expires in {seconds} s and lets one call through."
    )
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": retry}],
        "isError": True,
        "_meta": {
            REFUSAL_META_KEY: {
                "action": str(Action.HUMAN_APPROVAL),
                "outcome": "approval_pending",
                "approval_id": approval.id,
                "expires_at": to_db_time(approval.expires_at),
            }
        },
    }
    if call.modern:
        result["resultType"] = "complete"
    return Settlement(
        SettlementKind.PENDING, "pending", retry, approval_id=approval.id, retry=retry, result=result
    )


__all__ = ["ARGUMENTS_HEADING", "INPUT_KEY", "Elicit", "input_required_result", "pending", "question_params"]
