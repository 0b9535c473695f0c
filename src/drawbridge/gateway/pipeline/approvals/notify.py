"""Approval notifications: each pending approval posted to the operator's webhooks (``approval.notify``).

Invariant: a notification never holds up a call or its approval. The engine hands a new question to
``ApprovalNotifier.pending``, which only puts it on each target's bounded queue (full: it is dropped,
and a WARNING line counts the drops); a worker per target posts it. One POST per approval and target,
from the process that opened the approval (so replicas on one state notify once), retried at most
``MAX_ATTEMPTS`` times in all with backoff after a 5xx or a connection failure, never after a 4xx; a
redirect is a failure and is not followed (the URL carries a credential that must not be replayed
elsewhere); no proxy is taken from the environment. Each attempt is bounded by the target's
``timeout_seconds`` as a whole. Only a response's status is read, never its body (the response is
streamed and closed unread), so no receiver can fill the gateway's memory. The URL appears in no log
line: a target is named by its ``url_env``, a failure by its status or its exception's type (an
exception's text may hold the URL). What is posted is ``approval.notices``: no argument value, no
token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import anyio
from anyio.abc import ObjectSendStream, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from drawbridge.activity_log import activity
from drawbridge.approval.notices import PendingNotice, notice_bytes, rule_named
from drawbridge.config_notify import NotifyTarget
from drawbridge.state.approvals import Approval
from drawbridge.state.sqlite import to_db_time

if TYPE_CHECKING:
    import httpx

QUEUE_SIZE: Final = 100
MAX_ATTEMPTS: Final = 3
BACKOFF_SECONDS: Final = 1.0
"""The wait before the second attempt; doubled before the third."""
HEADERS: Final = {"Content-Type": "application/json", "User-Agent": "drawbridge-approval-notify"}


class _Target:
    """One webhook: its queue (both ends: the engine sends, its worker receives) and how many notices
    it dropped so far."""

    def __init__(self, config: NotifyTarget, queue_size: int) -> None:
        self.config = config
        self.send: ObjectSendStream[tuple[str, bytes]]
        self.receive: MemoryObjectReceiveStream[tuple[str, bytes]]
        self.send, self.receive = anyio.create_memory_object_stream[tuple[str, bytes]](queue_size)
        self.dropped = 0


class ApprovalNotifier:
    """Posts each pending approval to every target, in the background (module docstring).

    ``console`` says whether this gateway serves the console an approval's link would open.
    """

    def __init__(
        self, targets: Sequence[NotifyTarget], *, console: bool, backoff_seconds: float = BACKOFF_SECONDS,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._targets = [_Target(target, queue_size) for target in targets]
        self._console = console
        self._backoff = backoff_seconds

    def pending(self, approval: Approval) -> None:
        """A question was opened here: queue its notice for each target; never waits, never raises."""
        try:
            self._queue(approval)
        except Exception as exc:  # noqa: BLE001 -- a notice must never fail the question it is about
            activity("approval_notify_failed", {"approval_id": approval.id, "problem": type(exc).__name__},
                     logging.WARNING)

    def _queue(self, approval: Approval) -> None:
        for target in self._targets:
            console = target.config.console_url
            notice = PendingNotice(
                approval.id, approval.agent, approval.tool,
                rule_named(approval.policy, approval.rule_index, approval.source_file), approval.reason,
                to_db_time(approval.expires_at),
                f"{console}/console/approvals/{approval.id}" if console and self._console else None,
            )
            try:
                target.send.send_nowait((approval.id, notice_bytes(notice, target.config.format)))
            except anyio.WouldBlock:
                target.dropped += 1
                activity("approval_notify_dropped", {
                    "target": target.config.url_env, "approval_id": approval.id, "dropped": target.dropped,
                }, logging.WARNING)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the gateway is stopping

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The workers, one per target, until cancelled (the gateway's task group)."""
        import httpx  # the HTTP client is loaded by a gateway that notifies, not by every gateway

        async with httpx.AsyncClient(follow_redirects=False, trust_env=False, headers=HEADERS) as client:
            async with anyio.create_task_group() as workers:
                for target in self._targets:
                    workers.start_soon(self._work, client, target)
                task_status.started()

    async def _work(self, client: httpx.AsyncClient, target: _Target) -> None:
        async with target.receive:
            async for approval_id, body in target.receive:
                await self._deliver(client, target.config, approval_id, body)

    async def _deliver(
        self, client: httpx.AsyncClient, target: NotifyTarget, approval_id: str, body: bytes
    ) -> None:
        """Post one notice: retried after a 5xx or a connection failure, given up with one WARNING line."""
        import httpx

        failure = ""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            if attempt > 1:
                await anyio.sleep(self._backoff * 2 ** (attempt - 2))
            try:
                with anyio.fail_after(target.timeout_seconds):
                    # Streamed and closed unread: only the status counts, and a receiver's body, however
                    # large, never reaches this process's memory.
                    async with client.stream(
                        "POST", target.url, content=body, timeout=target.timeout_seconds
                    ) as response:
                        pass
            except TimeoutError:
                failure = "timeout"
                continue
            except httpx.TransportError as exc:
                failure = type(exc).__name__
                continue
            except Exception as exc:  # noqa: BLE001 -- a worker outlives any one notice
                failure = type(exc).__name__
                break
            if response.is_success:
                return
            failure = f"status {response.status_code}"
            if response.is_redirect:
                failure += " (a redirect, not followed)"
            if response.status_code < 500:
                break  # a 4xx is the receiver's no; a 3xx is a redirect, never followed
        activity("approval_notify_failed", {
            "target": target.url_env, "approval_id": approval_id, "problem": failure, "attempts": attempt,
        }, logging.WARNING)


__all__ = ["BACKOFF_SECONDS", "MAX_ATTEMPTS", "QUEUE_SIZE", "ApprovalNotifier"]
