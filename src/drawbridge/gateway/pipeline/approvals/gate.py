"""Human approval in the gateway's decision path, for ``drawbridge wrap`` and ``drawbridge serve`` alike.

Invariant: a tools/call whose policy (after the floors) says ``human_approval`` runs only when the
approval engine (``approvals.engine``) settles it as allowed -- an active grant, approval memory, or a
person's approval of exactly this call through any channel -- and then the verdict the transport acts
on is ``allow`` carrying the approval block (how, who, channel, strength), which the records keep.
Everything else is refused, or answered for now while the question is open; nothing is forwarded on
a ``human_approval`` verdict. The gate is a stage of the one pipeline (``pipeline.call``), so it stands
in front of every transport (wrap's relay, serve's stdio and HTTP sessions) and grants and every
channel apply everywhere (gateway-behaviour.md 12, items 1
and 6). The approval binding is keyed and covers every argument, secret-like keys included
(``approval.binding``); raw arguments are never stored.

Theory of operation. ``build_approval_engine`` makes the engine on the embedded SQLite state, with a
per-process binding key and a per-process request-state key (so a restart never honours anything
issued before it: pending approvals become expired, outstanding ``requestState`` tokens fail to
verify). The pipeline hands ``ApprovalGate.settle`` the verdict of the floors and the policy, and
the call's ``client_link``:

1. (The floors and the policy have decided.)
2. A 2026-07-28 retry carrying the gateway's ``requestState`` (``client_link``) goes to
   ``engine.settle_retry`` -- unless only an operator may approve the call now (an ``approval:
   operator`` rule, a changed pin): its answer is then ignored and the call settled as in 4: forged, altered, expired, mismatched or replayed states are refused; an
   answer applies through the elicitation channel; the approval is used once. A continuation (the
   approved call's upstream asked a question of its own) goes there always, and runs the call on the
   approval already given, if an operator gave it where only an operator may.
3. Any other verdict but ``human_approval`` is returned as is.
4. ``human_approval`` goes to ``engine.settle`` with what this call's client can do (nothing, when
   only an operator may approve): a 2026-07-28
   client whose request declares form elicitation gets an ``InputRequiredResult`` (sealed
   ``requestState``); a 2025-11-25 client that declared elicitation gets a gateway-originated
   ``elicitation/create`` while the other channels stay open (with ``ask_by_link`` and URL mode
   declared: a link to the approval's console page, ``approvals.by_link``); otherwise the operator channels (the
   control plane, the CLI through it, a state file shared with another gateway) decide, blocking or
   non-blocking as configured. When neither the client nor an operator channel can reach a person,
   the call is refused at once (``approval unavailable``) after grants and memory had their say.
5. The settlement becomes the verdict (``verdict_of``): ``allow`` with the approval block,
   ``deny`` with it, or ``human_approval`` with a ready ``answer`` (the pending result or the
   ``InputRequiredResult``) that the transport sends instead of forwarding. When a person's answer
   allowed the call, the pipeline decides it again and runs it only if the floors and the policy
   still ask the same question.

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
from drawbridge.approval.memory import MemoryConfig
from drawbridge.config_notify import NotifyTarget
from drawbridge.gateway.pipeline.approvals.by_link import LinkAsker
from drawbridge.gateway.pipeline.approvals.engine import DEFAULT_TIMEOUT_SECONDS, ApprovalEngine
from drawbridge.gateway.pipeline.approvals.grants import TraceAppend, utc_clock
from drawbridge.gateway.pipeline.approvals.settlement import Settlement, SettlementKind
from drawbridge.gateway.pipeline.client_link import ClientLink, call_declares_elicitation
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Verdict
from drawbridge.state.approvals import Approval
from drawbridge.state.backend import StateBackend

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
    ask_by_link: bool = False
    """Where the client declared URL-mode elicitation and the console is served, send it a link to the
    approval's console page instead of a form (``approvals.by_link``)."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    notify: tuple[NotifyTarget, ...] = ()
    """The webhooks each new question is posted to (``approvals.notify``)."""
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
            ask_by_link=config.approval_ask_by_link,
            notify=config.approval_notify,
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


def build_approval_engine(
    settings: ApprovalSettings,
    state_db: StateBackend,
    trace_append: TraceAppend,
    *,
    non_blocking: bool | None = None,
    memory: MemoryConfig | None = None,
    binding_key: BindingKey | None = None,
    state_keys: bytes | list[bytes] | None = None,
    clock: Callable[[], datetime] = utc_clock,
    on_pending: Callable[[Approval], None] | None = None,
) -> ApprovalEngine:
    """The approval engine on the embedded state: queue, grants and use ledger in ``state_db``.

    ``non_blocking`` and ``memory`` override ``settings``. The binding key and the request-state key
    are drawn per process unless given (tests pass fixed ones). ``on_pending`` hears of each new
    question (``approvals.notify``).
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
        on_pending=on_pending,
    )


async def recover_approvals(engine: ApprovalEngine) -> None:
    """Expire what a previous process left pending (recorded); ``StateUnavailable`` when the state
    cannot be read, which stops the start."""
    recovered = await engine.start()
    if recovered:
        logger.warning(
            "%d approval(s) of a previous run expired (pending, or approved and never used: a restart never "
            "approves)", len(recovered)
        )


async def run_approvals(
    engine: ApprovalEngine,
    *,
    sweep_seconds: float = DEFAULT_SWEEP_SECONDS,
    recover: bool = True,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """``recover_approvals`` (unless the caller did), report started, then sweep forever."""
    if recover:
        await recover_approvals(engine)
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
    """The approval stage: a ``human_approval`` verdict (or a 2026-07-28 retry) settled by the engine
    through what this call's client can do (module docstring, steps 2 to 5).

    ``operator_channel`` says whether a person can answer outside the client (a control plane is
    open, or the state file is shared with a gateway that has one). ``elicitation=False`` never asks
    in-band. The pipeline calls ``settle`` and, when it comes back ``allow`` after a person's answer,
    decides again and runs the call only if the same question would still be asked.
    """

    def __init__(
        self, engine: ApprovalEngine, *, elicitation: bool = True, operator_channel: bool = True, ask_by_link: bool = False
    ) -> None:
        self.engine = engine
        self._elicitation = elicitation
        self._operator_channel = operator_channel
        self._ask_by_link = ask_by_link
        self.link_pages: str | None = None
        """The console's approval pages (``.../console/approvals/``), once the console is served."""

    def _link(self, call: ToolCall, asker: Any) -> LinkAsker | None:
        """An approval link for this call, when asked for, served, and the client declared URL mode."""
        if not self._ask_by_link or self.link_pages is None or call.modern or not getattr(asker, "url", False):
            return None
        return LinkAsker(asker, self.link_pages, utc_clock)

    async def settle(self, call: ToolCall, verdict: Verdict, link: ClientLink) -> Verdict:
        """The verdict the pipeline acts on (``verdict_of`` the engine's settlement)."""
        operator_only = verdict.action is Action.HUMAN_APPROVAL and verdict.operator_only
        if link.retry and (not operator_only or link.continuation):
            settlement = await self.engine.settle_retry(
                call, link.request_state, link.input_responses, verdict=verdict
            )
            return verdict_of(settlement, verdict)
        if verdict.action is not Action.HUMAN_APPROVAL:
            return verdict
        asker = link.elicit if self._elicitation else None
        by_link = self._link(call, asker)
        if by_link is not None:  # a logged-in operator decides: it may lift what only an operator may approve
            settlement = await self.engine.settle(call, verdict, elicitation_supported=False, link=by_link)
            return verdict_of(settlement, verdict)
        elicit = None
        if operator_only:
            # A retry's answer is the client's: it never lifts what only an operator may approve.
            supported = False
        elif call.modern:
            supported = self._elicitation and call_declares_elicitation(call)
        else:
            elicit = asker if getattr(asker, "form", True) else None
            supported = elicit is not None
        settlement = await self.engine.settle(
            call,
            verdict,
            elicitation_supported=supported,
            elicit=elicit,
            ask=supported or self._operator_channel,
            others=self._operator_channel,
        )
        return verdict_of(settlement, verdict)


__all__ = [
    "ApprovalGate",
    "ApprovalSettings",
    "BindingKey",
    "build_approval_engine",
    "recover_approvals",
    "run_approvals",
    "verdict_of",
]
