"""The approval engine: what happens to a tools/call whose policy says ``human_approval``.

Invariant: such a call runs only if one of these holds, and the trace chain says which (for a call only
an operator may approve -- an ``approval: operator`` rule, a changed pin -- only a grant or an
operator's approval counts, and a changed pin takes no grant either): an active temporal grant matches
it (``approval_by_grant``); approval memory approves it (``approval_by_memory``); or a person approved
exactly this call (same agent, tool and keyed argument digest) through some channel before the timeout
(``approval_resolved``, with who, when, channel, strength and reason), and that approval has not been
used by another call. One approval lets one call through, whichever channel resolved it and whichever
transport the call came in on. Everything else -- a denial, the timeout, a restart, a forged or replayed
``requestState``, a failure of the store or of the trace -- ends in deny. A ``deny`` verdict is never
lifted.

Theory of operation. ``settle(call, verdict, elicitation_supported=...)`` follows this order:

1. ``allow`` and ``deny`` verdicts pass through untouched.
2. The keyed argument digest: ``binding(arguments)`` when given (the gateway passes its own), else
   ``approval.binding.binding_digest`` under ``key_for_args_digest``: it covers every key, secret-like
   ones included, so a retry that changes only a password cannot ride on an approval; a call whose
   arguments have no canonical form cannot be bound to an approval and is denied.
3. Active grant for (agent, tool) -> allow, recorded (not for a floor's
   ``person_only`` question).
4. Expire what is due (recorded), then: the oldest resolution of this exact
   call that no call has used yet (``state.approval_uses``) is claimed
   atomically and delivered -- approved runs, denied or expired is told.
   This is how a retried call proceeds after the person decided. It comes
   before memory on purpose: a person's answer to this very call is more
   specific than memory and is recorded with its stronger strength.
5. Approval memory (``approval.memory.decide``), skipped when the arguments
   look like injected instructions, and never consulted for a generic tool,
   a changed pin or an ``approval: operator`` rule -> an approval row resolved
   through the ``memory`` channel, used at once by this call, recorded. It
   counts under the argument shape, or the shape and the values of the rule's
   ``memory_key`` fields (``approval.memory.memory_key_digest``).
6. The open question for this exact call that asks the same person, if any,
   else a new approval (``approval_requested``, its ``approver`` stored: the
   store refuses a client's approval of an operator's question; ``on_pending`` is
   told of it, ``approvals.notify`` posting it to webhooks), found or opened as
   one step for identical calls in this process (``approvals.question_locks``). A call only
   an operator may approve is never asked in-band: it waits for an operator
   channel (blocking or non-blocking), or is refused at once when none is open.
   Otherwise, by what the client can do:

   * 2026-07-28 client with elicitation: an ``InputRequiredResult`` whose
     ``requestState`` is sealed (``approvals.request_states``) and bound to
     agent, tool, argument digest, approval id and expiry. The retry goes to
     ``settle_retry``, which opens the state, applies the answer through
     ``resolve`` (channel ``elicitation``), and claims the approval: a second
     use of the same state finds it used and is denied as a replay.
   * 2025-11-25 client with elicitation and an ``elicit`` callback: wait,
     asking in-band at the same time; the answer resolves through
     ``resolve`` (channel ``elicitation``, strength ``client``).
   * otherwise, non-blocking mode: answer at once with an ``isError`` result
     naming the approval id and how to retry (step 4 picks it up).
   * otherwise, blocking: wait.

   Waiting and resolving are ``approvals.resolutions``: ``resolve`` is the
   single entry point of every channel and wakes the waiting call at once; at
   the deadline the approval is expired in the store (recorded) and the call
   denied. A waiter whose resolution another identical call claimed first
   goes round again (a new question). What is asked is ``approvals.questions``;
   how a resolution reads as an answer, ``approvals.settlement``.

``start()`` runs once before the gateway accepts calls: every approval still
pending from a previous process becomes expired (``system:restart``) and is
recorded; it is never approved. So does one approved within the retry window
that no call used, when its argument digest was keyed under another binding
key than this process's (the key is drawn per process unless replicas share
one): step 4 could never match it again. ``sweep()`` expires what is due.

While an approval is pending, the engine holds what a person is shown of its
call's arguments (``approvals.held_arguments``: in memory only, secret-like
values masked, bounded) for ``shown_arguments``, the control plane's view; the
entry goes when the approval ends.

Trace kinds written here: ``approval_requested``; ``approval_by_grant`` and
``approval_by_memory`` through ``approvals.standing``, ``approval_resolved``
through ``Resolutions``, ``approval_state_refused`` through ``RequestStates``,
``grant_created`` / ``grant_revoked`` through ``GrantService``
(``grant_service``). The bodies carry digests, shapes and names, never
argument values.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import anyio

from drawbridge.activity_log import activity, rule_of
from drawbridge.approval.binding import binding_digest
from drawbridge.approval.channels import Channel
from drawbridge.approval.memory import MemoryConfig
from drawbridge.approval.shape import ArgumentShape, ShapeError, argument_shape, injection_findings
from drawbridge.approval.shown_arguments import ShownArguments
from drawbridge.canonical import sanitize
from drawbridge.gateway.pipeline.approvals.grants import Clock, GrantService, TraceAppend, utc_clock
from drawbridge.gateway.pipeline.approvals.held_arguments import HeldArguments
from drawbridge.gateway.pipeline.approvals.by_link import LinkAsker
from drawbridge.gateway.pipeline.approvals.questions import Elicit, pending
from drawbridge.gateway.pipeline.approvals.request_states import RequestStates, new_nonce
from drawbridge.gateway.pipeline.approvals.resolutions import Resolutions
from drawbridge.gateway.pipeline.approvals.settlement import (
    NO_CHANNEL, UNBINDABLE, Settlement, SettlementKind, clip, denied, operator_needed, settlement_of,
)
from drawbridge.gateway.pipeline.approvals.question_locks import QuestionLocks
from drawbridge.gateway.pipeline.approvals.standing import (
    ApprovalMemory, DigestKey, grant_settlement, memory_digest_of,
)
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Verdict, described
from drawbridge.policy.model import Approver
from drawbridge.state.approval_uses import ApprovalUses, SqliteApprovalUses
from drawbridge.state.approvals import Approval, ApprovalStatus, ApprovalStore, SqliteApprovalStore
from drawbridge.state.grants import GrantStore, SqliteGrantStore
from drawbridge.state.backend import StateBackend
from drawbridge.state.errors import failure_text

logger = logging.getLogger("drawbridge.approval")

TRACE_REQUESTED: Final = "approval_requested"

DEFAULT_TIMEOUT_SECONDS: Final = 300.0
MAX_ROUNDS: Final = 4
@dataclass(frozen=True, slots=True)
class _Terms:
    """What one settle asks, computed once: the verdict, the binding, the shape, the memory key."""

    verdict: Verdict
    digest: str
    shape: ArgumentShape | None
    findings: tuple[str, ...]
    memory_digest: str | None


class ApprovalEngine:
    """Settles ``human_approval`` calls and resolves approvals from every channel (module docstring)."""

    def __init__(
        self,
        store: ApprovalStore,
        grants: GrantStore,
        trace_append: TraceAppend,
        *,
        key_for_args_digest: DigestKey,
        memory_config: MemoryConfig | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        clock: Clock = utc_clock,
        non_blocking: bool = False,
        elicit: Elicit | None = None,
        uses: ApprovalUses | None = None,
        state_keys: bytes | Sequence[bytes] | None = None,
        nonce_source: Callable[[], str] = new_nonce,
        retry_window_seconds: float | None = None,
        poll_seconds: float = 1.0,
        binding: Callable[[Mapping[str, Any]], str | None] | None = None,
        on_pending: Callable[[Approval], None] | None = None,
    ) -> None:
        if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
            raise TypeError("timeout_seconds must be a number")
        if not math.isfinite(timeout_seconds) or timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive and finite")
        if not (isinstance(key_for_args_digest.key, (bytes, bytearray)) and key_for_args_digest.key):
            raise ValueError("key_for_args_digest must hold a non-empty key")
        if uses is None:
            if not isinstance(store, SqliteApprovalStore):
                raise ValueError("pass uses= (an ApprovalUses on the same storage) for this approval store")
            # SqliteApprovalStore does not expose its database; the ledger must share it.
            uses = SqliteApprovalUses(store._db)  # noqa: SLF001
        window = timeout_seconds if retry_window_seconds is None else retry_window_seconds
        if not math.isfinite(window) or window <= 0 or poll_seconds <= 0:
            raise ValueError("retry_window_seconds and poll_seconds must be positive")
        self._store = store
        self._grants = grants
        self._trace = trace_append
        self._key = key_for_args_digest
        self._timeout = timedelta(seconds=timeout_seconds)
        self._clock = clock
        self._non_blocking = non_blocking
        self._elicit = elicit
        self._uses = uses
        self._held, self._asking = HeldArguments(), QuestionLocks()
        self._resolutions = Resolutions(
            store, trace_append, clock=clock, timeout_seconds=self.timeout_seconds, poll_seconds=poll_seconds,
            held=self._held,
        )
        self._memory = ApprovalMemory(
            memory_config if memory_config is not None else MemoryConfig(), store, uses, self._resolutions
        )
        self._states = RequestStates(
            store, uses, self._resolutions, trace_append, clock=clock, timeout_seconds=self.timeout_seconds,
            state_keys=state_keys, nonce_source=nonce_source,
        )
        self._window = timedelta(seconds=window)
        self._binding, self._on_pending = binding, on_pending
        self.grant_service = GrantService(grants, trace_append, clock=clock)

    @classmethod
    def on_state_db(cls, db: StateBackend, trace_append: TraceAppend, **options: Any) -> ApprovalEngine:
        """An engine on the embedded SQLite state: approval queue, grants and the use ledger share ``db``."""
        stores = SqliteApprovalStore(db), SqliteGrantStore(db)
        return cls(*stores, trace_append, uses=SqliteApprovalUses(db), **options)

    @property
    def resolutions(self) -> Resolutions:  # how approvals end (a call that can no longer run, ``withdrawable``)
        return self._resolutions

    @property
    def store(self) -> ApprovalStore:
        return self._store

    @property
    def timeout_seconds(self) -> float:
        return self._timeout.total_seconds()

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> list[Approval]:
        """Once, before the gateway accepts calls: pending approvals of a previous process become expired,
        and so do approved ones a retry could still have used, were they not bound under another key."""
        return await self._resolutions.recover_after_restart(self._clock() - self._window, self._key.key_id)

    def wake(self, approval_id: str | None) -> None:
        """An approval ended on another replica (None: any may have): its waiters read the store now."""
        self._resolutions.ended_elsewhere(approval_id)

    async def sweep(self) -> list[Approval]:
        """Expire every pending approval that is due, record each, and wake its waiters; let go of the
        arguments of approvals that ended elsewhere (another gateway on the same state)."""
        expired = await self._resolutions.expire_due(self._clock())
        if self._held:
            held_before = self._held.ids()
            pending = {approval.id for approval in await self._store.list(ApprovalStatus.PENDING)}
            self._held.release_ended(held_before, pending)
        return expired

    async def run_sweeper(self, interval_seconds: float = 5.0) -> None:
        """Sweep forever (run in the gateway's task group), so unanswered non-blocking approvals end."""
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # noqa: BLE001 -- keep sweeping; the next settle sweeps too
                logger.error("approval sweep failed: %s", failure_text(exc))
            await anyio.sleep(interval_seconds)

    def shown_arguments(self, approval_id: str) -> ShownArguments | None:
        """What a person is shown of the arguments of pending approval ``approval_id`` (its full id),
        or None when this process holds none (it ended, or another process opened it)."""
        return self._held.shown(approval_id)

    # -- resolving (every channel) -------------------------------------------------------------

    async def resolve(
        self,
        id_or_prefix: str,
        decision: ApprovalStatus | str,
        resolved_by: str,
        channel: Channel | str,
        reason: str = "",
    ) -> Approval:
        """Approve or deny a pending approval through ``channel``; wakes the waiting call at once.

        Raises the store's errors: ``ApprovalNotFound`` / ``AmbiguousApprovalId`` (unknown or
        ambiguous id), ``AlreadyResolved`` (with the stored state), ``ApprovalExpired`` (too late: the
        approval is now expired), ``InvalidApproval`` (bad channel or text).
        """
        return await self._resolutions.resolve(id_or_prefix, decision, resolved_by, channel, reason)

    # -- settling a call -----------------------------------------------------------------------

    async def settle(
        self,
        call: ToolCall,
        verdict: Verdict,
        *,
        elicitation_supported: bool,
        elicit: Elicit | None = None,
        ask: bool = True,
        others: bool = True,
        link: LinkAsker | None = None,
    ) -> Settlement:
        """Settle one call (see the module docstring for the order). ``elicit`` overrides the engine's.

        ``ask=False`` says that no channel reaches a person for this call (the client cannot be asked
        in-band and no operator channel is open): grants, earlier resolutions and memory still apply,
        but instead of opening a question nobody can answer the call is denied at once (``unavailable``).
        ``others=False`` says that only the in-band question reaches a person: should the client answer
        it with an error, the approval ends at once (``system:unanswerable``) instead of at its timeout.
        """
        if verdict.action is Action.DENY:
            return denied("policy", verdict.reason)
        if verdict.action is Action.ALLOW:
            return Settlement(SettlementKind.ALLOW, "policy", verdict.reason)
        if verdict.action is not Action.HUMAN_APPROVAL:
            return denied("policy", f"unknown action {verdict.action!r}; failing closed")
        digest = self._digest(call)
        if digest is None:
            return denied("unbindable", UNBINDABLE)
        now = self._clock()
        # Who may answer: a floor (person_only: a changed pin, a CLI dispatcher) or an ``approval:
        # operator`` rule only an operator; then the client is never asked, and a client's earlier answer never counts.
        operator_only = verdict.operator_only
        person_only = verdict.person_only  # a floor's question: grants do not lift it either
        grant = None if person_only else await self._grants.active_for(call.agent, call.tool, now)
        if grant is not None:
            return await grant_settlement(self._trace, call, grant, digest, self._clock())

        await self._resolutions.expire_due(now)
        delivered = await self._deliver_resolution(call, digest, operator_only)
        if delivered is not None:
            return delivered

        findings = injection_findings(call.arguments)
        try:
            shape: ArgumentShape | None = argument_shape(call.arguments)
        except ShapeError:
            shape = None
        memory_digest = memory_digest_of(call, shape, verdict, self._key)
        terms = _Terms(verdict, digest, shape, findings, memory_digest)

        async def submit() -> Approval:  # memory's row is opened like any other, once memory approves
            return await self._submit(call, terms, now)

        remembered = None
        if verdict.memory_applies:
            remembered = await self._memory.settle(call, memory_digest, findings, now, submit)
        if remembered is not None:
            return remembered

        in_band = elicit if elicit is not None else self._elicit
        if link is not None:  # asked by a link to the console (``by_link``): a logged-in operator answers
            mode = "blocking"
        elif operator_only:
            mode = None
            if not others:
                return denied("unavailable", operator_needed(verdict))
        elif call.modern:
            mode = "input_required" if elicitation_supported else None
        else:
            mode = "elicitation" if elicitation_supported and in_band is not None else None
        if mode is None and not ask:
            return denied("unavailable", NO_CHANNEL)
        if mode is None:
            mode = "non_blocking" if self._non_blocking else "blocking"

        for round_ in range(MAX_ROUNDS):
            now = self._clock()
            if round_:
                delivered = await self._deliver_resolution(call, digest, operator_only)
                if delivered is not None:
                    return delivered
            approval, opened = await self._question(call, terms, now, mode)
            if mode == "input_required":
                return Settlement(
                    SettlementKind.INPUT_REQUIRED, "input_required",
                    f"approval {approval.short_id} asked in-band; the retry carries the answer",
                    approval_id=approval.id, result=self._states.issue(call, approval),
                )
            if mode == "non_blocking":
                return pending(call, approval, self._clock())
            resolved = await self._resolutions.await_resolution(
                call, approval, in_band if mode == "elicitation" else None, others=others, link=link, opened=opened
            )
            if await self._uses.claim(resolved.id, at=self._clock()):
                return settlement_of(resolved, self.timeout_seconds)
            # Another identical call used this resolution first: ask again.
        return denied("unsettled", f"no approval could be obtained in {MAX_ROUNDS} rounds; failing closed")

    async def settle_retry(
        self,
        call: ToolCall,
        request_state: object,
        input_responses: Mapping[str, Any] | None,
        *,
        verdict: Verdict | None = None,
    ) -> Settlement:
        """A 2026-07-28 retry with ``requestState``: verify it, apply the answer, use the approval once.

        The relay evaluates the policy on a retry as on any call and passes the ``verdict``: a policy
        that now says ``deny`` wins over any answer, and one that now says ``allow`` needs none.
        """
        if verdict is not None and verdict.action is not Action.HUMAN_APPROVAL:
            return await self.settle(call, verdict, elicitation_supported=False)
        digest = self._digest(call)
        if digest is None:
            return denied("unbindable", UNBINDABLE)
        only = verdict is not None and verdict.operator_only
        return await self._states.settle_retry(call, digest, request_state, input_responses, operator_only=only)

    def owns_state(self, token: object) -> bool:
        """Whether a retry's ``requestState`` is this gateway's (the others belong further upstream)."""
        return self._states.issued_here(token)

    def continue_call(self, call: ToolCall, approval_id: str, upstream_state: str | None) -> str | None:
        """``request_states.RequestStates.continue_call`` for ``call``; None when it cannot be sealed."""
        digest = self._digest(call)
        with contextlib.suppress(ValueError):
            return None if digest is None else self._states.continue_call(call, digest, approval_id, upstream_state)
        return None

    # -- steps ---------------------------------------------------------------------------------

    async def _deliver_resolution(self, call: ToolCall, digest: str, operator_only: bool) -> Settlement | None:
        """Claim the oldest unused resolution of exactly this call, if any, and answer with it (for a
        call only an operator may approve, an approval counts only when an operator gave it)."""
        now = self._clock()
        used = await self._uses.claim_resolved(
            call.agent, call.tool, digest, since=now - self._window, at=now, operator_only=operator_only
        )
        if used is None:
            return None
        approval = await self._store.get(used)
        await self._resolutions.ensure_recorded(approval)
        return settlement_of(approval, self.timeout_seconds)

    def _digest(self, call: ToolCall) -> str | None:
        if self._binding is not None:
            return self._binding(call.arguments)
        return binding_digest(dict(call.arguments), bytes(self._key.key), self._key.key_id)

    async def _submit(self, call: ToolCall, terms: _Terms, now: datetime) -> Approval:
        verdict = terms.verdict
        reason = clip(described(verdict, verdict.reason), 4000) or "human_approval"
        return await self._store.submit(
            agent=call.agent,
            tool=call.tool,
            args_digest=terms.digest,
            args_shape=terms.shape,
            reason=reason,
            created_at=now,
            expires_at=now + self._timeout,
            policy=verdict.provenance.policy,
            source_file=verdict.provenance.source_file,
            rule_index=verdict.provenance.rule_index,
            injection_findings=terms.findings,
            approver=Approver.OPERATOR if verdict.operator_only else Approver.ANY,
            memory_digest=terms.memory_digest,
        )

    async def _question(self, call: ToolCall, terms: _Terms, now: datetime, mode: str) -> tuple[Approval, bool]:
        """The open approval for this exact call that asks the same person, or a new one (recorded, True);
        found or opened as one step for identical calls in this process (``question_locks``)."""
        async with self._asking.held((call.agent, call.tool, terms.digest, terms.verdict.operator_only)):
            return await self._find_or_open(call, terms, now, mode)

    async def _find_or_open(self, call: ToolCall, terms: _Terms, now: datetime, mode: str) -> tuple[Approval, bool]:
        open_id = await self._uses.find_pending(
            call.agent, call.tool, terms.digest, now=now, operator_only=terms.verdict.operator_only
        )
        if open_id is not None:
            approval = await self._store.get(open_id)
            if approval.pending:
                self._held.hold(approval.id, call.arguments)
                return approval, False
        approval = await self._submit(call, terms, now)
        self._held.hold(approval.id, call.arguments)
        body = approval.request_record()
        body["mode"] = mode
        body["timeout_seconds"] = self.timeout_seconds
        try:
            await self._trace(TRACE_REQUESTED, body)
        except BaseException:
            # Not in the chain, so it must not be approvable: end it as the refusal it now is.
            self._held.release(approval.id)
            with anyio.CancelScope(shield=True):
                try:
                    await self._resolutions.expire_one(approval)
                except Exception:  # noqa: BLE001 -- the trace failure is the error to report
                    logger.error("approval %s could not be expired after a trace failure", approval.id)
            raise
        activity("approval_asked", {
            "approval_id": approval.id, "agent": sanitize(call.agent), "tool": sanitize(call.tool),
            "rule": rule_of(approval.source_file, approval.rule_index, approval.policy,
                            terms.verdict.provenance.line),
            "mode": mode,
            "approver": approval.approver.value,
        })
        if self._on_pending is not None:
            self._on_pending(approval)
        return approval, True


__all__ = ["DEFAULT_TIMEOUT_SECONDS", "TRACE_REQUESTED", "ApprovalEngine", "DigestKey"]
