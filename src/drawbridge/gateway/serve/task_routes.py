"""``tasks/get``, ``tasks/result``, ``tasks/cancel`` and ``tasks/list`` from an agent connection: each
routed to the upstream that runs the task, for the agent that owns it only.

Invariant: a ``tasks/*`` request reaches an upstream only for a task the hub's task book says this
agent owns (``task_book.py``), under the upstream's own id, and what comes back names the gateway's
id; any other id is refused with -32602 ``UNKNOWN_TASK``, the same for a task of another agent, a task
the gateway forgot and an id that never existed, nothing is sent upstream, and the refusal is recorded
with the agent that asked (``DownstreamSession.refuse``: a probe for another's task is traced to
it). ``tasks/list`` is answered by the gateway from the agent's own tasks (one ``tasks/get`` per task
to its upstream), so it never shows another agent's task nor a task an upstream created for a call
the gateway did not forward. Tasks are 2025-11-25 only, and served only while an upstream runs tool
calls as tasks (the gateway then declares them): otherwise, and to a 2026-07-28 request (then
recorded, as refused for its era), ``tasks/*`` is -32601.
"""

from __future__ import annotations

from typing import Any

import anyio

from drawbridge.gateway.protocol.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND
from drawbridge.gateway.protocol.tasks import (
    TASKS_GET,
    TASKS_RESULT,
    offers_task_calls,
    related_renamed,
    renamed_task,
    task_id_param,
    task_status,
)
from drawbridge.gateway.serve.downstream_session import (
    DownstreamSession,
    Inflight,
    error_response,
)
from drawbridge.gateway.serve.task_book import UNKNOWN_TASK, HeldTask
from drawbridge.gateway.upstreams.requests import UpstreamLost, UpstreamUnavailable

NOT_IN_ERA = "method not found: tasks are part of 2025-11-25 (a 2026-07-28 call is answered as one request)"
NO_TASKS = "method not found: no upstream of this gateway runs tool calls as tasks"
NO_CURSOR = "invalid params: the gateway lists an agent's tasks in one page; it issued no cursor"


async def _not_served(session: DownstreamSession, entry: Inflight) -> dict[str, Any] | None:
    if entry.modern:
        return await session.refuse(entry.message.id, METHOD_NOT_FOUND, NOT_IN_ERA)
    if not any(offers_task_calls(upstream.capabilities) for upstream in session.gateway.upstreams.values()):
        return error_response(entry.message.id, METHOD_NOT_FOUND, NO_TASKS)
    return None


async def by_task(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    """``tasks/get``, ``tasks/result``, ``tasks/cancel``: to the upstream of the agent's own task."""
    message = entry.message
    refusal = await _not_served(session, entry)
    if refusal is not None:
        return refusal
    params = message.params if isinstance(message.params, dict) else {}
    held = session.gateway.task_book.owned(session.agent, task_id_param(params))
    upstream = session.gateway.upstreams.get(held.upstream) if held is not None else None
    if held is None or upstream is None:
        return await session.refuse(message.id, INVALID_PARAMS, f"invalid params: {UNKNOWN_TASK}")
    response = await session.relay(entry, upstream, {**params, "taskId": held.upstream_task_id})
    result = response.get("result")
    if "result" not in response:
        return response
    if message.method == TASKS_RESULT:
        response["result"] = related_renamed(result, held.task_id)
        ended = "failed" if isinstance(result, dict) and result.get("isError") is True else "completed"
        await session.gateway.task_book.seen(held, ended)
    elif isinstance(result, dict):
        response["result"] = renamed_task(result, held.task_id)
        await session.gateway.task_book.seen(held, task_status(result))
    return response


async def tasks_list(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    """The agent's own tasks, each as its upstream reports it now; a task its upstream no longer knows
    is forgotten."""
    message = entry.message
    refusal = await _not_served(session, entry)
    if refusal is not None:
        return refusal
    params = message.params if isinstance(message.params, dict) else {}
    if params.get("cursor") is not None:
        return await session.refuse(message.id, INVALID_PARAMS, NO_CURSOR)
    book = session.gateway.task_book
    tasks: list[dict[str, Any]] = []
    for held in book.of_agent(session.agent):
        task = await _current(session, held)
        if task is not None:
            tasks.append(renamed_task(task, held.task_id))
            await book.seen(held, task_status(task))
    return session.result(entry, {"tasks": tasks})


async def _current(session: DownstreamSession, held: HeldTask) -> dict[str, Any] | None:
    """The task as its upstream reports it (``tasks/get``); None when it cannot say now, and the task
    is forgotten when the upstream answers that it does not know it."""
    gateway = session.gateway
    upstream = gateway.upstreams.get(held.upstream)
    if upstream is None:
        return None
    try:
        call = await upstream.send_request(TASKS_GET, {"taskId": held.upstream_task_id})
        with anyio.move_on_after(gateway.settings.call_timeout):
            body = await call.wait()
            result = body.get("result")
            if "error" in body:
                gateway.task_book.forget(held)
            return result if isinstance(result, dict) else None
        with anyio.CancelScope(shield=True):
            await upstream.cancel(call, "gateway timeout")
    except (UpstreamLost, UpstreamUnavailable):
        pass
    return None


__all__ = ["by_task", "tasks_list"]
