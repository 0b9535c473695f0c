"""How a ``human_approval`` call was settled, and how a person's answer is read.

Invariant: only an explicit approval approves. A client's elicitation answer approves only as
``accept`` with ``decision: approve``; a decline, a cancel, a form sent back without a choice, or an
answer of another shape reads as a denial. A decision named through a channel reads as approve or
deny, or is refused. A resolved approval becomes ``allow`` only when the queue says it permits the
call; a denial, a timeout, a restart or a question nobody could answer becomes ``deny``.

Theory of operation. ``Settlement`` is the engine's answer for one call (``approvals.engine``); its
``evidence()`` is the approval block that the decision record keeps. ``REQUESTED_SCHEMA`` is the form
the gateway puts to a person in-band, and ``interpret_answer`` reads what comes back from it, so
the form and its reading stay in one place. ``settlement_of`` turns a resolved approval into the
answer for the call that used it, naming who resolved it, through which channel, with which
strength. Every text taken from a request or a person passes ``clip`` (sanitized, capped) before
it reaches a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from drawbridge.approval.channels import Channel, Strength, strength_of
from drawbridge.canonical import sanitize
from drawbridge.state.approvals import (
    RESOLVED_BY_RESTART,
    RESOLVED_BY_TIMEOUT,
    RESOLVED_BY_UNANSWERABLE,
    Approval,
    ApprovalStatus,
)

if TYPE_CHECKING:
    from drawbridge.gateway.pipeline.verdicts import Verdict

DECISION_FIELD: Final = "decision"
APPROVE: Final = "approve"
DENY: Final = "deny"
REQUESTED_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        DECISION_FIELD: {
            "type": "string",
            "title": "Decision",
            "description": "approve runs this one call; deny refuses it",
            "enum": [APPROVE, DENY],
        },
        "reason": {"type": "string", "title": "Reason (optional)", "maxLength": 500},
    },
    "required": [DECISION_FIELD],
}
MAX_REASON_CHARS: Final = 500


def clip(text: str | None, limit: int = MAX_REASON_CHARS) -> str:
    """Text from a request or a person, fit for a message: sanitized and capped at ``limit``."""
    if not text:
        return ""
    shown = sanitize(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


class SettlementKind(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    PENDING = "pending"  # non-blocking: the call returns now; a retry proceeds once approved
    INPUT_REQUIRED = "input_required"  # 2026-07-28: answer with ``result`` (an InputRequiredResult)


@dataclass(frozen=True, slots=True)
class Settlement:
    """How a ``human_approval`` call was settled.

    ``how`` is short and stable: ``policy``, ``grant:<id>``, ``memory``, ``approved by <who> via
    <channel>``, ``denied by <who> via <channel>``, ``timeout``, ``expired``, ``request_state invalid:
    <code>``, ``pending``, ``input_required``. ``reason`` is the sentence for the agent and the record.
    ``result`` is the ready-made JSON-RPC result for ``pending`` and ``input_required``.
    """

    kind: SettlementKind
    how: str
    reason: str
    approval_id: str | None = None
    grant_id: str | None = None
    resolved_by: str | None = None
    channel: Channel | None = None
    strength: Strength | None = None
    retry: str | None = None
    result: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def allowed(self) -> bool:
        return self.kind is SettlementKind.ALLOW

    def evidence(self) -> dict[str, Any]:
        """The approval part of a decision record: how, and the strength of the approval."""
        fields: dict[str, Any] = {
            "settled": str(self.kind),
            "how": self.how,
            "approval_id": self.approval_id,
            "grant_id": self.grant_id,
            "resolved_by": self.resolved_by,
            "channel": str(self.channel) if self.channel is not None else None,
            "strength": str(self.strength) if self.strength is not None else None,
        }
        return {k: v for k, v in fields.items() if v is not None}


def denied(how: str, reason: str, **extra: Any) -> Settlement:
    """A refusal settled ``how``, with ``reason`` for the agent and the record."""
    return Settlement(SettlementKind.DENY, how, reason, **extra)


def interpret_answer(answer: object) -> tuple[ApprovalStatus, str]:
    """A client's elicitation answer as a decision. Only an explicit ``accept`` + ``approve`` approves."""
    if not isinstance(answer, Mapping):
        return ApprovalStatus.DENIED, "the client's answer was not an elicitation result"
    action = answer.get("action")
    content = answer.get("content")
    said = ""
    if isinstance(content, Mapping) and isinstance(content.get("reason"), str):
        said = clip(content["reason"])
    if action == "accept":
        decision = content.get(DECISION_FIELD) if isinstance(content, Mapping) else None
        if decision == APPROVE:
            return ApprovalStatus.APPROVED, said or "approved in the client"
        if decision == DENY:
            return ApprovalStatus.DENIED, said or "denied in the client"
        return ApprovalStatus.DENIED, "the client accepted the form without choosing approve"
    if action == "decline":
        return ApprovalStatus.DENIED, said or "declined in the client"
    if action == "cancel":
        return ApprovalStatus.DENIED, "dismissed in the client without a decision"
    return ApprovalStatus.DENIED, "the client's answer had no known action"


def read_decision(decision: ApprovalStatus | str) -> ApprovalStatus:
    """A decision named through a channel: approve or deny, in the words people use for them."""
    text = str(decision).strip().lower()
    if text in ("approve", "approved", "allow"):
        return ApprovalStatus.APPROVED
    if text in ("deny", "denied", "reject", "rejected"):
        return ApprovalStatus.DENIED
    raise ValueError("decision must be approve or deny")


def settlement_of(approval: Approval, timeout_seconds: float) -> Settlement:
    """A resolved approval as the answer for the call that used it."""
    short = approval.short_id
    who = clip(approval.resolved_by, 128)
    said = clip(approval.resolution_reason)
    channel = approval.channel
    strength = strength_of(channel) if channel is not None else None
    common: dict[str, Any] = dict(
        approval_id=approval.id, resolved_by=approval.resolved_by, channel=channel, strength=strength
    )
    if approval.permits:
        reason = f"approval {short} approved by {who} via {channel} (strength {strength})"
        return Settlement(
            SettlementKind.ALLOW, f"approved by {who} via {channel}",
            reason + (f": {said}" if said else ""), **common,
        )
    if approval.status is ApprovalStatus.DENIED:
        reason = f"approval {short} denied by {who} via {channel}"
        return denied(f"denied by {who} via {channel}", reason + (f": {said}" if said else ""), **common)
    if approval.resolved_by == RESOLVED_BY_TIMEOUT:
        return denied(
            "timeout",
            f"approval {short} timed out: nobody approved it within {int(timeout_seconds)} s",
            **common,
        )
    if approval.resolved_by == RESOLVED_BY_UNANSWERABLE:
        return denied("unavailable", f"approval {short} could not be obtained: {said}", **common)
    if approval.resolved_by == RESOLVED_BY_RESTART:
        return denied("expired", f"approval {short} expired: the gateway restarted while it was pending",
                      **common)
    return denied("expired", f"approval {short} expired ({said or approval.status})", **common)


UNBINDABLE: Final = "the arguments have no canonical form, so no approval can be bound to them"
NO_CHANNEL: Final = (
    "no channel reaches a person for this call (the client cannot be asked in-band and no control plane "
    "is open): approval unavailable"
)


def operator_needed(verdict: Verdict) -> str:
    """The refusal of a call only an operator may approve when no operator channel is open: it names the
    cause that applied (the floor and its reasons -- a changed pin, a CLI dispatcher -- or the rule)."""
    return (
        f"only an operator may approve this call ({verdict.operator_causes()}), and no operator channel is "
        "open (the control plane, the console, the CLI): approval unavailable"
    )


__all__ = [
    "NO_CHANNEL",
    "UNBINDABLE",
    "operator_needed",
    "APPROVE",
    "DECISION_FIELD",
    "DENY",
    "MAX_REASON_CHARS",
    "REQUESTED_SCHEMA",
    "Settlement",
    "SettlementKind",
    "clip",
    "denied",
    "interpret_answer",
    "read_decision",
    "settlement_of",
]
