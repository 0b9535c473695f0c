"""Standing answers: what lets a ``human_approval`` call through without asking anyone now.

Invariant: a temporal grant or approval memory lifts a call only once the lift is in the trace
chain (``approval_by_grant``, ``approval_by_memory``): a record that cannot be written raises, and
the call does not run. Memory approves only through a row of the approval queue, resolved through
the ``memory`` channel and used at once by this call, so it can never be handed to another call;
it never approves arguments that look like injected instructions or that have no shape to count.
Neither applies to a floor's question for a person: the engine does not consult them then.

Theory of operation. ``grant_settlement`` records the grant that matched (``state.grants``) and
answers ``allow`` naming it. ``ApprovalMemory.settle`` counts the earlier answers for this agent,
tool and memory key (the argument shape, or the shape and a rule's ``memory_key`` values:
``ApprovalStore.memory_counts``), lets ``approval.memory.decide`` judge
them, and only when it approves opens the row (``submit``, the engine's, so the row is like any
other) and resolves it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final, Protocol

from drawbridge.approval.channels import Channel, Strength
from drawbridge.approval.memory import MEMORY_RESOLVER, MemoryConfig, decide, memory_key_digest
from drawbridge.approval.shape import ArgumentShape
from drawbridge.gateway.pipeline.approvals.grants import TraceAppend
from drawbridge.gateway.pipeline.approvals.resolutions import Resolutions
from drawbridge.gateway.pipeline.approvals.settlement import Settlement, SettlementKind, clip
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Verdict
from drawbridge.state.approval_uses import ApprovalUses
from drawbridge.state.approvals import Approval, ApprovalStatus, ApprovalStore
from drawbridge.state.grants import Grant
from drawbridge.state.sqlite import to_db_time

TRACE_BY_GRANT: Final = "approval_by_grant"
TRACE_BY_MEMORY: Final = "approval_by_memory"

Submit = Callable[[], Awaitable[Approval]]
"""Open the approval row for the call being settled (``ApprovalEngine._submit``)."""


class DigestKey(Protocol):
    """The keyed-digest key (``gateway.recorder.TruthKey`` fits): bytes and a key id."""

    @property
    def key(self) -> bytes: ...

    @property
    def key_id(self) -> str: ...


def memory_digest_of(call: ToolCall, shape: ArgumentShape | None, verdict: Verdict, key: DigestKey) -> str | None:
    """The key approval memory counts this call under: its shape's digest, or with the rule's
    ``memory_key`` a keyed digest of the shape and those fields' values. None: never counted
    (no shape, or memory may not stand in for a person on this call)."""
    if shape is None or not verdict.memory_applies:
        return None
    if not verdict.memory_key:
        return shape.digest
    return memory_key_digest(shape.digest, call.arguments, verdict.memory_key, bytes(key.key), key.key_id)


async def grant_settlement(
    trace_append: TraceAppend, call: ToolCall, grant: Grant, digest: str, at: datetime
) -> Settlement:
    """``allow`` by ``grant`` (active for this agent and tool), recorded first."""
    await trace_append(
        TRACE_BY_GRANT,
        {
            "grant_id": grant.id,
            "agent": call.agent,
            "tool": call.tool,
            "args_digest": digest,
            "granted_by": grant.granted_by,
            "grant_expires_at": to_db_time(grant.expires_at),
            "at": to_db_time(at),
        },
    )
    return Settlement(
        SettlementKind.ALLOW,
        f"grant:{grant.id}",
        f"allowed by grant {grant.id} (granted by {clip(grant.granted_by, 128)}, until "
        f"{to_db_time(grant.expires_at)})",
        grant_id=grant.id,
        resolved_by=grant.granted_by,
    )


class ApprovalMemory:
    """Approval memory on one approval queue (module docstring)."""

    def __init__(
        self, config: MemoryConfig, store: ApprovalStore, uses: ApprovalUses, resolutions: Resolutions
    ) -> None:
        self._config = config
        self._store = store
        self._uses = uses
        self._resolutions = resolutions

    async def settle(
        self,
        call: ToolCall,
        memory_digest: str | None,
        findings: tuple[str, ...],
        now: datetime,
        submit: Submit,
    ) -> Settlement | None:
        """``allow`` when memory approves this call (recorded), else None: someone must be asked.
        ``memory_digest`` is the key earlier answers are counted under (None: no shape to count)."""
        if not self._config.enabled:
            return None
        counts = None
        if memory_digest is not None and not findings:
            counts = await self._store.memory_counts(call.agent, call.tool, memory_digest)
        decision = decide(self._config, counts, injection_suspected=bool(findings))
        if not decision.auto_approve:
            return None
        submitted = await submit()
        approval = await self._store.resolve(
            submitted.id, ApprovalStatus.APPROVED, resolved_by=MEMORY_RESOLVER, channel=Channel.MEMORY,
            reason=decision.reason, at=now,
        )
        if not await self._uses.claim(approval.id, at=now):  # memory rows are never handed out; be strict
            return None
        assert counts is not None
        body = {**approval.request_record(), **approval.resolution_record()}
        body["memory"] = {
            "operator_approvals": counts.operator_approvals,
            "client_approvals": counts.client_approvals,
            "denials": counts.denials,
            "min_approvals": self._config.min_approvals,
            "count_client_answers": self._config.count_client_answers,
        }
        await self._resolutions.record_resolved(TRACE_BY_MEMORY, body, approval.id)
        return Settlement(
            SettlementKind.ALLOW, "memory", decision.reason, approval_id=approval.id,
            resolved_by=MEMORY_RESOLVER, channel=Channel.MEMORY, strength=Strength.MEMORY,
        )


__all__ = ["TRACE_BY_GRANT", "TRACE_BY_MEMORY", "ApprovalMemory", "Submit", "grant_settlement"]
