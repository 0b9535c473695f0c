"""The shadow policy: a candidate policy set decided beside the enforced one, reported and never enforced.

Invariant: the shadow never changes what happens to a call, and it never reaches the evidence records.
The enforced policy decides as it always does; the shadow's decision is carried beside it as a
``ShadowVerdict`` on ``Provenance.shadow``, which takes no part in a provenance's equality (nor in any
verdict's question, ``Verdict.same_question``) and which no recorder reads: the surface records, the
trace and the truth carriers are byte-identical with and without a shadow, because an auditor reads what
was enforced. A shadow that raises leaves the enforced verdict as it was; its verdict then says it
failed (``action`` None), and the log names the exception's type only (its text may quote arguments).
The shadow set is never edited by the control plane; it is reloaded from its files by the same watcher
as the enforced set, with no trace entry.

What reads it: the decision line (``activity``), ``drawbridge_shadow_calls_total``
(``recording.metrics``) and ``GET /shadow`` (``recording.shadow_tally``), each once per recorded call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from drawbridge.activity_log import rule_of
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.policy.model import Action
from drawbridge.state.policy_store import PolicyStore

_log = logging.getLogger("drawbridge.gateway")

FAILED: Final = "failed"
"""The shadow action shown when the shadow could not decide (the decision line, metrics, ``/shadow``)."""


@dataclass(frozen=True, slots=True)
class ShadowVerdict:
    """What the shadow policy would have decided for a call, beside what the enforced policy did."""

    action: Action | None
    """The shadow's action; None when evaluating the shadow failed."""
    rule: str
    """The shadow's deciding rule (``activity_log.rule_of``), or ``failed``."""
    policy_action: Action
    """The enforced policy's own action, before floors and approvals: what the shadow is compared to."""

    @property
    def shown(self) -> str:
        """The shadow action as reported: its value, or ``failed``."""
        return self.action.value if self.action is not None else FAILED

    @property
    def differs(self) -> bool:
        """The shadow would have decided otherwise than the enforced policy (a failed shadow differs)."""
        return self.action is not self.policy_action


def shadow_verdict(store: PolicyStore, call: ToolCall, policy_action: Action) -> ShadowVerdict:
    """The shadow's decision of ``call``; whatever it raises becomes a failed verdict, never the call's."""
    try:
        decision, _digest = store.decide(call.agent, call.tool, call.arguments)
    except Exception as exc:  # noqa: BLE001 -- the shadow must never fail a call, whatever it raised
        _log.warning("the shadow policy raised %s; the enforced verdict stands", type(exc).__name__)
        return ShadowVerdict(None, FAILED, policy_action)
    rule = rule_of(decision.source_file, decision.rule_index, decision.policy, decision.line)
    return ShadowVerdict(decision.action, rule, policy_action)


__all__ = ["FAILED", "ShadowVerdict", "shadow_verdict"]
