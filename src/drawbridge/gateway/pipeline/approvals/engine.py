"""The approval engine: what happens to a tools/call whose policy says ``human_approval``.

Invariant: such a call runs only if one of these holds, and the trace chain
says which: an active temporal grant matches it (``approval_by_grant``);
approval memory approves it (``approval_by_memory``); or a person approved
exactly this call (same agent, tool and keyed argument digest) through some
channel before the timeout (``approval_resolved``, with who, when, channel,
strength and reason), and that approval has not been used by another call.
One approval lets one call through, whichever channel resolved it and
whichever transport the call came in on. Everything else -- a denial, the
timeout, a restart, a forged or replayed ``requestState``, a failure of the
store or of the trace -- ends in deny. A ``deny`` verdict is never lifted.

Theory of operation. ``settle(call, verdict, elicitation_supported=...)``
follows this order:

1. ``allow`` and ``deny`` verdicts pass through untouched.
2. The keyed argument digest: ``binding(arguments)`` when given (the
   gateway passes its own), else ``approval.binding.binding_digest`` under
   ``key_for_args_digest``: it covers every key, secret-like ones included, so
   a retry that changes only a password cannot ride on an approval;
   a call whose arguments have no canonical form cannot be bound to an
   approval and is denied.
3. Active grant for (agent, tool) -> allow, recorded.
4. Expire what is due (recorded), then: the oldest resolution of this exact
   call that no call has used yet (``state.approval_uses``) is claimed
   atomically and delivered -- approved runs, denied or expired is told.
   This is how a retried call proceeds after the person decided. It comes
   before memory on purpose: a person's answer to this very call is more
   specific than memory and is recorded with its stronger strength.
5. Approval memory (``approval.memory.decide``), skipped when the arguments
   look like injected instructions -> an approval row resolved through the
   ``memory`` channel, used at once by this call, recorded.
6. The open question for this exact call, if any, else a new approval
   (``approval_requested``). Then, by what the client can do:

   * 2026-07-28 client with elicitation: an ``InputRequiredResult`` whose
     ``requestState`` is sealed (``approval.request_state``) and bound to
     agent, tool, argument digest, approval id and expiry. The retry goes to
     ``settle_retry``, which opens the state, applies the answer through
     ``resolve`` (channel ``elicitation``), and claims the approval: a second
     use of the same state finds it used and is denied as a replay.
   * 2025-11-25 client with elicitation and an ``elicit`` callback: wait,
     asking in-band at the same time; the answer resolves through
     ``resolve`` (channel ``elicitation``, strength ``client``).
   * otherwise, non-blocking mode: answer at once with an ``isError`` result
     naming the approval id and how to retry (step 5 picks it up).
   * otherwise, blocking: wait.

   Waiting uses one ``anyio.Event`` per approval id, set by ``resolve`` --
   the single entry point of every channel (control plane, CLI through the
   control plane, console, TTY, elicitation) -- and, as a fallback for a
   resolution written by another process, a poll of the store every
   ``poll_seconds``. At the deadline the approval is expired in the store
   (recorded) and the call denied. A waiter whose resolution another
   identical call claimed first goes round again (a new question).

``start()`` runs once before the gateway accepts calls: every approval still
pending from a previous process becomes expired (``system:restart``) and is
recorded; it is never approved. ``sweep()`` expires what is due.

Trace kinds written here: ``approval_requested``, ``approval_resolved``,
``approval_by_memory``, ``approval_by_grant``, ``approval_state_refused``;
``grant_created`` / ``grant_revoked`` through ``GrantService``
(``grant_service``). The bodies carry digests, shapes and names, never
argument values. A resolution is recorded once per process (a resolution
observed from another process is recorded by the gateway that notices it).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Protocol

import anyio

from drawbridge.approval.binding import binding_digest
from drawbridge.approval.channels import Channel, Strength, strength_of
from drawbridge.approval.memory import MEMORY_RESOLVER, MemoryConfig, decide
from drawbridge.approval.request_state import RequestStateError, check_key_ring, open_state, seal
from drawbridge.approval.shape import ArgumentShape, ShapeError, argument_shape, injection_findings
from drawbridge.canonical import sanitize
from drawbridge.gateway.pipeline.approvals.grants import GrantService
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import REFUSAL_META_KEY, Action, Verdict
from drawbridge.state.approval_uses import ApprovalUses, SqliteApprovalUses
from drawbridge.state.approvals import (
    RESOLVED_BY_RESTART,
    RESOLVED_BY_TIMEOUT,
    RESOLVED_BY_UNANSWERABLE,
    AlreadyResolved,
    Approval,
    ApprovalError,
    ApprovalExpired,
    ApprovalStatus,
    ApprovalStore,
    SqliteApprovalStore,
)
from drawbridge.state.grants import Grant, GrantStore, SqliteGrantStore
from drawbridge.state.ids import UnknownId
from drawbridge.state.sqlite import StateDB, to_db_time

logger = logging.getLogger("drawbridge.approval")

TRACE_REQUESTED: Final = "approval_requested"
TRACE_RESOLVED: Final = "approval_resolved"
TRACE_BY_MEMORY: Final = "approval_by_memory"
TRACE_BY_GRANT: Final = "approval_by_grant"
TRACE_STATE_REFUSED: Final = "approval_state_refused"

INPUT_KEY: Final = "drawbridge_approval"
"""Key of the approval question in ``inputRequests`` / ``inputResponses``."""
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
DEFAULT_TIMEOUT_SECONDS: Final = 300.0
MAX_ROUNDS: Final = 4
UNBINDABLE: Final = "the arguments have no canonical form, so no approval can be bound to them"
NO_CHANNEL: Final = (
    "no channel reaches a person for this call (the client cannot be asked in-band and no control plane "
    "is open): approval unavailable"
)
UNANSWERABLE: Final = (
    "the agent's client answered the approval question with an error, and no other channel reaches a "
    "person: approval unavailable"
)
MAX_REASON_CHARS: Final = 500
_RECORDED_CAP: Final = 65_536

TraceAppend = Callable[[str, Mapping[str, Any]], Awaitable[Any]]
Clock = Callable[[], datetime]
Elicit = Callable[[ToolCall, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""Ask the client in-band: given the call and the ``elicitation/create`` params, return the client's
``ElicitResult`` (``{"action": "accept"|"decline"|"cancel", "content": {...}}``)."""


class DigestKey(Protocol):
    """The keyed-digest key (``gateway.recorder.TruthKey`` fits): bytes and a key id."""

    @property
    def key(self) -> bytes: ...

    @property
    def key_id(self) -> str: ...


def utc_clock() -> datetime:
    return datetime.now(UTC)


def _nonce() -> str:
    return secrets.token_urlsafe(18)


def _clip(text: str | None, limit: int = MAX_REASON_CHARS) -> str:
    if not text:
        return ""
    shown = sanitize(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


# -- the answer --------------------------------------------------------------------------------


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


def _deny(how: str, reason: str, **extra: Any) -> Settlement:
    return Settlement(SettlementKind.DENY, how, reason, **extra)


def interpret_answer(answer: object) -> tuple[ApprovalStatus, str]:
    """A client's elicitation answer as a decision. Only an explicit ``accept`` + ``approve`` approves."""
    if not isinstance(answer, Mapping):
        return ApprovalStatus.DENIED, "the client's answer was not an elicitation result"
    action = answer.get("action")
    content = answer.get("content")
    said = ""
    if isinstance(content, Mapping) and isinstance(content.get("reason"), str):
        said = _clip(content["reason"])
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


def _decision(decision: ApprovalStatus | str) -> ApprovalStatus:
    text = str(decision).strip().lower()
    if text in ("approve", "approved", "allow"):
        return ApprovalStatus.APPROVED
    if text in ("deny", "denied", "reject", "rejected"):
        return ApprovalStatus.DENIED
    raise ValueError("decision must be approve or deny")


# -- the engine --------------------------------------------------------------------------------


class _Wait:
    __slots__ = ("event", "waiters")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.waiters = 0


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
        nonce_source: Callable[[], str] = _nonce,
        retry_window_seconds: float | None = None,
        poll_seconds: float = 1.0,
        binding: Callable[[Mapping[str, Any]], str | None] | None = None,
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
        self._memory = memory_config if memory_config is not None else MemoryConfig()
        self._timeout = timedelta(seconds=timeout_seconds)
        self._clock = clock
        self._non_blocking = non_blocking
        self._elicit = elicit
        self._uses = uses
        if state_keys is None:  # per process: states minted before a restart are refused, as they should be
            state_keys = [secrets.token_bytes(32)]
        elif isinstance(state_keys, (bytes, bytearray)):
            state_keys = [bytes(state_keys)]
        check_key_ring(state_keys)
        self._state_keys: Sequence[bytes] = list(state_keys)
        self._nonce = nonce_source
        self._window = timedelta(seconds=window)
        self._poll = poll_seconds
        self._binding = binding
        self._waits: dict[str, _Wait] = {}
        self._recorded: OrderedDict[str, None] = OrderedDict()
        self._record_lock = anyio.Lock()
        self.grant_service = GrantService(grants, trace_append, clock=clock)

    @classmethod
    def on_state_db(cls, db: StateDB, trace_append: TraceAppend, **options: Any) -> ApprovalEngine:
        """An engine on the embedded SQLite state: approval queue, grants and the use ledger share ``db``."""
        return cls(
            SqliteApprovalStore(db),
            SqliteGrantStore(db),
            trace_append,
            uses=SqliteApprovalUses(db),
            **options,
        )

    @property
    def store(self) -> ApprovalStore:
        return self._store

    @property
    def timeout_seconds(self) -> float:
        return self._timeout.total_seconds()

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> list[Approval]:
        """Once, before the gateway accepts calls: pending approvals of a previous process become expired."""
        recovered = await self._store.recover_after_restart(self._clock())
        for approval in recovered:
            await self._record_resolution(approval)
        return recovered

    async def sweep(self) -> list[Approval]:
        """Expire every pending approval that is due, record each, and wake its waiters."""
        return await self._expire_due(self._clock())

    async def run_sweeper(self, interval_seconds: float = 5.0) -> None:
        """Sweep forever (run in the gateway's task group), so unanswered non-blocking approvals end."""
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # noqa: BLE001 -- keep sweeping; the next settle sweeps too
                logger.error("approval sweep failed: %s", type(exc).__name__)
            await anyio.sleep(interval_seconds)

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
        status = _decision(decision)
        via = Channel(channel)
        if via in (Channel.MEMORY, Channel.SYSTEM):
            raise ValueError(f"the {via} channel is the gateway's own; people resolve through the others")
        at = self._clock()
        try:
            approval = await self._store.resolve(
                id_or_prefix, status, resolved_by=resolved_by, channel=via, reason=reason, at=at
            )
        except ApprovalExpired as exc:
            if exc.approval.resolved_at == at:  # this very call turned it into a timeout
                await self._record_resolution(exc.approval)
            self._wake(exc.approval.id)
            raise
        try:
            await self._record_resolution(approval)
        finally:
            self._wake(approval.id)
        return approval

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
    ) -> Settlement:
        """Settle one call (see the module docstring for the order). ``elicit`` overrides the engine's.

        ``ask=False`` says that no channel reaches a person for this call (the client cannot be asked
        in-band and no operator channel is open): grants, earlier resolutions and memory still apply,
        but instead of opening a question nobody can answer the call is denied at once (``unavailable``).
        ``others=False`` says that only the in-band question reaches a person: should the client answer
        it with an error, the approval ends at once (``system:unanswerable``) instead of at its timeout.
        """
        if verdict.action is Action.DENY:
            return _deny("policy", verdict.reason)
        if verdict.action is Action.ALLOW:
            return Settlement(SettlementKind.ALLOW, "policy", verdict.reason)
        if verdict.action is not Action.HUMAN_APPROVAL:
            return _deny("policy", f"unknown action {verdict.action!r}; failing closed")
        digest = self._digest(call)
        if digest is None:
            return _deny("unbindable", UNBINDABLE)
        now = self._clock()

        # A floor's human_approval (a changed pin) is for a person: grants and memory do not lift it.
        person_only = getattr(verdict, "person_only", False)
        grant = None if person_only else await self._grants.active_for(call.agent, call.tool, now)
        if grant is not None:
            return await self._by_grant(call, grant, digest)

        await self._expire_due(now)
        delivered = await self._deliver_resolution(call, digest)
        if delivered is not None:
            return delivered

        findings = injection_findings(call.arguments)
        try:
            shape: ArgumentShape | None = argument_shape(call.arguments)
        except ShapeError:
            shape = None
        remembered = None if person_only else await self._by_memory(call, verdict, digest, shape, findings, now)
        if remembered is not None:
            return remembered

        in_band = elicit if elicit is not None else self._elicit
        if call.modern:
            mode = "input_required" if elicitation_supported else None
        else:
            mode = "elicitation" if elicitation_supported and in_band is not None else None
        if mode is None and not ask:
            return _deny("unavailable", NO_CHANNEL)
        if mode is None:
            mode = "non_blocking" if self._non_blocking else "blocking"

        for round_ in range(MAX_ROUNDS):
            now = self._clock()
            if round_:
                delivered = await self._deliver_resolution(call, digest)
                if delivered is not None:
                    return delivered
            approval = await self._question(call, verdict, digest, shape, findings, now, mode)
            if mode == "input_required":
                return Settlement(
                    SettlementKind.INPUT_REQUIRED, "input_required",
                    f"approval {approval.short_id} asked in-band; the retry carries the answer",
                    approval_id=approval.id, result=self.input_required(call, approval),
                )
            if mode == "non_blocking":
                return self._pending(call, approval)
            resolved = await self._await_resolution(
                call, approval, in_band if mode == "elicitation" else None, others=others
            )
            if await self._uses.claim(resolved.id, at=self._clock()):
                return self._settled(resolved)
            # Another identical call used this resolution first: ask again.
        return _deny("unsettled", f"no approval could be obtained in {MAX_ROUNDS} rounds; failing closed")

    # -- 2026-07-28: InputRequiredResult and its retry -----------------------------------------

    def question_params(self, call: ToolCall, approval: Approval) -> dict[str, Any]:
        """``elicitation/create`` params (form mode) asking a person about this approval."""
        seconds = int(max(approval.remaining(self._clock()), timedelta(0)).total_seconds())
        message = (
            f"drawbridge: agent {_clip(call.agent, 128)} asks to run tool {_clip(call.tool, 256)}. "
            f"{_clip(approval.reason)}. Approve this one call? (approval {approval.short_id}, open for "
            f"{seconds} s; the argument values are not repeated here)"
        )
        if approval.injection_findings:
            message += " Warning: the arguments look like injected instructions (" + ", ".join(
                approval.injection_findings
            ) + ")."
        return {"mode": "form", "message": message, "requestedSchema": dict(REQUESTED_SCHEMA)}

    def input_required(self, call: ToolCall, approval: Approval) -> dict[str, Any]:
        """The ``InputRequiredResult`` (2026-07-28) asking about ``approval``, sealed ``requestState``."""
        state = seal(
            self._state_keys,
            agent=approval.agent,
            tool=approval.tool,
            args_digest=approval.args_digest,
            approval_id=approval.id,
            expires_at=approval.expires_at,
            nonce=self._nonce(),
        )
        return {
            "resultType": "input_required",
            "inputRequests": {
                INPUT_KEY: {"method": "elicitation/create", "params": self.question_params(call, approval)}
            },
            "requestState": state,
        }

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
            return _deny("unbindable", UNBINDABLE)
        now = self._clock()
        try:
            payload = open_state(
                self._state_keys, request_state, agent=call.agent, tool=call.tool, args_digest=digest, now=now
            )
        except RequestStateError as exc:
            await self._trace(
                TRACE_STATE_REFUSED,
                {"agent": call.agent, "tool": call.tool, "args_digest": digest, "problem": exc.code,
                 "at": to_db_time(now)},
            )
            return _deny(f"request_state invalid: {exc.code}", str(exc))
        try:
            approval = await self._store.get(payload.approval_id)
        except UnknownId:
            return _deny("request_state invalid: unknown approval",
                         "the approval named in request_state is not in the queue")
        if (approval.agent, approval.tool, approval.args_digest) != (call.agent, call.tool, digest):
            return _deny(
                "request_state invalid: mismatch", "request_state names an approval for another call"
            )

        answer = input_responses.get(INPUT_KEY) if isinstance(input_responses, Mapping) else None
        said_no: str | None = None
        if answer is not None:
            status, reason = interpret_answer(answer)
            if status is ApprovalStatus.DENIED:
                said_no = reason
            try:
                approval = await self.resolve(
                    approval.id, status, f"mcp-client:{call.agent}", Channel.ELICITATION, reason
                )
            except AlreadyResolved as exc:
                approval = exc.approval
                await self._ensure_recorded(approval)
        else:
            approval = await self._store.get(approval.id)
            await self._ensure_recorded(approval)
        if approval.pending:
            return _deny(
                "unanswered", f"approval {approval.short_id}: the retry carried no answer to the question"
            )
        if not await self._uses.claim(approval.id, at=self._clock()):
            return _deny(
                "request_state invalid: replayed",
                f"approval {approval.short_id} was already used; a request_state works once",
                approval_id=approval.id,
            )
        if said_no is not None and approval.permits:
            # Approved elsewhere first, but the person at the client said no: this call does not run,
            # and the approval is now used, so no other call can ride on it either.
            return _deny(
                f"denied via {Channel.ELICITATION}",
                f"approval {approval.short_id} was approved by {_clip(approval.resolved_by, 128)}, but the "
                f"answer in the client was no ({said_no}); the call is refused",
                approval_id=approval.id, channel=Channel.ELICITATION, strength=Strength.CLIENT,
            )
        return self._settled(approval)

    # -- steps ---------------------------------------------------------------------------------

    async def _deliver_resolution(self, call: ToolCall, digest: str) -> Settlement | None:
        """Claim the oldest unused resolution of exactly this call, if any, and answer with it."""
        now = self._clock()
        used = await self._uses.claim_resolved(
            call.agent, call.tool, digest, since=now - self._window, at=now
        )
        if used is None:
            return None
        approval = await self._store.get(used)
        await self._ensure_recorded(approval)
        return self._settled(approval)

    def _digest(self, call: ToolCall) -> str | None:
        if self._binding is not None:
            return self._binding(call.arguments)
        return binding_digest(dict(call.arguments), bytes(self._key.key), self._key.key_id)

    async def _by_grant(self, call: ToolCall, grant: Grant, digest: str) -> Settlement:
        at = self._clock()
        await self._trace(
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
            f"allowed by grant {grant.id} (granted by {_clip(grant.granted_by, 128)}, until "
            f"{to_db_time(grant.expires_at)})",
            grant_id=grant.id,
            resolved_by=grant.granted_by,
        )

    async def _by_memory(
        self,
        call: ToolCall,
        verdict: Verdict,
        digest: str,
        shape: ArgumentShape | None,
        findings: tuple[str, ...],
        now: datetime,
    ) -> Settlement | None:
        if not self._memory.enabled:
            return None
        counts = None
        if shape is not None and not findings:
            counts = await self._store.memory_counts(call.agent, call.tool, shape.digest)
        decision = decide(self._memory, counts, injection_suspected=bool(findings))
        if not decision.auto_approve:
            return None
        submitted = await self._submit(call, verdict, digest, shape, findings, now)
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
            "min_approvals": self._memory.min_approvals,
            "count_client_answers": self._memory.count_client_answers,
        }
        async with self._record_lock:
            await self._trace(TRACE_BY_MEMORY, body)
            self._mark_recorded(approval.id)
        return Settlement(
            SettlementKind.ALLOW, "memory", decision.reason, approval_id=approval.id,
            resolved_by=MEMORY_RESOLVER, channel=Channel.MEMORY, strength=Strength.MEMORY,
        )

    async def _submit(
        self,
        call: ToolCall,
        verdict: Verdict,
        digest: str,
        shape: ArgumentShape | None,
        findings: tuple[str, ...],
        now: datetime,
    ) -> Approval:
        reason = _clip(f"{verdict.provenance.label()}: {verdict.reason}", 4000) or "human_approval"
        return await self._store.submit(
            agent=call.agent,
            tool=call.tool,
            args_digest=digest,
            args_shape=shape,
            reason=reason,
            created_at=now,
            expires_at=now + self._timeout,
            policy=verdict.provenance.policy,
            source_file=verdict.provenance.source_file,
            rule_index=verdict.provenance.rule_index,
            injection_findings=findings,
        )

    async def _question(
        self,
        call: ToolCall,
        verdict: Verdict,
        digest: str,
        shape: ArgumentShape | None,
        findings: tuple[str, ...],
        now: datetime,
        mode: str,
    ) -> Approval:
        """The open approval for this exact call, or a new one (recorded)."""
        open_id = await self._uses.find_pending(call.agent, call.tool, digest, now=now)
        if open_id is not None:
            approval = await self._store.get(open_id)
            if approval.pending:
                return approval
        approval = await self._submit(call, verdict, digest, shape, findings, now)
        body = approval.request_record()
        body["mode"] = mode
        body["timeout_seconds"] = self.timeout_seconds
        try:
            await self._trace(TRACE_REQUESTED, body)
        except BaseException:
            # Not in the chain, so it must not be approvable: end it as the refusal it now is.
            with anyio.CancelScope(shield=True):
                try:
                    await self._expire_one(approval)
                except Exception:  # noqa: BLE001 -- the trace failure is the error to report
                    logger.error("approval %s could not be expired after a trace failure", approval.id)
            raise
        return approval

    def _pending(self, call: ToolCall, approval: Approval) -> Settlement:
        seconds = int(approval.remaining(self._clock()).total_seconds())
        retry = (
            f"Approval required (id: {approval.id}). Tool {_clip(call.tool, 256)} needs a person's approval "
            f"({_clip(approval.reason)}). Nothing was run. Ask an operator to approve it (for example "
            f"`drawbridge approvals approve {approval.short_id}`), then call {_clip(call.tool, 256)} again "
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

    def _settled(self, approval: Approval) -> Settlement:
        """A resolved approval as the answer for the call that used it."""
        short = approval.short_id
        who = _clip(approval.resolved_by, 128)
        said = _clip(approval.resolution_reason)
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
            return _deny(f"denied by {who} via {channel}", reason + (f": {said}" if said else ""), **common)
        if approval.resolved_by == RESOLVED_BY_TIMEOUT:
            return _deny(
                "timeout",
                f"approval {short} timed out: nobody approved it within {int(self.timeout_seconds)} s",
                **common,
            )
        if approval.resolved_by == RESOLVED_BY_UNANSWERABLE:
            return _deny("unavailable", f"approval {short} could not be obtained: {said}", **common)
        if approval.resolved_by == RESOLVED_BY_RESTART:
            return _deny("expired", f"approval {short} expired: the gateway restarted while it was pending",
                         **common)
        return _deny("expired", f"approval {short} expired ({said or approval.status})", **common)

    # -- waiting -------------------------------------------------------------------------------

    async def _await_resolution(
        self, call: ToolCall, approval: Approval, elicit: Elicit | None, *, others: bool = True
    ) -> Approval:
        wait = self._waits.get(approval.id)
        if wait is None:
            wait = self._waits[approval.id] = _Wait()
        wait.waiters += 1
        try:
            remaining = min(
                max((approval.expires_at - self._clock()).total_seconds(), 0.0), self.timeout_seconds
            )
            resolved: Approval | None = None
            with anyio.move_on_after(remaining):
                async with anyio.create_task_group() as tg:
                    if elicit is not None:
                        tg.start_soon(self._ask_in_band, call, approval, elicit, others)
                    resolved = await self._watch(approval.id, wait)
                    tg.cancel_scope.cancel()
            if resolved is None:
                with anyio.CancelScope(shield=True):
                    resolved = await self._time_out(approval)
            return resolved
        finally:
            wait.waiters -= 1
            if wait.waiters == 0 and self._waits.get(approval.id) is wait:
                del self._waits[approval.id]

    async def _watch(self, approval_id: str, wait: _Wait) -> Approval:
        while True:
            with anyio.move_on_after(self._poll):
                await wait.event.wait()
            current = await self._store.get(approval_id)
            if not current.pending:
                await self._ensure_recorded(current)
                return current

    async def _ask_in_band(self, call: ToolCall, approval: Approval, elicit: Elicit, others: bool) -> None:
        try:
            answer = await elicit(call, self.question_params(call, approval))
        except Exception as exc:  # noqa: BLE001 -- the other channels can still resolve it
            if others:
                logger.warning("in-band approval question failed (%s); waiting for other channels",
                               type(exc).__name__)
                return
            logger.warning("in-band approval question failed (%s) and no other channel reaches a person; "
                           "the call is refused", type(exc).__name__)
            current = await self._store.expire_unanswerable(approval.id, UNANSWERABLE, self._clock())
            await self._ensure_recorded(current)
            self._wake(approval.id)
            return
        status, reason = interpret_answer(answer)
        try:
            await self.resolve(approval.id, status, f"mcp-client:{call.agent}", Channel.ELICITATION, reason)
        except AlreadyResolved:
            pass  # another channel was first; that resolution stands
        except ApprovalError as exc:
            logger.warning("in-band answer could not be applied (%s)", type(exc).__name__)

    async def _time_out(self, approval: Approval) -> Approval:
        """The deadline passed: this approval becomes expired (recorded), whatever the clock says."""
        current = await self._expire_one(approval)
        await self._ensure_recorded(current)
        self._wake(approval.id)
        return current

    async def _expire_one(self, approval: Approval) -> Approval:
        """Expire exactly this approval, if still pending; return its stored state.

        The store's ``resolve`` records an answer given at or after ``expires_at`` as the timeout it is
        (``system:timeout``, channel ``system``) and raises ``ApprovalExpired``; the resolver and channel
        passed here are checked but not stored on that path.
        """
        at = max(self._clock(), approval.expires_at)
        try:
            await self._store.resolve(
                approval.id, ApprovalStatus.DENIED, resolved_by=RESOLVED_BY_TIMEOUT,
                channel=Channel.CONTROL_PLANE, reason="", at=at,
            )
        except AlreadyResolved as exc:
            return exc.approval
        # Unreachable with at >= expires_at; read the stored state rather than trust a changed store.
        return await self._store.get(approval.id)

    async def _expire_due(self, now: datetime) -> list[Approval]:
        expired = await self._store.expire_due(now)
        for approval in expired:
            try:
                await self._record_resolution(approval)
            finally:
                self._wake(approval.id)
        return expired

    def _wake(self, approval_id: str) -> None:
        wait = self._waits.get(approval_id)
        if wait is not None:
            wait.event.set()

    # -- recording -----------------------------------------------------------------------------

    def _mark_recorded(self, approval_id: str) -> None:
        self._recorded[approval_id] = None
        while len(self._recorded) > _RECORDED_CAP:
            self._recorded.popitem(last=False)

    async def _record_resolution(self, approval: Approval) -> None:
        async with self._record_lock:
            if approval.id in self._recorded:
                return
            await self._trace(TRACE_RESOLVED, approval.resolution_record())
            self._mark_recorded(approval.id)

    async def _ensure_recorded(self, approval: Approval) -> None:
        if not approval.pending:
            await self._record_resolution(approval)


__all__ = [
    "APPROVE",
    "DENY",
    "INPUT_KEY",
    "REQUESTED_SCHEMA",
    "TRACE_BY_GRANT",
    "TRACE_BY_MEMORY",
    "TRACE_REQUESTED",
    "TRACE_RESOLVED",
    "TRACE_STATE_REFUSED",
    "ApprovalEngine",
    "DigestKey",
    "Elicit",
    "Settlement",
    "SettlementKind",
    "interpret_answer",
]
