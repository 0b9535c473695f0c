"""Human approval in the gateway's decision path, for ``drawbridge wrap`` and ``drawbridge serve`` alike.

Invariant: a tools/call whose policy (after the floors) says ``human_approval`` runs only when the
approval engine (``approval.engine``) settles it as allowed -- an active grant, approval memory, or a
person's approval of exactly this call through any channel -- and then the verdict the transport acts
on is ``allow`` carrying the approval block (how, who, channel, strength), which the records keep.
Everything else is refused, or answered for now while the question is open; nothing is forwarded on
a ``human_approval`` verdict. The same gate stands in front of every transport (stdio relay, stdio
and HTTP sessions), so grants and every channel apply everywhere (gateway-behaviour.md 12, items 1
and 6). The approval binding is keyed and covers every argument, secret-like keys included
(``approval.binding``); raw arguments are never stored.

Theory of operation. ``build_approval_engine`` makes the engine on the embedded SQLite state, with a
per-process binding key and a per-process request-state key (so a restart never honours anything
issued before it: pending approvals become expired, outstanding ``requestState`` tokens fail to
verify). ``ApprovalGate`` wraps a decider, keeping the ``Decider`` shape:

1. The policy decides (the inner decider).
2. A 2026-07-28 retry carrying the gateway's ``requestState`` (``client_link``) goes to
   ``engine.settle_retry``: forged, altered, expired, mismatched or replayed states are refused; an
   answer applies through the elicitation channel; the approval is used once.
3. Any other verdict but ``human_approval`` is returned as is.
4. ``human_approval`` goes to ``engine.settle`` with what this call's client can do: a 2026-07-28
   client whose request declares form elicitation gets an ``InputRequiredResult`` (sealed
   ``requestState``); a 2025-11-25 client that declared elicitation gets a gateway-originated
   ``elicitation/create`` while the other channels stay open; otherwise the operator channels (the
   control plane, the CLI through it, a state file shared with another gateway) decide, blocking or
   non-blocking as configured. When neither the client nor an operator channel can reach a person,
   the call is refused at once (``approval unavailable``) after grants and memory had their say.
5. The settlement becomes the verdict (``verdict_of``): ``allow`` with the approval block,
   ``deny`` with it, or ``human_approval`` with a ready ``answer`` (the pending result or the
   ``InputRequiredResult``) that the transport sends instead of forwarding.

``run_approvals`` is started once per process before calls are accepted: pending approvals of a
previous process become expired (recorded), then a sweeper expires what comes due, so unanswered
non-blocking approvals end in deny.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

from drawbridge.approval.binding import binding_digest
from drawbridge.approval.engine import (
    DEFAULT_TIMEOUT_SECONDS,
    ApprovalEngine,
    Settlement,
    SettlementKind,
    TraceAppend,
    call_declares_elicitation,
    utc_clock,
)
from drawbridge.approval.memory import MemoryConfig
from drawbridge.gateway.client_link import CLIENT_LINK
from drawbridge.gateway.pipeline import Action, Decider, ToolCall, Verdict
from drawbridge.state.sqlite import StateDB

logger = logging.getLogger("drawbridge.approval")

DEFAULT_SWEEP_SECONDS: Final = 5.0
DEFAULT_POLL_SECONDS: Final = 1.0
BINDING_KEY_BYTES: Final = 32


@dataclass(frozen=True)
class ApprovalSettings:
    """How the gateway asks for approval (``approval:`` in the configuration; ``wrap`` flags)."""

    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    """A question nobody answers within this ends in deny."""
    non_blocking: bool = False
    """Answer at once with the approval id and how to retry, instead of holding the call open, when
    the client cannot be asked in-band."""
    elicitation: bool = True
    """Ask in-band (``elicitation/create``, ``InputRequiredResult``) where the client supports it."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    sweep_seconds: float = DEFAULT_SWEEP_SECONDS
    poll_seconds: float = DEFAULT_POLL_SECONDS
    """How often a waiting call re-reads the store (for resolutions written by another process)."""

    @classmethod
    def from_config(cls, config: Any) -> ApprovalSettings:
        """From a ``config.GatewayConfig`` (its ``approval_*`` fields)."""
        return cls(
            timeout_seconds=config.approval_timeout_seconds,
            non_blocking=config.approval_non_blocking,
            elicitation=config.approval_elicitation,
            memory=MemoryConfig(
                enabled=config.approval_memory_enabled,
                min_approvals=config.approval_memory_min_approvals,
                count_client_answers=config.approval_memory_count_client_answers,
            ),
        )


@dataclass(frozen=True)
class BindingKey:
    """The key of the approval binding (``approval.binding``): per process unless given."""

    key: bytes = field(repr=False)
    key_id: str

    @classmethod
    def generate(cls) -> BindingKey:
        return cls(secrets.token_bytes(BINDING_KEY_BYTES), f"approval-{secrets.token_hex(4)}")


async def discard_trace(kind: str, body: Mapping[str, Any]) -> None:
    """The trace appender when no evidence is written: approvals still work, nothing is recorded."""
    return None


def trace_appender(recorder: object) -> TraceAppend:
    """The recorder's ``record_event`` (the same hash chain as the calls), or ``discard_trace``."""
    record_event = getattr(recorder, "record_event", None)
    return record_event if callable(record_event) else discard_trace  # type: ignore[return-value]


def build_approval_engine(
    settings: ApprovalSettings,
    state_db: StateDB,
    trace_append: TraceAppend,
    *,
    non_blocking: bool | None = None,
    memory: MemoryConfig | None = None,
    binding_key: BindingKey | None = None,
    state_keys: bytes | list[bytes] | None = None,
    clock: Callable[[], datetime] = utc_clock,
) -> ApprovalEngine:
    """The approval engine on the embedded state: queue, grants and use ledger in ``state_db``.

    ``non_blocking`` and ``memory`` override ``settings``. The binding key and the request-state key
    are drawn per process unless given (tests pass fixed ones).
    """
    key = binding_key if binding_key is not None else BindingKey.generate()

    def bind(arguments: Mapping[str, Any]) -> str | None:
        return binding_digest(arguments, key.key, key.key_id)

    return ApprovalEngine.on_state_db(
        state_db,
        trace_append,
        key_for_args_digest=key,
        memory_config=memory if memory is not None else settings.memory,
        timeout_seconds=settings.timeout_seconds,
        non_blocking=settings.non_blocking if non_blocking is None else non_blocking,
        state_keys=state_keys,
        poll_seconds=settings.poll_seconds,
        binding=bind,
        clock=clock,
    )


async def run_approvals(
    engine: ApprovalEngine,
    *,
    sweep_seconds: float = DEFAULT_SWEEP_SECONDS,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Expire what a previous process left pending (recorded), report started, then sweep forever."""
    recovered = await engine.start()
    if recovered:
        logger.warning(
            "%d approval(s) pending from a previous run expired (a restart never approves)", len(recovered)
        )
    task_status.started()
    await engine.run_sweeper(sweep_seconds)


def verdict_of(settlement: Settlement, original: Verdict) -> Verdict:
    """The verdict a transport acts on, from how the engine settled a call (module docstring, step 5)."""
    if settlement.how == "policy":
        return original
    evidence = settlement.evidence()
    kind = settlement.kind
    if kind is SettlementKind.ALLOW:
        return Verdict(Action.ALLOW, settlement.reason, original.provenance, approval=evidence)
    if kind in (SettlementKind.PENDING, SettlementKind.INPUT_REQUIRED):
        return Verdict(
            Action.HUMAN_APPROVAL,
            settlement.reason,
            original.provenance,
            approval=evidence,
            answer=settlement.result,
        )
    if settlement.how == "unavailable":
        return Verdict(Action.HUMAN_APPROVAL, settlement.reason, original.provenance, approval=evidence)
    return Verdict(Action.DENY, settlement.reason, original.provenance, approval=evidence)


class ApprovalGate:
    """A ``Decider``: the policy, then human approval through the engine (module docstring).

    ``operator_channel`` says whether a person can answer outside the client (a control plane is
    open, or the state file is shared with a gateway that has one). ``elicitation=False`` never asks
    in-band.
    """

    def __init__(
        self,
        decide: Decider,
        engine: ApprovalEngine,
        *,
        elicitation: bool = True,
        operator_channel: bool = True,
    ) -> None:
        self._decide = decide
        self.engine = engine
        self._elicitation = elicitation
        self._operator_channel = operator_channel
        inner_now = getattr(decide, "decide_now", None)
        self._inner_now: Callable[[ToolCall], Verdict | None] | None = (
            inner_now if callable(inner_now) else None
        )

    @property
    def inner(self) -> Decider:
        return self._decide

    @property
    def decide_now(self) -> Callable[[ToolCall], Verdict | None] | None:
        """The synchronous form for relays that decide inline: the policy's verdict when it needs no
        approval, else None (the call is then awaited). None when the inner decider has no such form."""
        return self._now if self._inner_now is not None else None

    def _now(self, call: ToolCall) -> Verdict | None:
        assert self._inner_now is not None
        verdict = self._inner_now(call)
        if verdict is None or verdict.action is Action.HUMAN_APPROVAL:
            return None
        return verdict

    async def __call__(self, call: ToolCall, /) -> Verdict:
        link = CLIENT_LINK.get()
        verdict = await self._decide(call)
        if link.retry:
            settlement = await self.engine.settle_retry(
                call, link.request_state, link.input_responses, verdict=verdict
            )
            return verdict_of(settlement, verdict)
        if verdict.action is not Action.HUMAN_APPROVAL:
            return verdict
        elicit = None
        if call.modern:
            supported = self._elicitation and call_declares_elicitation(call)
        else:
            elicit = link.elicit if self._elicitation else None
            supported = elicit is not None
        settlement = await self.engine.settle(
            call,
            verdict,
            elicitation_supported=supported,
            elicit=elicit,
            ask=supported or self._operator_channel,
            others=self._operator_channel,
        )
        settled = verdict_of(settlement, verdict)
        if settled.action is Action.ALLOW:
            # A person may have taken minutes: decide again (policy and catalogue floors never wait)
            # and run the call only if what was approved is still what would be asked.
            now = await self._decide(call)
            if now.action is not verdict.action or now.person_only != verdict.person_only:
                return Verdict(
                    Action.DENY,
                    "the decision changed while the approval was pending (the policy or the tool's "
                    f"catalogue entry changed; it now says {now.action.value}); call again",
                    now.provenance,
                )
        return settled


def approval_gate(
    decide: Decider,
    engine: ApprovalEngine,
    settings: ApprovalSettings | None = None,
    *,
    operator_channel: bool = True,
) -> ApprovalGate:
    """The approval-aware decider for a transport (``serve`` passes it to ``Gateway(decide=...)``)."""
    settings = settings or ApprovalSettings()
    return ApprovalGate(decide, engine, elicitation=settings.elicitation, operator_channel=operator_channel)


__all__ = [
    "ApprovalGate",
    "ApprovalSettings",
    "BindingKey",
    "approval_gate",
    "build_approval_engine",
    "discard_trace",
    "run_approvals",
    "trace_appender",
    "verdict_of",
]
