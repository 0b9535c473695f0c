"""Helpers for the human-approval tests: a policy, the wrap's control plane over HTTP, the trace, callbacks.

The gateway runs as a real ``drawbridge wrap`` subprocess in front of a real MCP server; the person is
played from the test through the channels the gateway offers (an SDK client's elicitation callback,
the control plane over HTTP, the ``drawbridge`` CLI).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import mcp_types as types
from conftest import PYTHON, SERVERS, child_env, eventually_async, scaled

from drawbridge.state.sqlite import to_db_time

ECHO = [PYTHON, str(SERVERS / "echo_params.py")]

POLICY = """\
name: approvals
agent: "*"
rules:
  - tools: ["list_repos", "get_repo"]
    action: allow
  - tools: ["delete_repo", "add_deploy_key", "echo"]
    action: human_approval
  - tools: ["*"]
    action: deny
"""


def trace_log_appender(log: Any, clock: Callable[[], datetime] | None = None) -> Callable[[str, Mapping[str, Any]], Awaitable[Any]]:
    """A ``state.trace_log.TraceLog`` as the approval engine's ``trace_append(kind, body)``."""

    async def append(kind: str, body: Mapping[str, Any]) -> Any:
        at = (clock or (lambda: datetime.now(UTC)))()
        return await log.append_async(kind, to_db_time(at), body)

    return append


def write_policy(directory: Path, text: str = POLICY) -> Path:
    path = directory / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def trace(evidence: Path, kind: str | None = None) -> list[dict[str, Any]]:
    path = evidence / "trace.ndjson"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [e for e in entries if kind is None or e["kind"] == kind]


def decisions(evidence: Path, tool: str | None = None) -> list[dict[str, Any]]:
    return [e["body"] for e in trace(evidence, "tool_decision") if tool is None or e["body"]["tool"] == tool]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", *args], capture_output=True, text=True, timeout=scaled(60), env=child_env(env),
        stdin=subprocess.DEVNULL,
    )


@dataclass
class ControlPlane:
    """The wrap's control plane on 127.0.0.1:``port``, reached with the admin token the gateway keeps
    beside its state file (``state``: the state file, or the evidence directory that holds it)."""

    port: int
    state: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_file(self) -> Path:
        assert self.state is not None, "give the ControlPlane the gateway's state file or evidence directory"
        state = self.state / "drawbridge.db" if self.state.suffix != ".db" else self.state
        return state.with_name(state.stem + ".admin-token")

    def headers(self) -> dict[str, str]:
        token = self.token_file.read_text(encoding="ascii").strip()
        return {"Authorization": f"Bearer {token}"}

    def cli_args(self) -> list[str]:
        """What the CLI needs to reach this control plane: its URL and the token file."""
        return ["--url", self.url, "--token-file", str(self.token_file)]

    async def get(self, path: str, **params: str) -> Any:
        async with httpx.AsyncClient(trust_env=False, timeout=scaled(10)) as http:
            response = await http.get(self.url + path, params=params, headers=self.headers())
        response.raise_for_status()
        return response.json()

    async def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        async with httpx.AsyncClient(trust_env=False, timeout=scaled(10)) as http:
            return await http.post(self.url + path, json=body or {}, headers=self.headers())

    async def pending(self) -> list[dict[str, Any]]:
        return list(await self.get("/approvals", status="pending"))

    async def wait_pending(self, count: int = 1, timeout: float = scaled(15.0)) -> list[dict[str, Any]]:
        """Wait until ``count`` approvals are pending (the gateway is up and the calls are waiting)."""

        async def enough() -> list[dict[str, Any]] | None:
            listed = await self.pending()
            return listed if len(listed) >= count else None

        return await eventually_async(enough, timeout, f"{count} pending approval(s)", ignoring=(httpx.HTTPError, OSError))

    async def approve(self, approval_id: str, by: str = "op-alice", reason: str = "looks right") -> httpx.Response:
        return await self.post(f"/approvals/{approval_id}/approve", {"resolved_by": by, "reason": reason})

    async def deny(self, approval_id: str, by: str = "op-bob", reason: str = "not today") -> httpx.Response:
        return await self.post(f"/approvals/{approval_id}/deny", {"resolved_by": by, "reason": reason})


PENDING_SECONDS = scaled(20.0)
"""How long a test waits for a call to become a pending approval (the gateway decides on its own time)."""


async def pending_on(http: httpx.AsyncClient, base: str = "", **params: str) -> list[dict[str, Any]]:
    """The approvals pending on the control plane ``http`` (or ``base``) talks to."""
    response = await http.get(f"{base}/approvals", params={"status": "pending", **params})
    response.raise_for_status()
    return list(response.json())


async def wait_pending_on(
    http: httpx.AsyncClient, timeout: float = PENDING_SECONDS, base: str = "", **params: str
) -> list[dict[str, Any]]:
    """The pending approvals once there is at least one."""
    return await eventually_async(lambda: pending_on(http, base, **params), timeout, "a pending approval")


async def answered_by_operator(
    client: Any, http: httpx.AsyncClient, tool: str, arguments: dict[str, Any], answer: Literal["approve", "deny"],
    before: Callable[[], Awaitable[Any]] | None = None,
) -> types.CallToolResult:
    """Call ``tool`` and answer, as an operator on the control plane ``http``, the approval it waits
    for (a call that ran without one fails the wait), once ``before`` (if given) returned. Returns the
    call's result."""
    results: list[types.CallToolResult] = []

    async def call() -> None:
        results.append(await client.call_tool(tool, arguments))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        pending = await wait_pending_on(http)
        assert [p["tool"] for p in pending] == [tool]
        if before is not None:
            await before()
        answered = await http.post(f"/approvals/{pending[0]['id']}/{answer}", json={"resolved_by": "op", "reason": "r"})
        assert answered.status_code == 200
    return results[0]


APPROVAL_ID = re.compile(r"Approval required \(id: ([0-9a-f]{16})\)")


async def approved_by_operator(
    client: Any, control: ControlPlane, tool: str, arguments: dict[str, Any], by: str = "op-alice"
) -> types.CallToolResult:
    """A call under ``--non-blocking-approvals``: it comes back pending, an operator approves it through
    the control plane, and its retry runs. Returns the retry's result."""
    pending = await client.call_tool(tool, arguments)
    found = APPROVAL_ID.search(text_of(pending))
    assert pending.is_error and found is not None, text_of(pending)
    response = await control.approve(found.group(1), by=by)
    assert response.status_code == 200, response.text
    return await client.call_tool(tool, arguments)


@dataclass
class Person:
    """An elicitation callback that answers every question the same way and remembers them."""

    decision: str = "approve"
    action: str = "accept"
    questions: list[str] = field(default_factory=list)

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        self.questions.append(params.message)
        if self.action != "accept":
            return types.ElicitResult(action=self.action)  # type: ignore[arg-type]
        return types.ElicitResult(action="accept", content={"decision": self.decision, "reason": "by the test"})


def wrap_flags(policy: Path, evidence: Path, *extra: str) -> list[str]:
    return ["--policy", str(policy), "--agent", "tester", "--evidence-dir", str(evidence), "--fsync", "never", *extra]


def listed(result: types.CallToolResult) -> Sequence[str]:
    content = result.structured_content
    assert isinstance(content, dict)
    return list(content["result"])


def unfolded(lines: Sequence[str]) -> list[str]:
    """Lines folded to a width (``approval.shown_arguments``) joined back: a continuation starts with
    ``  + `` and belongs to the line above."""
    out: list[str] = []
    for line in lines:
        if line.startswith("  + "):
            out[-1] += line[4:]
        else:
            out.append(line)
    return out
