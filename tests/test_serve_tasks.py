"""Task-augmented tool calls (2025-11-25 tasks) through ``drawbridge serve`` over HTTP, and ``wrap``.

A real gateway process in front of a task-running upstream built on the mcp SDK's low-level server
(``fixtures/servers/tasking.py``, over stdio and over streamable HTTP, which writes down every task
it creates); two agents, each an mcp SDK ``ClientSession`` over streamable HTTP. A task-augmented
call is decided like any call before the upstream sees it: allowed, it becomes an upstream task
whose status and result reach the agent under the gateway's task id; denied, no task is created;
needing a person, the task is created only once the operator approved. Another agent cannot see,
read or cancel the task. Under ``wrap`` the task crosses unchanged once the call is decided.

The SDK client types tasks but its ``call_tool`` accepts only a ``CallToolResult``: the task-augmented
``tools/call`` goes through the session's own dispatcher (``send_raw_request``), everything else
through the session's typed requests; status notifications, which the SDK does not dispatch at
2025-11-25, reach the test through a ``NotificationBinding``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
from approval_support import trace, wait_pending_on
from conftest import MODERN, PYTHON, SERVERS, scaled, wrap_params
from mcp.client.extension import NotificationBinding
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from serve_support import background, free_port, http_gateway, sha256, wait_for_port, write_config

pytestmark = pytest.mark.anyio

TASK_WAIT_SECONDS = scaled(20.0)
"""The longest a test waits for a task to be created, approved or ended."""
TOKENS = {"a": "token-of-agent-a", "b": "token-of-agent-b"}
POLICY = {
    "p.yaml": "name: p\nagent: '*'\nrules:\n"
    "  - tools: ['tasking.wipe']\n    action: deny\n"
    "  - tools: ['tasking.steep']\n    action: human_approval\n"
    "  - tools: ['*']\n    action: allow\n"
}
TASK = {"ttl": 60000}


class Agent:
    """One agent's SDK session, with the notifications it received."""

    def __init__(self, session: ClientSession, dispatcher: JSONRPCDispatcher[Any]) -> None:
        self.session = session
        self.dispatcher = dispatcher
        self.statuses: list[dict[str, Any]] = []
        self.status_seen = anyio.Event()
        self.logged: list[types.LoggingMessageNotificationParams] = []
        self.progress: list[types.ProgressNotificationParams] = []

    async def call_as_task(self, name: str, arguments: dict[str, Any], **meta: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": arguments, "task": TASK}
        if meta:
            params["_meta"] = meta
        return await self.dispatcher.send_raw_request("tools/call", params)

    async def get(self, task_id: str) -> types.GetTaskResult:
        request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
        return await self.session.send_request(request, types.GetTaskResult)

    async def result(self, task_id: str) -> types.CallToolResult:
        request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
        return await self.session.send_request(request, types.CallToolResult)

    async def cancel(self, task_id: str) -> types.CancelTaskResult:
        request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
        return await self.session.send_request(request, types.CancelTaskResult)

    async def listed(self) -> list[str]:
        result = await self.session.send_request(types.ListTasksRequest(), types.ListTasksResult)
        return [task.task_id for task in result.tasks]


@asynccontextmanager
async def agent(url: str, who: str) -> AsyncIterator[Agent]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS[who]}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write), opened(read, write) as session:
            yield session


@asynccontextmanager
async def opened(read: Any, write: Any) -> AsyncIterator[Agent]:
    """An initialized SDK session over a transport's streams."""
    holder: list[Agent] = []

    async def on_status(params: types.TaskStatusNotificationParams) -> None:
        holder[0].statuses.append(params.model_dump(mode="json", by_alias=True, exclude_none=True))
        holder[0].status_seen.set()

    statuses = NotificationBinding(method="notifications/tasks/status", params_type=types.TaskStatusNotificationParams, handler=on_status)

    dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(read, write)
    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        holder[0].logged.append(params)

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ProgressNotification):
            holder[0].progress.append(message.params)

    async with ClientSession(
        dispatcher=dispatcher, notification_bindings=[statuses], logging_callback=on_log, message_handler=on_message
    ) as session:
        holder.append(Agent(session, dispatcher))
        await session.initialize()
        yield holder[0]


@pytest.fixture
def world(tmp_path: Path) -> Any:
    upstream = {
        "name": "tasking", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "tasking.py")],
        "env": {"TASKING_LOG": str(tmp_path / "tasks.log"), "TASKING_RELEASE": str(tmp_path / "release")},
    }
    (tmp_path / "tasks.log").touch()
    config = write_config(
        tmp_path, [upstream], policies=POLICY, evidence_dir=str(tmp_path / "evidence"),
        state_path=str(tmp_path / "state.db"), approval={"timeout_seconds": 30},
        auth={"agents": [{"agent": who, "token_sha256": sha256(token)} for who, token in TOKENS.items()]},
    )
    with http_gateway(config) as running:
        yield running, tmp_path


def created(tmp_path: Path) -> list[str]:
    """The tasks the upstream created, as it wrote them down."""
    return (tmp_path / "tasks.log").read_text(encoding="utf-8").split()[1::2]


async def test_the_gateway_declares_task_calls_because_its_upstream_runs_them(world: Any) -> None:
    running, _ = world
    async with agent(running.url, "a") as a:
        capabilities = a.session.server_capabilities
        assert capabilities is not None and capabilities.tasks is not None
        assert capabilities.tasks.requests is not None and capabilities.tasks.requests.tools is not None
        assert capabilities.tasks.list is not None and capabilities.tasks.cancel is not None
        tools = {tool.name: tool for tool in (await a.session.list_tools()).tools}
        assert tools["tasking.brew"].execution is not None
        assert tools["tasking.brew"].execution.task_support == "optional"


async def test_an_allowed_task_call_creates_the_upstream_task_and_its_status_and_result_reach_the_agent(
    world: Any,
) -> None:
    running, tmp_path = world
    async with agent(running.url, "a") as a, agent(running.url, "b") as b:
        answer = await a.call_as_task("tasking.brew", {"what": "tea"}, progressToken="tea-progress")
        task = answer["task"]
        assert task["status"] == "working" and task["taskId"].startswith("drawbridge-task-")
        (upstream_id,) = (tmp_path / "tasks.log").read_text(encoding="utf-8").split()[::2]
        assert upstream_id not in task["taskId"]  # the agent sees the gateway's id, never the upstream's
        assert created(tmp_path) == ["brew"]
        assert (await a.get(task["taskId"])).status == "working"
        (tmp_path / "release").touch()
        with anyio.fail_after(TASK_WAIT_SECONDS):
            await a.status_seen.wait()
        assert a.statuses[0]["taskId"] == task["taskId"] and a.statuses[0]["status"] == "completed"
        (log,) = a.logged  # marked as the task's: to its agent, under the gateway's id
        assert [p.progress_token for p in a.progress] == ["tea-progress"]  # the call's token outlives its answer
        assert log.data == "finishing brew" and (log.meta or {})["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
        done = await a.result(task["taskId"])
        assert [c.text for c in done.content if isinstance(c, types.TextContent)] == ["brew tea"]
        related = (done.meta or {})["io.modelcontextprotocol/related-task"]
        assert related["taskId"] == task["taskId"]
        assert await a.listed() == [task["taskId"]]
        assert b.statuses == [] and b.logged == [] and b.progress == []  # nothing of a's task reaches another agent
    entries = trace(tmp_path / "evidence")
    decisions = [e["body"] for e in entries if e["kind"] == "tool_decision"]
    assert [(d["tool"], d["action"], d["outcome"]) for d in decisions] == [("tasking.brew", "allow", "task_created")]
    (ended,) = [e["body"] for e in entries if e["kind"] == "task_ended"]
    assert (ended["agent"], ended["tool"], ended["task"], ended["status"]) == ("a", "tasking.brew", task["taskId"], "completed")


async def test_a_denied_task_call_is_refused_and_no_upstream_task_is_created(world: Any) -> None:
    running, tmp_path = world
    async with agent(running.url, "a") as a:
        answer = await a.call_as_task("tasking.wipe", {"what": "everything"})
        assert answer["isError"] is True and "task" not in answer
        assert answer["content"][0]["text"].startswith("drawbridge refused this call: deny by rule 0 of policy 'p'")
        assert await a.listed() == []
    assert created(tmp_path) == []
    (decision,) = [e["body"] for e in trace(tmp_path / "evidence", "tool_decision")]
    assert (decision["action"], decision["outcome"]) == ("deny", "refused")


async def test_a_task_call_that_needs_a_person_creates_the_task_only_once_approved(world: Any) -> None:
    running, tmp_path = world
    base, operator = running.control(), running.control_headers()
    async with agent(running.url, "a") as a, httpx.AsyncClient(base_url=base, trust_env=False, headers=operator) as http:
        answers: list[dict[str, Any]] = []

        async def call() -> None:
            answers.append(await a.call_as_task("tasking.steep", {"what": "oolong"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            pending = await wait_pending_on(http, TASK_WAIT_SECONDS)
            assert created(tmp_path) == []  # waiting for the person: nothing runs upstream
            approve = await http.post(f"/approvals/{pending[0]['id']}/approve", json={"resolved_by": "op-hal"})
            assert approve.status_code == 200
        assert answers[0]["task"]["status"] == "working"
        assert created(tmp_path) == ["steep"]


async def test_another_agent_cannot_see_read_or_cancel_the_task(world: Any) -> None:
    running, tmp_path = world
    async with agent(running.url, "a") as a, agent(running.url, "b") as b:
        task_id = (await a.call_as_task("tasking.brew", {"what": "chai"}))["task"]["taskId"]
        (upstream_id,) = (tmp_path / "tasks.log").read_text(encoding="utf-8").split()[::2]
        for guess in (task_id, upstream_id, "drawbridge-task-guessed"):
            for ask in (b.get, b.result, b.cancel):
                with pytest.raises(MCPError) as refused:
                    await ask(guess)
                assert refused.value.error.code == types.INVALID_PARAMS
                assert "unknown task" in refused.value.error.message
        assert await b.listed() == []
        assert b.statuses == []
        assert (await a.get(task_id)).status == "working"  # still the owner's, untouched
        cancelled = await a.cancel(task_id)
        assert cancelled.task_id == task_id and cancelled.status == "cancelled"
    # Each probe is recorded, with the agent that made it and without the id it tried.
    probes = [e["body"] for e in trace(tmp_path / "evidence", "relay_incident")]
    assert [(p["kind"], p["code"], p["agent"]) for p in probes] == [("invalid_message", -32602, "b")] * 9, probes
    assert not any(task_id in json.dumps(p) or upstream_id in json.dumps(p) for p in probes)


def _modern(url: str, method: str, params: dict[str, Any]) -> httpx.Response:
    """A raw 2026-07-28 request of agent a (the SDK client sends no ``task`` at 2026-07-28)."""
    headers = {
        "content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {TOKENS['a']}",
        "mcp-protocol-version": MODERN, "mcp-method": method,
    }
    if "name" in params:
        headers["mcp-name"] = params["name"]
    envelope = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": envelope, **params}}
    return httpx.post(url, headers=headers, content=json.dumps(body), timeout=TASK_WAIT_SECONDS)


async def test_a_2026_agent_gets_its_call_answered_at_once_and_no_tasks(world: Any) -> None:
    """No Tasks extension crosses the gateway: a 2026-07-28 call that asks for a task is run as one
    request, and ``tasks/*`` is not served in that era."""
    running, tmp_path = world
    answered = _modern(running.url, "tools/call", {"name": "tasking.brew", "arguments": {"what": "mate"}, "task": TASK})
    assert answered.status_code == 200, answered.text
    result = answered.json()["result"]
    assert result["resultType"] == "complete" and result["content"][0]["text"] == "brew mate"
    assert created(tmp_path) == []
    refused = _modern(running.url, "tasks/get", {"taskId": "drawbridge-task-anything"})
    assert refused.json()["error"]["code"] == types.METHOD_NOT_FOUND


async def test_a_tool_that_runs_only_as_a_task_is_not_offered_to_a_2026_agent(world: Any) -> None:
    """``simmer`` requires a task, and a 2026-07-28 call is never sent as one: such an agent is not shown
    the tool, and its call is refused naming why, before the upstream hears of it; a 2025-11-25 session
    sees it and runs it as a task."""
    running, tmp_path = world
    listed = _modern(running.url, "tools/list", {}).json()["result"]["tools"]
    assert {tool["name"] for tool in listed} == {"tasking.brew", "tasking.steep", "tasking.wipe"}
    refused = _modern(running.url, "tools/call", {"name": "tasking.simmer", "arguments": {"what": "stock"}})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == types.INVALID_PARAMS and "runs only as a task" in error["message"], error
    assert "2026-07-28" in error["message"]
    async with agent(running.url, "a") as a:
        tools = {tool.name: tool for tool in (await a.session.list_tools()).tools}
        assert tools["tasking.simmer"].execution is not None
        assert tools["tasking.simmer"].execution.task_support == "required"
        created_task = await a.call_as_task("tasking.simmer", {"what": "stock"})
        assert created_task["task"]["taskId"].startswith("drawbridge-task-")
    assert created(tmp_path) == ["simmer"]


async def test_wrap_decides_a_task_call_and_passes_the_task_through(tmp_path: Path) -> None:
    """Under ``wrap`` (one agent, one server) the task and its requests cross unchanged, after the
    call was decided: a denied one creates no task, an allowed one runs as the server's task."""
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "p.yaml").write_text(POLICY["p.yaml"].replace("tasking.", ""), encoding="utf-8")
    env = {"TASKING_LOG": str(tmp_path / "tasks.log")}
    (tmp_path / "tasks.log").touch()
    server = [PYTHON, str(SERVERS / "tasking.py")]
    params = wrap_params(server, "--policy", str(policy), "--agent", "a", "--evidence-dir", str(tmp_path / "evidence"), env=env)
    async with stdio_client(params) as (read, write), opened(read, write) as a:
        refused = await a.call_as_task("wipe", {"what": "all"})
        assert refused["isError"] is True and created(tmp_path) == []
        task = (await a.call_as_task("brew", {"what": "tea"}))["task"]
        assert created(tmp_path) == ["brew"]
        done = await a.result(task["taskId"])
        assert [c.text for c in done.content if isinstance(c, types.TextContent)] == ["brew tea"]
    outcomes = [(e["body"]["tool"], e["body"]["outcome"]) for e in trace(tmp_path / "evidence", "tool_decision")]
    assert outcomes == [("wipe", "refused"), ("brew", "task_created")]


async def test_a_task_runs_on_an_http_upstream_the_same_way(tmp_path: Path) -> None:
    """The task's upstream over streamable HTTP: its status comes on the upstream's own stream, not
    on the call's, and still reaches the agent under the gateway's id."""
    port = free_port()
    (tmp_path / "tasks.log").touch()
    env = {"TASKING_LOG": str(tmp_path / "tasks.log"), "TASKING_RELEASE": str(tmp_path / "release")}
    with background([PYTHON, str(SERVERS / "tasking.py"), "--http", str(port)], env=env):
        wait_for_port(port)
        upstream = {"name": "tasking", "transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp"}
        config = write_config(
            tmp_path, [upstream], policies=POLICY, evidence_dir=str(tmp_path / "evidence"),
            auth={"agents": [{"agent": "a", "token_sha256": sha256(TOKENS["a"])}]},
        )
        with http_gateway(config) as running:
            async with agent(running.url, "a") as a:
                refused = await a.call_as_task("tasking.wipe", {"what": "all"})
                assert refused["isError"] is True and created(tmp_path) == []
                task_id = (await a.call_as_task("tasking.brew", {"what": "rooibos"}))["task"]["taskId"]
                assert created(tmp_path) == ["brew"] and task_id.startswith("drawbridge-task-")
                (tmp_path / "release").touch()
                with anyio.fail_after(TASK_WAIT_SECONDS):
                    await a.status_seen.wait()
                assert a.statuses[0]["taskId"] == task_id and a.statuses[0]["status"] == "completed"
                done = await a.result(task_id)
                assert [c.text for c in done.content if isinstance(c, types.TextContent)] == ["brew rooibos"]
