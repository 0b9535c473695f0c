"""What a decision says, and what the agent is told when it is not ``allow``.

Invariant: only ``allow`` forwards (``refusal_for`` returns None for it and for nothing else), and a
refusal names the rule and the reason but never repeats an argument value. The action is the policy
model's own ``Action``: the gateway has one vocabulary of actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from drawbridge.canonical import sanitize
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.shadow import ShadowVerdict
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.policy.model import Action, Approver

APPROVAL_UNAVAILABLE: Final = "approval unavailable"
REFUSAL_META_KEY: Final = "drawbridge/decision"
GATEWAY_POLICY: Final = "drawbridge"
"""The policy name of decisions the gateway takes itself (fail-closed refusals, floors, --allow-all)."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a decision came from: the policy, its file, the rule's 0-based index."""

    policy: str | None = None
    source_file: str | None = None
    rule_index: int | None = None
    policy_set: str | None = None
    """The digest of the policy set that was evaluated (``PolicyStore.decide``); None when no policy
    set was (``--allow-all``, a gateway refusal before the policy). Kept when a floor raises the
    action, since the policy's verdict still counted."""
    shadow: ShadowVerdict | None = field(default=None, compare=False)
    """What the shadow policy would have decided (``shadow``); None without one. Kept as ``policy_set``
    is; no part of equality, and no recorder reads it: the shadow never changes a call or its records."""

    line: int | None = field(default=None, compare=False)
    """The deciding rule's line in ``source_file`` (the schema's for a schema refusal), as the reason
    writes it; what the decision line names (``activity_log.rule_of``). No part of equality: the file,
    the index and the policy set's digest already fix it."""

    def label(self) -> str:
        if self.policy is None:
            return "default deny"
        name = sanitize(self.policy)
        if self.rule_index is None:
            return f'policy "{name}"'
        return f'policy "{name}" rule {self.rule_index}'


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    reason: str
    provenance: Provenance = field(default_factory=Provenance)
    approval: Mapping[str, Any] | None = None
    """How human approval settled this call (``Settlement.evidence()``: how, who, channel, strength,
    approval or grant id); None when the policy alone decided."""
    answer: Mapping[str, Any] | None = None
    """A ready ``CallToolResult`` the gateway answers with while an approval is open (a 2026-07-28
    ``InputRequiredResult``, or a non-blocking approval's retry instructions); the call is not run."""
    person_only: bool = False
    """Only a person may lift this ``human_approval``: it was raised by a catalogue floor (a changed
    pin), which no grant and no approval memory may relax, and only an operator may answer it."""
    floor_reasons: tuple[str, ...] = ()
    """Why the floor made this ``person_only`` (a changed pin, a CLI dispatcher): what a refusal names."""
    approver: Approver = Approver.ANY
    """Who may answer the deciding rule's ``human_approval`` (its ``approval``)."""
    memory_key: tuple[tuple[str, ...], ...] = ()
    """Argument paths whose values approval memory also matches on (the rule's ``memory_key``)."""
    generic: bool = False
    """The tool is generic (its argument is the program): approval memory never stands in for a person."""

    @property
    def operator_only(self) -> bool:
        """Only an operator the gateway authenticated may approve: the client is never asked."""
        return self.person_only or self.approver is Approver.OPERATOR

    def operator_causes(self) -> str:
        """Why only an operator may approve, as a refusal says it: the floor that applied (with its
        reasons) and/or the rule's ``approval: operator``."""
        causes = []
        if self.person_only:
            reasons = "; ".join(self.floor_reasons)
            causes.append(f"the catalogue floor: {reasons}" if reasons else "a catalogue floor")
        if self.approver is Approver.OPERATOR:
            causes.append("an `approval: operator` rule")
        return " and ".join(causes)

    @property
    def memory_applies(self) -> bool:
        """Whether approval memory may stand in for a person on this call."""
        return not (self.operator_only or self.generic)

    def same_question(self, other: Verdict) -> bool:
        """Whether ``other`` asks what this verdict asked: the action and who may answer it."""
        return (
            other.action is self.action
            and other.person_only == self.person_only
            and other.approver is self.approver
            and other.memory_key == self.memory_key
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    outcome: Outcome
    reason: str


def refusal_for(verdict: Verdict) -> Refusal | None:
    """None means forward. Only ``allow`` forwards; an unknown action can not reach here (it is an enum)."""
    if verdict.action is Action.ALLOW:
        return None
    if verdict.answer is not None:
        return Refusal(Outcome.APPROVAL_PENDING, verdict.reason)
    if verdict.action is Action.HUMAN_APPROVAL:
        # With an approval block, the reason says why no approval could be obtained.
        reason = verdict.reason if verdict.approval is not None else APPROVAL_UNAVAILABLE
        return Refusal(Outcome.APPROVAL_UNAVAILABLE, reason)
    return Refusal(Outcome.REFUSED, verdict.reason)


def names_its_rule(verdict: Verdict, reason: str) -> bool:
    """The reason already says which rule of which policy decided (a rule's default reason,
    ``deny by rule 3 of policy 'demo' (demo.yaml:33)``): a label before it would say it twice."""
    provenance = verdict.provenance
    return provenance.rule_index is not None and f" by rule {provenance.rule_index} of policy " in reason


def described(verdict: Verdict, reason: str) -> str:
    """The verdict's provenance and ``reason``, naming the rule once."""
    return reason if names_its_rule(verdict, reason) else f"{verdict.provenance.label()}: {reason}"


def refusal_text(verdict: Verdict, refusal: Refusal) -> str:
    reason = sanitize(refusal.reason)
    if names_its_rule(verdict, reason):
        return f"drawbridge refused this call: {reason}"
    action = "" if verdict.action is Action.DENY else f" ({verdict.action.value})"
    return f"drawbridge refused this call: {verdict.provenance.label()}{action}: {reason}"


def refusal_result(verdict: Verdict, refusal: Refusal, call: ToolCall) -> dict[str, Any]:
    """The ``CallToolResult`` the agent receives instead of the tool's answer (the verdict's ready
    ``answer`` while an approval is open)."""
    if verdict.answer is not None:
        return dict(verdict.answer)
    decision: dict[str, Any] = {"action": verdict.action.value, "outcome": refusal.outcome.value}
    if verdict.provenance.policy is not None:
        decision["policy"] = sanitize(verdict.provenance.policy)
    if verdict.provenance.rule_index is not None:
        decision["rule_index"] = verdict.provenance.rule_index
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": refusal_text(verdict, refusal)}],
        "isError": True,
        "_meta": {REFUSAL_META_KEY: decision},
    }
    if call.modern:
        result["resultType"] = "complete"
    return result


__all__ = [
    "APPROVAL_UNAVAILABLE",
    "GATEWAY_POLICY",
    "REFUSAL_META_KEY",
    "Action",
    "Provenance",
    "Refusal",
    "Verdict",
    "refusal_for",
    "refusal_result",
    "refusal_text",
]
