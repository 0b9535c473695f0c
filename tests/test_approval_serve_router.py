"""``drawbridge serve``'s router with the approval gate, in-process, with real upstream children.

The agent's side is played by an ``Outbound`` that answers the gateway's own ``elicitation/create``
requests through ``DownstreamSession.handle_response``, exactly as a transport hands it the agent's
answer. Grants apply on this MCP path too (the defect of gateway-behaviour.md 12.1 is not repeated).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from approval_support import ECHO, write_policy
from conftest import GITHUB_LIKE, MODERN, scaled

from drawbridge.config import UpstreamConfig
from drawbridge.gateway.pipeline.approvals.engine import ApprovalEngine
from drawbridge.gateway.pipeline.approvals.gate import (
    ApprovalGate,
    ApprovalSettings,
    build_approval_engine,
    run_approvals,
)
from drawbridge.gateway.pipeline.call import CallPipeline
from drawbridge.gateway.pipeline.deciders import policy_decider
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord, RelayEvent
from drawbridge.gateway.pipeline.verdicts import Action
from drawbridge.gateway.protocol.jsonrpc import parse_client_message
from drawbridge.gateway.serve.downstream_session import DownstreamSession
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.serve.routes import open_session
from drawbridge.gateway.upstreams.session import UpstreamSession
from drawbridge.state.sqlite import StateDB

pytestmark = pytest.mark.anyio

POLICY = """\
name: served
agent: "*"
rules:
  - tools: ["github.list_repos"]
    action: allow
  - tools: ["github.delete_repo", "echo.echo"]
    action: human_approval
"""
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}


@dataclass
class Agent:
    """The agent's end: collects messages and answers the gateway's elicitation requests."""

    answer: dict[str, Any] | None = None
    unsolicited: bool = True
    session: DownstreamSession | None = None
    asked: list[dict[str, Any]] = field(default_factory=list)

    async def send(self, message: dict[str, Any], related: Any) -> None:
        if message.get("method") != "elicitation/create":
            return
        self.asked.append({"id": message["id"], "related": related, "params": message["params"]})
        if self.answer is not None and self.session is not None:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": self.answer}
            await self.session.handle(parse_client_message(json.dumps(reply).encode()))


@dataclass
class Rig:
    gateway: Gateway
    engine: ApprovalEngine
    records: list[CallRecord]
    trace: list[tuple[str, dict[str, Any]]]


def _upstream(name: str, argv: list[str]) -> UpstreamSession:
    return UpstreamSession(UpstreamConfig(name=name, transport="stdio", command=argv[0], args=tuple(argv[1:])))


@asynccontextmanager
async def served(tmp_path: Path, *, operator_channel: bool = False) -> AsyncIterator[Rig]:
    records: list[CallRecord] = []
    entries: list[tuple[str, dict[str, Any]]] = []

    async def record(event: RelayEvent) -> None:
        if isinstance(event, CallRecord):
            records.append(event)

    async def trace(kind: str, body: Any) -> None:
        entries.append((kind, dict(body)))

    db = StateDB.open(tmp_path / "state.db")
    engine = build_approval_engine(ApprovalSettings(timeout_seconds=10), db, trace)
    pipeline = CallPipeline(
        policy=policy_decider(str(write_policy(tmp_path, POLICY))),
        guard=EvidenceGuard(record),
        approvals=ApprovalGate(engine, operator_channel=operator_channel),
    )
    gateway = Gateway([_upstream("github", GITHUB_LIKE), _upstream("echo", ECHO)], pipeline=pipeline)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(run_approvals, engine)
            await tg.start(gateway.run)
            await gateway.wait_settled(scaled(30))
            yield Rig(gateway, engine, records, entries)
            tg.cancel_scope.cancel()
    finally:
        db.close()


_ids = iter(range(1, 10**6))


async def request(session: DownstreamSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
    response = await session.handle_request(parse_client_message(json.dumps(body).encode()))
    assert response is not None
    return response


async def legacy_session(rig: Rig, agent: Agent, capabilities: dict[str, Any]) -> DownstreamSession:
    session = open_session(rig.gateway, "agent-7", agent, transport="test")
    agent.session = session
    init = {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "t", "version": "0"}}
    assert "result" in await request(session, "initialize", init)
    return session


async def repos(session: DownstreamSession) -> list[str]:
    listed = await request(session, "tools/call", {"name": "github.list_repos", "arguments": {"owner": "acme"}})
    return list(listed["result"]["structuredContent"]["result"])


async def test_legacy_agents_are_asked_in_band_on_the_sessions_own_request_ids(tmp_path: Path) -> None:
    async with served(tmp_path) as rig:
        yes = Agent(answer={"action": "accept", "content": {"decision": "approve"}})
        session = await legacy_session(rig, yes, {"elicitation": {}})
        done = await request(session, "tools/call", {"name": "github.delete_repo", "arguments": {"owner": "acme", "name": "rocket"}})
        assert done["result"]["content"][0]["text"] == "deleted acme/rocket"
        assert await repos(session) == ["anvil"]
        no = Agent(answer={"action": "decline"})
        other = await legacy_session(rig, no, {"elicitation": {"form": {}}})
        refused = await request(other, "tools/call", {"name": "github.delete_repo", "arguments": {"owner": "acme", "name": "anvil"}})
        assert refused["result"]["isError"] and "declined in the client" in refused["result"]["content"][0]["text"]
        assert await repos(other) == ["anvil"]
    (question,) = yes.asked
    assert isinstance(question["id"], int) and question["related"] is not None  # on the call's own stream
    assert question["params"]["requestedSchema"]["required"] == ["decision"]
    approved, declined = [r for r in rig.records if r.tool == "github.delete_repo"]
    assert (approved.action, approved.outcome) == (Action.ALLOW, Outcome.OK)
    assert approved.approval is not None and approved.approval["channel"] == "elicitation"
    assert (declined.action, declined.outcome) == (Action.DENY, Outcome.REFUSED)


async def test_modern_agents_get_input_required_and_the_retry_fields_stay_at_the_gateway(tmp_path: Path) -> None:
    async with served(tmp_path) as rig:
        session = open_session(rig.gateway, "agent-9", Agent(), transport="test")
        first = {"name": "echo.echo", "arguments": {"n": 1}, "_meta": ENVELOPE}
        asked = (await request(session, "tools/call", first))["result"]
        assert asked["resultType"] == "input_required"
        answer = {"drawbridge_approval": {"action": "accept", "content": {"decision": "approve"}}}
        retry = {**first, "requestState": asked["requestState"], "inputResponses": answer}
        ran = (await request(session, "tools/call", retry))["result"]
        forwarded = json.loads(ran["content"][0]["text"])
        assert forwarded["name"] == "echo" and forwarded["arguments"] == {"n": 1}
        assert "requestState" not in forwarded and "inputResponses" not in forwarded
        replay = (await request(session, "tools/call", retry))["result"]
        assert replay["isError"] and "already used" in replay["content"][0]["text"]
    outcomes = [(r.outcome, (r.approval or {}).get("how")) for r in rig.records]
    assert outcomes == [
        (Outcome.APPROVAL_PENDING, "input_required"),
        (Outcome.OK, "approved by mcp-client:agent-9 via elicitation"),
        (Outcome.REFUSED, "request_state invalid: replayed"),
    ]


async def test_grants_apply_on_the_mcp_path_and_without_a_channel_approval_is_unavailable(tmp_path: Path) -> None:
    async with served(tmp_path) as rig:
        session = await legacy_session(rig, Agent(), {})  # no elicitation, no operator channel
        delete = {"name": "github.delete_repo", "arguments": {"owner": "acme", "name": "rocket"}}
        with anyio.fail_after(scaled(5)):
            unavailable = await request(session, "tools/call", delete)
        assert unavailable["result"]["content"][0]["text"].endswith(": approval unavailable")
        assert await repos(session) == ["anvil", "rocket"]
        grant = await rig.engine.grant_service.create(
            agent="agent-*", tools="github.delete_*", duration="1m", granted_by="op-gina"
        )
        lifted = await request(session, "tools/call", delete)
        assert lifted["result"]["content"][0]["text"] == "deleted acme/rocket"
    unavailable_record, lifted_record = [r for r in rig.records if r.tool == "github.delete_repo"]
    assert (unavailable_record.action, unavailable_record.outcome) == (Action.HUMAN_APPROVAL, Outcome.APPROVAL_UNAVAILABLE)
    assert lifted_record.approval is not None and lifted_record.approval["grant_id"] == grant.id
    assert [kind for kind, _ in rig.trace] == ["grant_created", "approval_by_grant"]
