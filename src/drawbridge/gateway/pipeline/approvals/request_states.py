"""The 2026-07-28 round trip: the ``InputRequiredResult`` that asks a person, and the retry that answers.

Invariant: a ``requestState`` lets at most one call through, the one it was sealed for (same
agent, tool and keyed argument digest), naming an approval of that call that a person approved,
under a key of this process (so a restart honours nothing issued before it). A forged, altered,
expired or mismatched state is refused and recorded (``approval_state_refused``); a state whose
approval was already used is refused as a replay; a retry whose answer says no does not run, even
when the approval was granted elsewhere first (and that approval is used up with it).

A continuation (``continue_call``) carries an approved call's own retries past the approval: when
the upstream answers the approved call with an ``InputRequiredResult`` of its own, its
``requestState`` is sealed inside a gateway state bound to the same agent, tool, argument digest
and approval, and a retry with it runs without asking again, its ``inputResponses`` and the
upstream's state going to the upstream unchanged. Each continuation works once (its nonce is
spent in this process), and only for the call that was approved.

Theory of operation. ``issue`` seals a state (``approval.request_state.seal``: agent, tool,
argument digest, approval id, expiry and a fresh nonce) into the question of
``questions.input_required_result``. ``settle_retry`` opens it, finds the approval it names, applies
the answer under ``questions.INPUT_KEY`` through ``Resolutions.resolve`` (channel ``elicitation``),
and claims the approval in the use ledger (``state.approval_uses``): the first claim runs the call,
a second finds it used.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from drawbridge.approval.channels import Channel, Strength, strength_of
from drawbridge.approval.request_state import (
    RequestStateError,
    check_key_ring,
    issued_here,
    open_state,
    seal,
    seal_continuation,
)
from drawbridge.gateway.pipeline.approvals.grants import Clock, TraceAppend
from drawbridge.gateway.pipeline.approvals.questions import INPUT_KEY, input_required_result
from drawbridge.gateway.pipeline.approvals.resolutions import Resolutions
from drawbridge.gateway.pipeline.approvals.settlement import (
    Settlement,
    clip,
    denied,
    interpret_answer,
    settlement_of,
)
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.state.approval_uses import ApprovalUses
from drawbridge.state.approvals import AlreadyResolved, Approval, ApprovalStatus, ApprovalStore
from drawbridge.state.ids import UnknownId
from drawbridge.state.sqlite import to_db_time

TRACE_STATE_REFUSED: Final = "approval_state_refused"


def new_nonce() -> str:
    """A fresh nonce per state, so two states for the same approval never have one byte form."""
    return secrets.token_urlsafe(18)


class RequestStates:
    """The ``requestState`` tokens one process issues and honours (module docstring)."""

    def __init__(
        self,
        store: ApprovalStore,
        uses: ApprovalUses,
        resolutions: Resolutions,
        trace_append: TraceAppend,
        *,
        clock: Clock,
        timeout_seconds: float,
        state_keys: bytes | Sequence[bytes] | None = None,
        nonce_source: Callable[[], str] = new_nonce,
    ) -> None:
        if state_keys is None:  # per process: states minted before a restart are refused, as they should be
            state_keys = [secrets.token_bytes(32)]
        elif isinstance(state_keys, (bytes, bytearray)):
            state_keys = [bytes(state_keys)]
        check_key_ring(state_keys)
        self._keys: Sequence[bytes] = list(state_keys)
        self._nonce = nonce_source
        self._store = store
        self._uses = uses
        self._resolutions = resolutions
        self._trace = trace_append
        self._clock = clock
        self._timeout_seconds = timeout_seconds
        self._spent: dict[str, datetime] = {}
        """Continuation nonces already used, until their expiry."""

    def issued_here(self, token: object) -> bool:
        """Whether ``token`` was sealed by this gateway (``request_state.issued_here``)."""
        return issued_here(self._keys, token)

    def continue_call(self, call: ToolCall, digest: str, approval_id: str, upstream_state: str | None) -> str:
        """The state that lets the approved ``call`` answer its upstream's own question (module
        docstring); raises ``ValueError`` when the upstream's state cannot be carried."""
        return seal_continuation(
            self._keys,
            agent=call.agent,
            tool=call.tool,
            args_digest=digest,
            approval_id=approval_id,
            expires_at=self._clock() + timedelta(seconds=self._timeout_seconds),
            nonce=self._nonce(),
            upstream_state=upstream_state,
        )

    async def _continued(
        self, approval_id: str, nonce: str, expires_at: datetime, operator_only: bool
    ) -> Settlement:
        """A verified continuation: the approval it names must have allowed the call (given by an
        operator, where only an operator may approve it now); the nonce is spent."""
        try:
            approval = await self._store.get(approval_id)
        except UnknownId:
            return denied("request_state invalid: unknown approval",
                          "the approval named in request_state is not in the queue")
        now = self._clock()
        self._spent = {n: exp for n, exp in self._spent.items() if exp > now}
        if operator_only and (approval.channel is None or strength_of(approval.channel) is not Strength.OPERATOR):
            return denied(
                "request_state invalid: operator only",
                f"approval {approval.short_id} was not given by an operator, and only an operator may approve "
                "this call now",
                approval_id=approval.id,
            )
        if not approval.permits or nonce in self._spent:
            return denied(
                "request_state invalid: replayed",
                f"approval {approval.short_id}: this request_state was already used; a request_state works once",
                approval_id=approval.id,
            )
        self._spent[nonce] = expires_at
        allowed = settlement_of(approval, self._timeout_seconds)
        return dataclasses.replace(
            allowed, how=f"{allowed.how}, continued",
            reason=f"{allowed.reason}; the call continues with the upstream's own question answered",
        )

    def issue(self, call: ToolCall, approval: Approval) -> dict[str, Any]:
        """The ``InputRequiredResult`` (2026-07-28) asking about ``approval``, sealed ``requestState``."""
        state = seal(
            self._keys,
            agent=approval.agent,
            tool=approval.tool,
            args_digest=approval.args_digest,
            approval_id=approval.id,
            expires_at=approval.expires_at,
            nonce=self._nonce(),
        )
        return input_required_result(call, approval, state, self._clock())

    async def settle_retry(
        self,
        call: ToolCall,
        digest: str,
        request_state: object,
        input_responses: Mapping[str, Any] | None,
        *,
        operator_only: bool = False,
    ) -> Settlement:
        """A retry of ``call`` (keyed argument digest ``digest``): verify, apply the answer, use it once."""
        now = self._clock()
        try:
            payload = open_state(
                self._keys, request_state, agent=call.agent, tool=call.tool, args_digest=digest, now=now
            )
        except RequestStateError as exc:
            await self._trace(
                TRACE_STATE_REFUSED,
                {"agent": call.agent, "tool": call.tool, "args_digest": digest, "problem": exc.code,
                 "at": to_db_time(now)},
            )
            return denied(f"request_state invalid: {exc.code}", str(exc))
        if payload.continuation:
            return await self._continued(payload.approval_id, payload.nonce, payload.expires_at, operator_only)
        try:
            approval = await self._store.get(payload.approval_id)
        except UnknownId:
            return denied("request_state invalid: unknown approval",
                          "the approval named in request_state is not in the queue")
        if (approval.agent, approval.tool, approval.args_digest) != (call.agent, call.tool, digest):
            return denied(
                "request_state invalid: mismatch", "request_state names an approval for another call"
            )

        answer = input_responses.get(INPUT_KEY) if isinstance(input_responses, Mapping) else None
        said_no: str | None = None
        if answer is not None:
            status, reason = interpret_answer(answer)
            if status is ApprovalStatus.DENIED:
                said_no = reason
            try:
                approval = await self._resolutions.resolve(
                    approval.id, status, f"mcp-client:{call.agent}", Channel.ELICITATION, reason
                )
            except AlreadyResolved as exc:
                approval = exc.approval
                await self._resolutions.ensure_recorded(approval)
        else:
            approval = await self._store.get(approval.id)
            await self._resolutions.ensure_recorded(approval)
        if approval.pending:
            return denied(
                "unanswered", f"approval {approval.short_id}: the retry carried no answer to the question"
            )
        if not await self._uses.claim(approval.id, at=self._clock()):
            return denied(
                "request_state invalid: replayed",
                f"approval {approval.short_id} was already used; a request_state works once",
                approval_id=approval.id,
            )
        if said_no is not None and approval.permits:
            # Approved elsewhere first, but the person at the client said no: this call does not run,
            # and the approval is now used, so no other call can ride on it either.
            return denied(
                f"denied via {Channel.ELICITATION}",
                f"approval {approval.short_id} was approved by {clip(approval.resolved_by, 128)}, but the "
                f"answer in the client was no ({said_no}); the call is refused",
                approval_id=approval.id, channel=Channel.ELICITATION, strength=Strength.CLIENT,
            )
        return settlement_of(approval, self._timeout_seconds)


__all__ = ["TRACE_STATE_REFUSED", "RequestStates", "new_nonce"]
