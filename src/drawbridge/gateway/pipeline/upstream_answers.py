"""What the gateway changes in an upstream's answer to a tools/call before the agent sees it.

Invariant: an answer is passed on as it came, but for these rewrites, each recorded as what the agent
got. (0) An ``InputRequiredResult`` to a 2025-11-25 request, which cannot answer it, becomes an
internal error saying so. (1) An approved call that its upstream answers with an ``InputRequiredResult`` of its own:
the upstream's ``requestState`` is replaced by a continuation the gateway seals around it
(``approvals.request_states``), bound to the call and its approval, so that the call's own retry
runs without asking a person again and the upstream gets its state back unchanged; a state that
cannot be carried (not text, too large) ends the call with an internal error. (2) For a 2026-07-28
request, an error code that era forbids becomes the spec's (``protocol.hop.modern_error``), and so
does a code it defines that speaks of what the gateway wrote, not of what the agent sent (``passed``
names the others: ``protocol.hop.relayed_codes``).

Theory of operation. ``rewritten`` takes the answer as ``outcomes.outcome_of_response`` read it and
returns the new (outcome, error, code, body), or None when nothing changes; a body of None means
the gateway answers with the error instead (always ``INTERNAL_ERROR``). It is pure but for sealing the continuation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from drawbridge.gateway.pipeline.approvals.gate import ApprovalGate
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Verdict
from drawbridge.gateway.protocol.hop import modern_error
from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR

INPUT_REQUIRED_FOR_HANDSHAKE: Final = (
    "the upstream asks for input before it runs this call (a 2026-07-28 InputRequiredResult), which a "
    "2025-11-25 connection cannot answer; connect at 2026-07-28 to answer it"
)
CONTINUATION_UNSEALED: Final = (
    "the upstream asks for input after the call was approved, with a requestState the gateway cannot "
    "carry past the approval (not text, or too large); the call did not complete"
)

Rewritten = tuple[Outcome, str | None, int | None, Mapping[str, Any] | None]
"""(outcome, error, code, body): a body of None means the gateway answers with ``INTERNAL_ERROR``."""


def _continued(
    body: Mapping[str, Any], call: ToolCall, verdict: Verdict | None, approvals: ApprovalGate | None
) -> Rewritten | None:
    approval_id = (verdict.approval or {}).get("approval_id") if verdict is not None else None
    if approvals is None or not isinstance(approval_id, str):
        return None  # not approved by a person: its retries are decided as any call
    result = body["result"]
    upstream_state = result.get("requestState")
    token = None
    if upstream_state is None or isinstance(upstream_state, str):
        token = approvals.engine.continue_call(call, approval_id, upstream_state)
    if token is None:
        return Outcome.UPSTREAM_ERROR, CONTINUATION_UNSEALED, INTERNAL_ERROR, None
    return Outcome.INPUT_REQUIRED, None, None, {**body, "result": {**result, "requestState": token}}


def rewritten(
    body: Mapping[str, Any],
    outcome: Outcome,
    error: str | None,
    call: ToolCall,
    verdict: Verdict | None,
    approvals: ApprovalGate | None,
    *,
    passed: frozenset[int] = frozenset(),
) -> Rewritten | None:
    """The answer as the agent gets it, when it differs from the upstream's (module docstring)."""
    if outcome is Outcome.INPUT_REQUIRED and not call.modern:
        return outcome, INPUT_REQUIRED_FOR_HANDSHAKE, INTERNAL_ERROR, None
    if outcome is Outcome.INPUT_REQUIRED:
        return _continued(body, call, verdict, approvals)
    if outcome is Outcome.UPSTREAM_ERROR and call.modern and "error" in body:
        translated = modern_error(body["error"], passed=passed)
        if translated is not body["error"]:
            code = translated["code"]
            said = f"{error} (answered as {code}: the upstream's code cannot reach a 2026-07-28 agent as is)"
            return outcome, said, code, {**body, "error": translated}
    return None


__all__ = ["CONTINUATION_UNSEALED", "INPUT_REQUIRED_FOR_HANDSHAKE", "Rewritten", "rewritten"]
