"""The router in-process, with real upstream children and scripted decide/record hooks.

What the decider sees (agent, namespaced name, exact arguments), what the agent gets back, and the
``CallRecord`` each tools/call leaves, for allow, deny, a failing decider, a failing recorder, an
unknown tool, a timeout and an upstream that dies in the middle of a call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from conftest import PYTHON, SERVERS, eventually_async, scaled

from drawbridge.config import UpstreamConfig
from drawbridge.gateway.pipeline.call import CallPipeline
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord, RelayEvent
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Provenance, Verdict
from drawbridge.gateway.protocol.jsonrpc import parse_client_message
from drawbridge.gateway.serve.downstream_session import DownstreamSession
from drawbridge.gateway.serve.hub import Gateway, GatewaySettings
from drawbridge.gateway.serve.routes import open_session
from drawbridge.gateway.upstreams.session import UpstreamSession

pytestmark = pytest.mark.anyio


class Collect:
    unsolicited = True

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any], related: Any) -> None:
        self.messages.append(message)


class Script:
    """A decider that denies the names in ``deny``, raises for ``explode``, and remembers every call."""

    def __init__(self, deny: set[str] = frozenset(), explode: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.deny, self.explode = deny, explode
        self.seen: list[ToolCall] = []

    async def __call__(self, call: ToolCall) -> Verdict:
        self.seen.append(call)
        if call.tool in self.explode:
            raise RuntimeError("secret-argument-value")
        if call.tool in self.deny:
            return Verdict(Action.DENY, "writes are refused", Provenance("test-policy", "p.yaml", 3))
        return Verdict(Action.ALLOW, "fine", Provenance("test-policy", "p.yaml", 0))


def _upstream(name: str, server: str, env: dict[str, str] | None = None) -> UpstreamSession:
    return UpstreamSession(
        UpstreamConfig(name=name, transport="stdio", command=PYTHON, args=(str(SERVERS / server),), env=env or {})
    )


@asynccontextmanager
async def gateway(
    decide: Any, record: Any, call_timeout: float = 30.0, crashy_env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Gateway, DownstreamSession, Collect]]:
    gw = Gateway(
        [_upstream("github", "github_like.py"), _upstream("crashy", "crashy.py", crashy_env)],
        pipeline=CallPipeline(policy=decide, guard=EvidenceGuard(record), call_timeout=call_timeout),
        settings=GatewaySettings(call_timeout=call_timeout),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(gw.run)
        await gw.wait_settled(scaled(30))
        outbound = Collect()
        session = open_session(gw, "agent-7", outbound, transport="test")
        init = await request(session, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
        assert init["result"]["serverInfo"]["name"] == "drawbridge"
        yield gw, session, outbound
        tg.cancel_scope.cancel()


_ids = iter(range(1, 10**6))


async def request(session: DownstreamSession, method: str, params: dict[str, Any] | None = None, request_id: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": next(_ids) if request_id is None else request_id, "method": method}
    if params is not None:
        body["params"] = params
    response = await session.handle_request(parse_client_message(json.dumps(body).encode()))
    assert response is not None
    return response


async def call(session: DownstreamSession, name: str, arguments: Any, **extra: Any) -> dict[str, Any]:
    return await request(session, "tools/call", {"name": name, "arguments": arguments, **extra})


async def test_decisions_see_the_namespaced_name_and_records_follow_each_call() -> None:
    decide, records = Script(deny={"github.delete_repo"}), []

    async def record(event: RelayEvent) -> None:
        records.append(event)

    async with gateway(decide, record) as (_, session, _):
        ok = await call(session, "github.get_repo", {"owner": "acme", "name": "rocket"})
        refused = await call(session, "github.delete_repo", {"owner": "acme", "name": "rocket"})
        still_there = await call(session, "github.get_repo", {"owner": "acme", "name": "rocket"})
        unknown = await call(session, "github.nope", {})
    assert ok["result"]["structuredContent"]["stars"] == 42
    assert refused["result"]["isError"] is True
    assert refused["result"]["content"][0]["text"].startswith('drawbridge refused this call: policy "test-policy" rule 3')
    assert still_there["result"]["structuredContent"]["name"] == "rocket"  # the refused delete never ran
    assert unknown["error"]["code"] == -32602

    assert [(c.agent, c.tool, dict(c.arguments)) for c in decide.seen] == [
        ("agent-7", "github.get_repo", {"owner": "acme", "name": "rocket"}),
        ("agent-7", "github.delete_repo", {"owner": "acme", "name": "rocket"}),
        ("agent-7", "github.get_repo", {"owner": "acme", "name": "rocket"}),
    ]
    calls = [r for r in records if isinstance(r, CallRecord)]
    assert [(r.tool, r.action, r.outcome) for r in calls] == [
        ("github.get_repo", Action.ALLOW, Outcome.OK),
        ("github.delete_repo", Action.DENY, Outcome.REFUSED),
        ("github.get_repo", Action.ALLOW, Outcome.OK),
        ("github.nope", None, Outcome.INVALID),
    ]
    assert calls[1].provenance == Provenance("test-policy", "p.yaml", 3)
    assert calls[0].decision_ms is not None and calls[0].latency_ms >= calls[0].decision_ms
    assert calls[3].error_code == -32602


async def test_a_failing_decider_denies_and_a_failing_recorder_closes_the_gate() -> None:
    decide = Script(explode={"github.list_repos"})
    failures = {"left": 1}

    async def record(event: RelayEvent) -> None:
        if isinstance(event, CallRecord) and failures["left"]:
            failures["left"] -= 1
            raise OSError("disk full")

    async with gateway(decide, record) as (gw, session, _):
        exploded = await call(session, "github.list_repos", {"owner": "acme"})
        assert exploded["result"]["isError"] is True
        assert "RuntimeError" in exploded["result"]["content"][0]["text"]
        assert "secret-argument-value" not in json.dumps(exploded)
        assert gw.record_failed  # the first record failed
        after = await call(session, "github.get_repo", {"owner": "acme", "name": "rocket"})
    assert after["result"]["isError"] is True
    assert "evidence recording failed" in after["result"]["content"][0]["text"]


async def test_timeouts_and_dead_upstreams_are_answered_and_recorded() -> None:
    records: list[RelayEvent] = []

    async def record(event: RelayEvent) -> None:
        records.append(event)

    async with gateway(Script(), record, call_timeout=2.0) as (gw, session, _):
        garbage = await call(session, "crashy.garbage", {})  # lines that are not JSON-RPC are dropped
        assert garbage["result"]["content"][0]["text"] == "after garbage"
        big = await call(session, "crashy.big", {"size": 3_000_000})
        assert len(big["result"]["content"][0]["text"]) == 3_000_000
        hung = await call(session, "crashy.hang", {})
        assert hung["error"]["code"] == -32001
        died = await call(session, "crashy.crash", {"status": 4})
        assert died["error"]["code"] == -32000 and "exited with status 4" in died["error"]["message"]
        down = await call(session, "crashy.echo", {"text": "x"})
        assert down["error"]["code"] == -32000 and "crashy" in down["error"]["message"]
        fine = await call(session, "github.list_repos", {"owner": "octo"})
        assert fine["result"]["structuredContent"] == {"result": ["hello"]}
        await eventually_async(lambda: gw.upstreams["crashy"].ready, scaled(10), "crashy reconnected")
        back = await call(session, "crashy.echo", {"text": "back"})
        assert back["result"]["content"][0]["text"] == "back"
    outcomes = [(r.tool, r.outcome) for r in records if isinstance(r, CallRecord)]
    assert outcomes[:6] == [
        ("crashy.garbage", Outcome.OK),
        ("crashy.big", Outcome.OK),
        ("crashy.hang", Outcome.TIMEOUT),
        ("crashy.crash", Outcome.UPSTREAM_EXITED),
        ("crashy.echo", Outcome.UPSTREAM_EXITED),
        ("github.list_repos", Outcome.OK),
    ]
    incidents = [r for r in records if not isinstance(r, CallRecord)]
    assert any(i.kind == "upstream_exited" and "crashy" in i.detail for i in incidents)


async def test_cancelled_calls_are_recorded_and_answer_nothing(tmp_path: Any) -> None:
    records: list[RelayEvent] = []
    started = tmp_path / "started.log"

    async def record(event: RelayEvent) -> None:
        records.append(event)

    async with gateway(Script(), record, crashy_env={"CRASHY_START_LOG": str(started)}) as (_, session, _):
        message = parse_client_message(
            json.dumps(
                {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "crashy.slow", "arguments": {"seconds": 20}}}
            ).encode()
        )
        result: list[Any] = []

        async def run() -> None:
            result.append(await session.handle_request(message))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await eventually_async(started.exists, what="the call reaching the upstream")
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "c"}}
            await session.handle(parse_client_message(json.dumps(cancel).encode()))
    assert result == [None]
    assert [(r.tool, r.outcome) for r in records if isinstance(r, CallRecord)] == [("crashy.slow", Outcome.CANCELLED)]


async def test_logging_level_is_answered_locally_and_unknown_methods_are_refused() -> None:
    async def record(event: RelayEvent) -> None:
        pass

    async with gateway(Script(), record) as (_, session, _):
        assert (await request(session, "logging/setLevel", {"level": "debug"}))["result"] == {}
        assert (await request(session, "ping"))["result"] == {}
        assert (await request(session, "tasks/list"))["error"]["code"] == -32601
        again = await request(session, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
        assert again["error"]["code"] == -32600
        listed = await request(session, "tools/list", {"cursor": "made-up"})
        assert listed["error"]["code"] == -32602


async def test_paged_catalogues_are_followed_and_reloaded_on_list_changed() -> None:
    async def record(event: RelayEvent) -> None:
        pass

    gw = Gateway([_upstream("paged", "paged.py")], pipeline=CallPipeline(policy=Script(), guard=EvidenceGuard(record)))
    async with anyio.create_task_group() as tg:
        await tg.start(gw.run)
        await gw.wait_settled(scaled(30))
        outbound = Collect()
        session = open_session(gw, "agent-7", outbound, transport="test")
        await request(session, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
        await session.handle(parse_client_message(b'{"jsonrpc":"2.0","method":"notifications/initialized"}'))
        listed = (await request(session, "tools/list"))["result"]["tools"]
        assert [tool["name"] for tool in listed] == [f"paged.t{i}" for i in range(5)]  # three pages
        assert listed[3] == {"name": "paged.t3", "description": "tool 3", "inputSchema": {"type": "object"}, "x-vendor": {"index": 3}}
        assert "nextCursor" not in (await request(session, "tools/list"))["result"]
        # paged.grow is not in the catalogue: the gateway refuses to route it, fail closed.
        assert (await call(session, "paged.grow", {}))["error"]["code"] == -32602
        tg.cancel_scope.cancel()


async def test_list_changed_from_an_upstream_reloads_and_notifies_agents() -> None:
    async def record(event: RelayEvent) -> None:
        pass

    gw = Gateway([_upstream("paged", "paged.py")], pipeline=CallPipeline(policy=Script(), guard=EvidenceGuard(record)))
    async with anyio.create_task_group() as tg:
        await tg.start(gw.run)
        await gw.wait_settled(scaled(30))
        upstream = gw.upstreams["paged"]
        outbound = Collect()
        session = open_session(gw, "agent-7", outbound, transport="test")
        await request(session, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
        await session.handle(parse_client_message(b'{"jsonrpc":"2.0","method":"notifications/initialized"}'))
        # Make the upstream grow through the gateway's own session (as a control-plane call would).
        grown = await upstream.request("tools/call", {"name": "grow", "arguments": {}})
        assert grown["result"]["content"][0]["text"] == "grow"
        await eventually_async(lambda: "paged.t5" in gw.tools.names(), scaled(10), "the grown catalogue")
        changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        await eventually_async(lambda: changed in outbound.messages, scaled(5), "tools/list_changed")
        listed = (await request(session, "tools/list"))["result"]["tools"]
        assert [tool["name"] for tool in listed] == [f"paged.t{i}" for i in range(6)]
        assert (await call(session, "paged.t5", {}))["result"]["content"][0]["text"] == "t5"
        tg.cancel_scope.cancel()


async def test_a_call_that_ran_but_could_not_be_recorded_is_not_answered_with_its_result() -> None:
    from drawbridge.gateway.protocol.jsonrpc import EVIDENCE_UNWRITTEN, RESULT_WITHHELD

    async def record(event: RelayEvent) -> None:
        if isinstance(event, CallRecord):
            raise OSError("disk full")

    async with gateway(Script(), record) as (gw, session, _):
        ran = await call(session, "github.list_repos", {"owner": "acme"})
        assert ran["error"] == {"code": EVIDENCE_UNWRITTEN, "message": RESULT_WITHHELD}
        assert "rocket" not in json.dumps(ran)
        after = await call(session, "github.list_repos", {"owner": "acme"})
    assert after["result"]["isError"] is True
