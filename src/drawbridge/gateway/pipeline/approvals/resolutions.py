"""How approvals end in this process: resolved through a channel, expired, or left unanswerable.

Invariant: every resolution this process makes or observes is recorded in the trace chain once
(``approval_resolved``, or ``approval_by_memory`` for memory's own rows) and wakes every call
waiting on that approval, and lets go of the arguments held for showing it
(``held_arguments``). ``resolve`` is the single entry point of every channel (control plane,
CLI through the control plane, console, TTY, elicitation); the gateway's own channels (``memory``,
``system``) are not open to it. A wait ends in a resolution or, at the deadline, in the approval
expired in the store (recorded): a call never waits beyond its approval's ``expires_at``, nor
beyond the timeout. A call that can no longer run (its upstream is gone, the gateway stops) ends the
approval this process opened for it, when no other call waits on it (``withdrawable``): expired
(``system:unanswerable``), recorded, rather than left open for nobody until its timeout or a restart.

Theory of operation. Waiting uses one ``anyio.Event`` per approval id, set by ``resolve``, by
every expiry and by another replica's notification (``ended_elsewhere``, from PostgreSQL's
``NOTIFY``), and, as a fallback for a resolution written by another process, a poll of the store
every ``poll_seconds``. A 2025-11-25 client that can be asked in-band is asked while the call
waits (``await_resolution`` with an ``Elicit``); its answer resolves through ``resolve`` (channel
``elicitation``), and when it answers with an error the approval ends at once
(``system:unanswerable``) if no other channel reaches a person, else the wait goes on. A
resolution is recorded once per process: the ids recorded lately are kept (at most
``_RECORDED_CAP``), under a lock, so that racing waiters, the sweeper and the channel that
resolved do not record it twice; a resolution observed from another process is recorded by the
gateway that notices it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Final

import anyio

from drawbridge.activity_log import activity
from drawbridge.approval.channels import Channel
from drawbridge.canonical import sanitize
from drawbridge.gateway.pipeline.approvals.grants import Clock, TraceAppend
from drawbridge.gateway.pipeline.approvals.held_arguments import HeldArguments
from drawbridge.gateway.pipeline.approvals.questions import Elicit, question_params
from drawbridge.gateway.pipeline.approvals.settlement import interpret_answer, read_decision
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.state.approvals import (
    RESOLVED_BY_TIMEOUT,
    AlreadyResolved,
    Approval,
    ApprovalError,
    ApprovalExpired,
    ApprovalStatus,
    ApprovalStore,
)

logger = logging.getLogger("drawbridge.approval")

TRACE_RESOLVED: Final = "approval_resolved"
UNANSWERABLE: Final = (
    "the agent's client answered the approval question with an error, and no other channel reaches a "
    "person: approval unavailable"
)
_RECORDED_CAP: Final = 65_536


class _Wait:
    __slots__ = ("event", "waiters")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.waiters = 0


class Resolutions:
    """The ends of the approvals in one queue, as this process makes and observes them (module docstring)."""

    def __init__(
        self,
        store: ApprovalStore,
        trace_append: TraceAppend,
        *,
        clock: Clock,
        timeout_seconds: float,
        poll_seconds: float,
        held: HeldArguments | None = None,
    ) -> None:
        self._store = store
        self._held = held if held is not None else HeldArguments()
        self._trace = trace_append
        self._clock = clock
        self._timeout_seconds = timeout_seconds
        self._poll = poll_seconds
        self._waits: dict[str, _Wait] = {}
        self._calls: dict[int, tuple[Approval, bool]] = {}
        """The approval each waiting call (by ``id``) waits on, and whether this process opened it."""
        self._recorded: OrderedDict[str, None] = OrderedDict()
        self._record_lock = anyio.Lock()

    # -- resolving (every channel) -------------------------------------------------------------

    async def resolve(
        self,
        id_or_prefix: str,
        decision: ApprovalStatus | str,
        resolved_by: str,
        channel: Channel | str,
        reason: str = "",
    ) -> Approval:
        """Approve or deny a pending approval through ``channel``; wakes the waiting call at once."""
        status = read_decision(decision)
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

    # -- expiring ------------------------------------------------------------------------------

    async def recover_after_restart(self, usable_since: datetime, key_id: str) -> list[Approval]:
        """Every approval a previous process left pending, or approved and unused under another binding
        key than ``key_id`` (``ApprovalStore.recover_after_restart``), becomes expired (``system:restart``),
        recorded."""
        recovered = await self._store.recover_after_restart(self._clock(), usable_since=usable_since, key_id=key_id)
        for approval in recovered:
            await self._record_resolution(approval)
        return recovered

    async def expire_due(self, now: datetime) -> list[Approval]:
        """Expire every pending approval due at ``now``, record each, and wake its waiters."""
        expired = await self._store.expire_due(now)
        for approval in expired:
            try:
                await self._record_resolution(approval)
            finally:
                self._wake(approval.id)
        return expired

    async def expire_one(self, approval: Approval) -> Approval:
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

    # -- waiting -------------------------------------------------------------------------------

    async def await_resolution(
        self, call: ToolCall, approval: Approval, elicit: Elicit | None, *, others: bool = True,
        link: Callable[[ToolCall, Approval], Awaitable[None]] | None = None, opened: bool = False,
    ) -> Approval:
        """Wait for this approval to end, asking in-band through ``elicit`` (or sending the approval's
        console link through ``link``, which only asks) meanwhile when given. ``opened``: this process
        opened it for this call (``withdrawable``)."""
        wait = self._waits.get(approval.id)
        if wait is None:
            wait = self._waits[approval.id] = _Wait()
        wait.waiters += 1
        self._calls[id(call)] = (approval, opened)
        try:
            remaining = min(
                max((approval.expires_at - self._clock()).total_seconds(), 0.0), self._timeout_seconds
            )
            resolved: Approval | None = None
            with anyio.move_on_after(remaining):
                async with anyio.create_task_group() as tg:
                    if elicit is not None:
                        tg.start_soon(self._ask_in_band, call, approval, elicit, others)
                    if link is not None:
                        tg.start_soon(link, call, approval)
                    resolved = await self._watch(approval.id, wait)
                    tg.cancel_scope.cancel()
            if resolved is None:
                with anyio.CancelScope(shield=True):
                    resolved = await self._time_out(approval)
            return resolved
        finally:
            self._calls.pop(id(call), None)
            wait.waiters -= 1
            if wait.waiters == 0 and self._waits.get(approval.id) is wait:
                del self._waits[approval.id]

    async def _watch(self, approval_id: str, wait: _Wait) -> Approval:
        while True:
            with anyio.move_on_after(self._poll):
                await wait.event.wait()
            current = await self._store.get(approval_id)
            if not current.pending:
                await self.ensure_recorded(current)
                return current

    async def _ask_in_band(self, call: ToolCall, approval: Approval, elicit: Elicit, others: bool) -> None:
        try:
            answer = await elicit(call, question_params(call, approval, self._clock()))
        except Exception as exc:  # noqa: BLE001 -- the other channels can still resolve it
            if others:
                logger.warning("in-band approval question failed (%s); waiting for other channels",
                               type(exc).__name__)
                return
            logger.warning("in-band approval question failed (%s) and no other channel reaches a person; "
                           "the call is refused", type(exc).__name__)
            await self.end_unanswerable(approval, UNANSWERABLE)
            return
        status, reason = interpret_answer(answer)
        try:
            await self.resolve(approval.id, status, f"mcp-client:{call.agent}", Channel.ELICITATION, reason)
        except AlreadyResolved:
            pass  # another channel was first; that resolution stands
        except ApprovalError as exc:
            logger.warning("in-band answer could not be applied (%s)", type(exc).__name__)

    async def end_unanswerable(self, approval: Approval, reason: str) -> Approval:
        """End an approval nobody can answer any more, or whose call can no longer run: expired
        (``system:unanswerable``, with ``reason``), recorded, its waiters woken; as stored."""
        current = await self._store.expire_unanswerable(approval.id, reason, self._clock())
        await self.ensure_recorded(current)
        self._wake(approval.id)
        return current

    def withdrawable(self, call: ToolCall) -> Approval | None:
        """The approval ``call`` waits on, when ending it (``end_unanswerable``, as the call can no longer
        run) harms no other call: this process opened it for this call and no other call here waits on
        it. One opened elsewhere is its opener's to end."""
        waiting = self._calls.get(id(call))
        if waiting is None or not waiting[1]:
            return None
        wait = self._waits.get(waiting[0].id)
        return waiting[0] if wait is not None and wait.waiters == 1 else None

    async def _time_out(self, approval: Approval) -> Approval:
        """The deadline passed: this approval becomes expired (recorded), whatever the clock says."""
        current = await self.expire_one(approval)
        await self.ensure_recorded(current)
        self._wake(approval.id)
        return current

    def _wake(self, approval_id: str) -> None:
        """The approval ended: wake the calls waiting on it and let go of its arguments."""
        self._held.release(approval_id)
        wait = self._waits.get(approval_id)
        if wait is not None:
            wait.event.set()

    def ended_elsewhere(self, approval_id: str | None) -> None:
        """Another replica says ``approval_id`` ended (None: some may have, unsaid): wake its waiters,
        which read the store; each waiter then waits on a fresh event, so a wake that finds the
        approval still pending never turns the wait into a busy loop."""
        ids = list(self._waits) if approval_id is None else [approval_id]
        for key in ids:
            if (wait := self._waits.get(key)) is not None:
                fired, wait.event = wait.event, anyio.Event()
                fired.set()

    # -- recording -----------------------------------------------------------------------------

    async def record_resolved(self, kind: str, body: Mapping[str, Any], approval_id: str) -> None:
        """Record ``body`` as ``kind``, the one record of this approval's resolution in this process."""
        async with self._record_lock:
            await self._trace(kind, body)
            self._mark_recorded(approval_id)

    async def ensure_recorded(self, approval: Approval) -> None:
        """Record the resolution of ``approval`` unless it is pending or this process recorded it."""
        if not approval.pending:
            self._held.release(approval.id)
            await self._record_resolution(approval)

    def _mark_recorded(self, approval_id: str) -> None:
        self._recorded[approval_id] = None
        while len(self._recorded) > _RECORDED_CAP:
            self._recorded.popitem(last=False)

    async def _record_resolution(self, approval: Approval) -> None:
        async with self._record_lock:
            if approval.id in self._recorded:
                return
            body = approval.resolution_record()
            await self._trace(TRACE_RESOLVED, body)
            self._mark_recorded(approval.id)
        activity("approval_resolved", {
            "approval_id": approval.id, "agent": sanitize(approval.agent), "tool": sanitize(approval.tool),
            "status": body["status"], "by": sanitize(body["resolved_by"]), "channel": body["channel"],
        })


__all__ = ["TRACE_RESOLVED", "UNANSWERABLE", "Resolutions"]
