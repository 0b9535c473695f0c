"""Which agent owns each task an upstream runs for it: the table behind every ``tasks/*`` request.

Invariant: a task id an agent sees is one the gateway issued (random, never derived from the
upstream's id), and it resolves only for the agent whose allowed ``tools/call`` created the task; for
any other agent, and for an id the gateway never issued, it resolves to nothing, the same nothing, so
an agent learns neither another agent's tasks nor an upstream's ids by guessing. A task enters the
table only when the upstream answered a call the pipeline had decided and forwarded with its task
augmentation (``forwarding.py``), so no task exists here that the policy, the floors and the approvals
did not allow. How a task ended is written to the trace once (``task_ended``), the first time the
gateway sees it end: a status notification, ``tasks/get``, ``tasks/cancel`` or ``tasks/result``.

Theory of operation. Entries are kept per gateway process (tasks do not survive a restart of the
gateway, as the upstream sessions do not), at most ``MAX_TASKS``: beyond that the oldest ended task,
else the oldest task, is forgotten. Status notifications go to the session that created the task
while it is open; afterwards the agent polls with ``tasks/get`` from any of its sessions. So does every
other message an upstream marks as belonging to a task (``related-task`` in its ``_meta``: a log
message, an elicitation while the task is ``input_required``); one marked for a task the gateway does
not hold goes to nobody.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import sanitize
from drawbridge.gateway.protocol.jsonrpc import RequestId
from drawbridge.gateway.protocol.tasks import TASK_STATUS, TERMINAL, renamed_task, task_status
from drawbridge.gateway.serve.agents import AgentSession

logger = logging.getLogger("drawbridge.gateway")

MAX_TASKS: Final = 10_000
TASK_ID_PREFIX: Final = "drawbridge-task-"
UNKNOWN_TASK: Final = "unknown task: this agent holds no task of this id (tasks are only visible to the agent that created them)"

Append = Callable[[str, Mapping[str, Any]], Awaitable[Any]]
"""``EvidenceGuard.append``: one trace entry that is not a call."""


@dataclass(eq=False, slots=True)
class HeldTask:
    """One task an upstream runs for an agent."""

    task_id: str
    """The gateway's id, the only one the agent sees."""
    agent: str
    upstream: str
    upstream_task_id: str
    tool: str
    """The namespaced tool the call named."""
    request_id: RequestId
    """The id of the agent's ``tools/call`` that created the task (its ``tool_decision`` entry)."""
    session: AgentSession
    """The session that created it: where its status notifications go."""
    progress: str | None = None
    """The gateway's progress token of the creating call, routed to the agent until the task ends."""
    ended: bool = False


class TaskBook:
    """The table (module docstring)."""

    def __init__(self, append: Append, *, on_end: Callable[[HeldTask], None] = lambda held: None) -> None:
        self._append = append
        self._on_end = on_end
        """Called once a task ended or is forgotten (the hub drops its progress route)."""
        self._tasks: dict[str, HeldTask] = {}
        self._upstream_ids: dict[tuple[str, str], HeldTask] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def hold(
        self,
        *,
        agent: str,
        upstream: str,
        upstream_task_id: str,
        tool: str,
        request_id: RequestId,
        session: AgentSession,
        progress: str | None = None,
    ) -> HeldTask:
        """A new task the upstream created for an allowed call: its id for the agent."""
        if len(self._tasks) >= MAX_TASKS:
            ended = next((t for t in self._tasks.values() if t.ended), None)
            self.forget(ended if ended is not None else next(iter(self._tasks.values())))
        task_id = TASK_ID_PREFIX + secrets.token_urlsafe(18)
        held = HeldTask(task_id, agent, upstream, upstream_task_id, tool, request_id, session, progress)
        self._tasks[held.task_id] = held
        self._upstream_ids[(upstream, upstream_task_id)] = held
        return held

    def owned(self, agent: str, task_id: str | None) -> HeldTask | None:
        """The task ``task_id`` names, if ``agent`` owns it; None for every other case alike."""
        held = self._tasks.get(task_id) if task_id is not None else None
        return held if held is not None and held.agent == agent else None

    def by_upstream(self, upstream: str, upstream_task_id: str) -> HeldTask | None:
        return self._upstream_ids.get((upstream, upstream_task_id))

    def of_agent(self, agent: str) -> list[HeldTask]:
        return [held for held in self._tasks.values() if held.agent == agent]

    def forget(self, held: HeldTask) -> None:
        self._tasks.pop(held.task_id, None)
        self._upstream_ids.pop((held.upstream, held.upstream_task_id), None)
        self._on_end(held)

    async def seen(self, held: HeldTask, status: str | None) -> None:
        """The gateway learned the task's status: a terminal one is written to the trace, once."""
        if held.ended or status not in TERMINAL:
            return
        held.ended = True
        self._on_end(held)
        request_id = held.request_id
        body = {
            "agent": sanitize(held.agent),
            "tool": held.tool,
            "upstream": held.upstream,
            "task": held.task_id,
            "status": status,
            "request_id": request_id if isinstance(request_id, int) else sanitize(str(request_id))[:128],
        }
        try:
            await self._append("task_ended", body)
        except Exception as exc:  # noqa: BLE001 -- the guard failed the gateway closed; the task is answered
            logger.error("recording how a task ended failed (%s)", type(exc).__name__)

    async def status(self, upstream: str, params: Any) -> None:
        """An upstream's ``notifications/tasks/status``: to the session that created the task, renamed;
        dropped when the task is not one the gateway holds (never broadcast)."""
        task_id = params.get("taskId") if isinstance(params, Mapping) else None
        held = self.by_upstream(upstream, task_id) if isinstance(task_id, str) else None
        if held is None:
            logger.debug("a task status for a task the gateway does not hold was dropped")
            return
        assert isinstance(params, Mapping)
        await self.seen(held, task_status(params))
        message = {"jsonrpc": "2.0", "method": TASK_STATUS, "params": renamed_task(params, held.task_id)}
        await held.session.emit(message, None)


__all__ = ["MAX_TASKS", "UNKNOWN_TASK", "HeldTask", "TaskBook"]
