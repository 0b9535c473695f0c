"""2025-11-25 tasks on the wire, as the gateway passes them through: the names, the capability it may
declare, and the one rewrite a task crosses with (its id).

Invariant: a task id never crosses the gateway unchanged. An upstream's ``taskId`` is replaced by one
the gateway issued (``serve/task_book.py`` keeps which agent and which upstream it stands for) in
every message that names it on the way to the agent -- a ``CreateTaskResult``'s ``task``, the
``Task`` of ``tasks/get``, ``tasks/cancel``, ``tasks/list`` and ``notifications/tasks/status``, and
the ``io.modelcontextprotocol/related-task`` key of a ``tasks/result`` payload's ``_meta`` -- and
back on the way to the upstream, and in any other message an upstream sends about a task (the same
``_meta`` key on a notification or a request, which goes to the task's agent alone); nothing else of
these messages is changed. The gateway declares
task support (the ``tasks`` capability, ``requests.tools.call`` only) to a handshake-era agent only
when an upstream offers task-augmented ``tools/call``; it never declares tasks for sampling or
elicitation, and the 2026-07-28 Tasks extension is not offered (a 2026-07-28 call is answered as one
request). So a tool that runs only as a task (``execution.taskSupport: "required"``) cannot be called
in that era: it is left out of a 2026-07-28 agent's ``tools/list`` and a call to it is refused
(``TASK_ONLY_IN_MODERN``) before it is decided or sent. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

TASKS_GET: Final = "tasks/get"
TASKS_RESULT: Final = "tasks/result"
TASKS_LIST: Final = "tasks/list"
TASKS_CANCEL: Final = "tasks/cancel"
TASK_STATUS: Final = "notifications/tasks/status"
RELATED_TASK: Final = "io.modelcontextprotocol/related-task"
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
TASK_ONLY_IN_MODERN: Final = (
    'invalid params: this tool runs only as a task (execution.taskSupport "required"), and a 2026-07-28 '
    "call is answered as one request (the gateway offers no Tasks extension); call it from a 2025-11-25 session"
)


def _section(caps: Mapping[str, Any], *path: str) -> Mapping[str, Any] | None:
    node: Any = caps
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else None


def offers_task_calls(caps: Mapping[str, Any] | None) -> bool:
    """Whether an upstream's capabilities accept task-augmented ``tools/call`` (2025-11-25)."""
    return caps is not None and _section(caps, "tasks", "requests", "tools", "call") is not None


def task_capability(upstream_caps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ``tasks`` capability the gateway declares, or None when no upstream runs tool calls as tasks.

    ``list`` is always offered (the gateway answers it from its own table); ``cancel`` when an upstream
    that runs tool calls as tasks also cancels them.
    """
    runners = [caps for caps in upstream_caps if offers_task_calls(caps)]
    if not runners:
        return None
    out: dict[str, Any] = {"list": {}, "requests": {"tools": {"call": {}}}}
    if any(_section(caps, "tasks", "cancel") is not None for caps in runners):
        out["cancel"] = {}
    return out


def task_only(tool: Mapping[str, Any]) -> bool:
    """Whether a listed tool refuses a call that is not task-augmented (``execution.taskSupport:
    "required"``), so that a 2026-07-28 agent, whose calls the gateway never sends as tasks, could
    only see it fail."""
    execution = tool.get("execution")
    return isinstance(execution, Mapping) and execution.get("taskSupport") == "required"


def created_task(result: Any) -> Mapping[str, Any] | None:
    """The ``task`` of a ``CreateTaskResult`` (an object with a string ``taskId``), else None."""
    if not isinstance(result, Mapping) or "content" in result:
        return None
    task = result.get("task")
    return task if isinstance(task, Mapping) and isinstance(task.get("taskId"), str) else None


def task_id_param(params: Any) -> str | None:
    """The ``taskId`` a ``tasks/*`` request names, or None when it names none (a string)."""
    value = params.get("taskId") if isinstance(params, Mapping) else None
    return value if isinstance(value, str) else None


def renamed_task(task: Mapping[str, Any], task_id: str) -> dict[str, Any]:
    """A ``Task`` (or a result or notification params made of one) under another id."""
    return {**task, "taskId": task_id}


def created_result(result: Mapping[str, Any], task_id: str) -> dict[str, Any]:
    """A ``CreateTaskResult`` whose task carries ``task_id``."""
    task = result["task"]
    return {**result, "task": renamed_task(task, task_id)}


def related_renamed(result: Any, task_id: str) -> Any:
    """A ``tasks/result`` payload whose ``_meta`` related-task key names ``task_id`` (when it names one)."""
    if not isinstance(result, Mapping):
        return result
    meta = result.get("_meta")
    related = meta.get(RELATED_TASK) if isinstance(meta, Mapping) else None
    if not isinstance(related, Mapping):
        return result
    assert isinstance(meta, Mapping)
    return {**result, "_meta": {**meta, RELATED_TASK: {**related, "taskId": task_id}}}


def related_task_id(params: Any) -> str | None:
    """The task a message says it belongs to (``_meta`` related-task key), or None."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    related = meta.get(RELATED_TASK) if isinstance(meta, Mapping) else None
    task_id = related.get("taskId") if isinstance(related, Mapping) else None
    return task_id if isinstance(task_id, str) else None


def task_status(task: Any) -> str | None:
    status = task.get("status") if isinstance(task, Mapping) else None
    return status if isinstance(status, str) else None


__all__ = [
    "RELATED_TASK",
    "TASKS_CANCEL",
    "TASKS_GET",
    "TASKS_LIST",
    "TASKS_RESULT",
    "TASK_ONLY_IN_MODERN",
    "TASK_STATUS",
    "TERMINAL",
    "created_result",
    "created_task",
    "offers_task_calls",
    "related_renamed",
    "related_task_id",
    "renamed_task",
    "task_capability",
    "task_id_param",
    "task_only",
    "task_status",
]
