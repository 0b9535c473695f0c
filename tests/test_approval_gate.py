"""The pure and in-process parts of approval in the decision path: the binding digest, the gate, the
verdict a settlement becomes, the refusal that carries a ready answer, and what the records say."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import eventually_async, scaled
from pipeline_support import running

from drawbridge.approval.binding import BINDING_DOMAIN, binding_digest
from drawbridge.approval.channels import Channel, Strength
from drawbridge.evidence.truth.carrier import args_digest
from drawbridge.gateway.pipeline.approvals.gate import (
    ApprovalGate,
    ApprovalSettings,
    BindingKey,
    build_approval_engine,
    verdict_of,
)
from drawbridge.gateway.pipeline.approvals.settlement import Settlement, SettlementKind
from drawbridge.gateway.pipeline.call import CallPipeline
from drawbridge.gateway.pipeline.client_link import (
    forwardable_params,
    is_gateway_retry,
    retry_link,
)
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord, null_recorder
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Provenance, Verdict, refusal_for, refusal_result
from drawbridge.gateway.recording.recorder import EvidenceRecorder, approval_obtained
from drawbridge.state.sqlite import StateDB

KEY = b"k" * 32
RULE = Provenance("p", "p.yaml", 2)
ASK = Verdict(Action.HUMAN_APPROVAL, "a person decides", RULE)


def expected_binding(arguments: dict[str, Any], key: bytes, key_id: str) -> str:
    """Re-done by hand: sorted compact JSON equals RFC 8785 for these ASCII-only values."""
    body = json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()
    mac = hmac.new(key, f"drawbridge.approval_binding.v1:{key_id}:".encode() + body, hashlib.sha256)
    return f"hmac-sha256:{key_id}:{mac.hexdigest()}"


# -- the binding -------------------------------------------------------------------------------


def test_binding_covers_every_argument_secrets_included() -> None:
    one = {"user": "ann", "password": "hunter2", "n": 3}
    two = {"user": "ann", "password": "hunter3", "n": 3}
    assert BINDING_DOMAIN == "drawbridge.approval_binding.v1"
    assert binding_digest(one, KEY, "kid") == expected_binding(one, KEY, "kid")
    assert binding_digest(one, KEY, "kid") != binding_digest(two, KEY, "kid")
    # The evidence digest drops secret-like keys by design, so it could not bind an approval.
    assert args_digest(one, KEY, "kid") == args_digest(two, KEY, "kid")
    assert binding_digest(one, KEY, "kid") != binding_digest(one, b"j" * 32, "kid")
    assert "hunter2" not in (binding_digest(one, KEY, "kid") or "")


@pytest.mark.parametrize(
    ("arguments", "key", "key_id"),
    [({"x": float("nan")}, KEY, "kid"), ({"x": "\ud800"}, KEY, "kid"), ({}, b"", "kid"), ({}, KEY, "bad id")],
)
def test_binding_is_none_when_it_cannot_be_computed_honestly(arguments: Any, key: bytes, key_id: str) -> None:
    assert binding_digest(arguments, key, key_id) is None


# -- settlement -> verdict ---------------------------------------------------------------------


def test_each_settlement_becomes_the_verdict_a_transport_acts_on() -> None:
    approved = Settlement(SettlementKind.ALLOW, "approved by op via control_plane", "approval ab approved",
                          approval_id="a" * 16, resolved_by="op", channel=Channel.CONTROL_PLANE,
                          strength=Strength.OPERATOR)
    verdict = verdict_of(approved, ASK)
    assert (verdict.action, verdict.provenance, verdict.answer) == (Action.ALLOW, RULE, None)
    assert verdict.approval == {"settled": "allow", "how": "approved by op via control_plane", "approval_id": "a" * 16,
                                "resolved_by": "op", "channel": "control_plane", "strength": "operator"}
    pending = Settlement(SettlementKind.PENDING, "pending", "Approval required", approval_id="b" * 16,
                         result={"content": [], "isError": True})
    held = verdict_of(pending, ASK)
    assert held.action is Action.HUMAN_APPROVAL and held.answer == {"content": [], "isError": True}
    denied = verdict_of(Settlement(SettlementKind.DENY, "timeout", "timed out"), ASK)
    assert denied.action is Action.DENY and denied.approval == {"settled": "deny", "how": "timeout"}
    unavailable = verdict_of(Settlement(SettlementKind.DENY, "unavailable", "x: approval unavailable"), ASK)
    assert unavailable.action is Action.HUMAN_APPROVAL and unavailable.answer is None
    policy = Verdict(Action.DENY, "no", RULE)
    assert verdict_of(Settlement(SettlementKind.DENY, "policy", "no"), policy) is policy


def test_a_ready_answer_is_sent_instead_of_a_refusal_and_recorded_as_pending() -> None:
    call = ToolCall("a", "t", {}, None, 1, "2026-07-28")
    answer = {"resultType": "input_required", "inputRequests": {}, "requestState": "dbrs1.x.y"}
    verdict = Verdict(Action.HUMAN_APPROVAL, "asked in-band", RULE, approval={"settled": "input_required"}, answer=answer)
    refusal = refusal_for(verdict)
    assert refusal is not None and refusal.outcome is Outcome.APPROVAL_PENDING
    assert refusal_result(verdict, refusal, call) == answer
    explained = Verdict(Action.HUMAN_APPROVAL, "nobody: approval unavailable", RULE, approval={"how": "unavailable"})
    assert refusal_for(explained).reason == "nobody: approval unavailable"  # type: ignore[union-attr]
    bare = refusal_for(ASK)
    assert bare is not None and (bare.outcome, bare.reason) == (Outcome.APPROVAL_UNAVAILABLE, "approval unavailable")


# -- the client link ---------------------------------------------------------------------------


def test_only_the_gateways_request_state_is_taken_out() -> None:
    ours = {"name": "t", "arguments": {}, "requestState": "dbrs1.abc.def", "inputResponses": {"k": {}}, "_meta": {}}
    theirs = {"name": "t", "requestState": "opaque-upstream-state", "inputResponses": {"k": {}}}
    assert is_gateway_retry(ours) and not is_gateway_retry(theirs) and not is_gateway_retry(None)
    assert forwardable_params(ours) == {"name": "t", "arguments": {}, "_meta": {}}
    link = retry_link(ours)
    assert link.retry and link.request_state == "dbrs1.abc.def" and link.input_responses == {"k": {}}
    assert not retry_link(theirs).retry


# -- the gate ----------------------------------------------------------------------------------


class Fixed:
    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict

    async def __call__(self, call: ToolCall) -> Verdict:
        return self.verdict

    def decide_now(self, call: ToolCall) -> Verdict:
        return self.verdict


@dataclass
class Trace:
    entries: list[tuple[str, dict[str, Any]]]

    async def __call__(self, kind: str, body: Any) -> None:
        self.entries.append((kind, dict(body)))


def engine_on(tmp_path: Path, trace: Trace, **settings: Any) -> Any:
    db = StateDB.open(tmp_path / "state.db")
    return build_approval_engine(ApprovalSettings(**settings), db, trace, binding_key=BindingKey(KEY, "kb")), db


def pipeline_with(decide: Any, engine: Any, *, operator_channel: bool = True) -> CallPipeline:
    return CallPipeline(
        policy=decide, guard=EvidenceGuard(null_recorder), approvals=ApprovalGate(engine, operator_channel=operator_channel)
    )


@pytest.mark.anyio
async def test_calls_are_decided_without_waiting_only_when_no_person_is_needed(tmp_path: Path) -> None:
    engine, db = engine_on(tmp_path, Trace([]), non_blocking=True)
    try:
        allow = Verdict(Action.ALLOW, "fine", RULE)

        async def awaited_only(call: ToolCall) -> Verdict:
            return allow

        for decide, decided_now in ((Fixed(allow), True), (Fixed(ASK), False), (awaited_only, False)):
            async with running(pipeline_with(decide, engine)) as rig:
                flight = rig.start(1, "t", {"x": 1})
                assert (flight.verdict is not None) is decided_now
                assert flight.forwarded is decided_now
    finally:
        db.close()


@pytest.mark.anyio
async def test_the_gate_binds_with_every_argument_and_asks_nobody_without_a_channel(tmp_path: Path) -> None:
    trace = Trace([])
    engine, db = engine_on(tmp_path, trace, non_blocking=True)
    try:
        async with running(pipeline_with(Fixed(ASK), engine, operator_channel=True)) as rig:
            first = await rig.call(1, "t", {"user": "ann", "password": "p1"})
            assert first.verdict is not None and first.verdict.action is Action.HUMAN_APPROVAL
            assert first.outcome is Outcome.APPROVAL_PENDING and not first.forwarded
            requested = [body for kind, body in trace.entries if kind == "approval_requested"]
            assert requested[0]["args_digest"] == expected_binding({"user": "ann", "password": "p1"}, KEY, "kb")
            await engine.resolve(requested[0]["approval_id"], "approve", "op", Channel.CONTROL_PLANE)
            other = await rig.call(2, "t", {"user": "ann", "password": "p2"})
            assert other.outcome is Outcome.APPROVAL_PENDING and not other.forwarded  # does not ride
            same = await rig.call(3, "t", {"user": "ann", "password": "p1"})
            assert same.verdict is not None and same.verdict.action is Action.ALLOW and same.forwarded
            assert same.verdict.approval is not None
            assert same.verdict.approval["approval_id"] == requested[0]["approval_id"]
            assert [flight.request_id for flight in rig.upstream.sent] == [3]

        async with running(pipeline_with(Fixed(ASK), engine, operator_channel=False)) as rig:
            refused = await rig.call(4, "t", {"q": 1})
        assert refused.verdict is not None and refused.verdict.action is Action.HUMAN_APPROVAL
        assert refused.outcome is Outcome.APPROVAL_UNAVAILABLE and refused.verdict.answer is None
        assert refused.verdict.reason.endswith("approval unavailable")
        assert sum(1 for kind, _ in trace.entries if kind == "approval_requested") == 2  # nobody was asked
    finally:
        db.close()


@pytest.mark.anyio
@pytest.mark.parametrize("operator_channel", [False, True])
async def test_a_question_the_client_answers_with_an_error_ends_at_once_when_nobody_else_can_answer(
    tmp_path: Path, operator_channel: bool
) -> None:
    import anyio

    trace = Trace([])
    engine, db = engine_on(tmp_path, trace, timeout_seconds=60, poll_seconds=0.05)
    asked: list[str] = []

    async def failing(call: ToolCall, params: Any) -> Any:
        asked.append(params["message"])
        raise RuntimeError("the agent answered elicitation/create with an error")

    try:
        flights: list[Any] = []
        async with running(pipeline_with(Fixed(ASK), engine, operator_channel=operator_channel), ask=failing) as rig:

            async def call() -> None:
                flights.append(await rig.call(1, "t", {"q": 1}))

            with anyio.fail_after(scaled(10)):  # far below the 60 s timeout
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    await eventually_async(lambda: asked, what="the elicitation being asked")
                    if operator_channel:  # the question stays open to the operator, who answers it
                        await anyio.sleep(scaled(0.3))
                        assert not flights
                        requested = [body for kind, body in trace.entries if kind == "approval_requested"]
                        await engine.resolve(requested[0]["approval_id"], "approve", "op", Channel.CONTROL_PLANE)
        (flight,) = flights
        verdict = flight.verdict
        resolved = [body for kind, body in trace.entries if kind == "approval_resolved"]
        assert len(resolved) == 1
        if operator_channel:
            assert verdict.action is Action.ALLOW and flight.forwarded
            assert resolved[0]["resolved_by"] == "op"
        else:
            assert verdict.action is Action.HUMAN_APPROVAL and verdict.answer is None  # refused: unavailable
            assert flight.outcome is Outcome.APPROVAL_UNAVAILABLE and not flight.forwarded
            assert "answered the approval question with an error" in verdict.reason
            assert resolved[0]["resolved_by"] == "system:unanswerable"
            assert resolved[0]["channel"] == "system" and resolved[0]["status"] == "expired"
    finally:
        db.close()


# -- the records -------------------------------------------------------------------------------


def _record(approval: dict[str, Any] | None, action: Action = Action.ALLOW) -> CallRecord:
    call = ToolCall("agent", "delete_repo", {"name": "rocket"}, None, 1)
    return CallRecord(
        agent="agent", request_id=1, tool="delete_repo", action=action, reason="r", provenance=RULE,
        outcome=Outcome.OK, error=None, error_code=None, decision_ms=1.0, latency_ms=2.0, protocol_version=None,
        call=call, tool_listed=True, approval=approval,
    )


def test_approval_is_observed_only_when_a_person_a_grant_or_memory_approved() -> None:
    assert approval_obtained(_record({"settled": "allow", "how": "approved by op via cli"}))
    assert approval_obtained(_record({"settled": "allow", "how": "grant:0123456789abcdef"}))
    assert approval_obtained(_record({"settled": "allow", "how": "memory"}))
    assert not approval_obtained(_record({"settled": "deny", "how": "timeout"}, Action.DENY))
    assert not approval_obtained(_record(None))


@pytest.mark.anyio
async def test_the_trace_entry_and_the_carrier_say_how_the_call_was_approved(tmp_path: Path) -> None:
    contract = {
        "version": "2.0", "tools": {"allow": ["delete_repo"], "approval_required": ["delete_repo"]},
        "schemas": {}, "enforcement": {"unconstrained_tools": "allow"},
    }
    recorder = EvidenceRecorder(
        tmp_path / "ev", route=lambda tool: "srv", truth_out=tmp_path / "c.ndjson",
        truth_key=BindingKey(KEY, "kt"), declared=lambda agent: contract, fsync="never",  # type: ignore[arg-type]
    )
    try:
        block = {"settled": "allow", "how": "approved by op via cli", "channel": "cli", "strength": "operator"}
        await recorder(_record(block))
        await recorder(_record(None))
    finally:
        recorder.close()
    bodies = [json.loads(line)["body"] for line in (tmp_path / "ev" / "trace.ndjson").read_text().splitlines()]
    assert bodies[0]["approval"] == block and "approval" not in bodies[1]
    carriers = [json.loads(line) for line in (tmp_path / "c.ndjson").read_text().splitlines()]
    assert [c["decision_verdict"] for c in carriers] == ["match", "incomplete"]


class Sequence_:
    """A decider whose verdict changes after the first call (the catalogue changed during the wait)."""

    def __init__(self, first: Verdict, then: Verdict) -> None:
        self.verdicts = [first, then]

    async def __call__(self, call: ToolCall) -> Verdict:
        return self.verdicts[0] if len(self.verdicts) == 1 else self.verdicts.pop(0)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "then",
    [
        Verdict(Action.DENY, "the tool is new since its pins", RULE),
        Verdict(Action.HUMAN_APPROVAL, "catalogue floor: changed", RULE, person_only=True),
    ],
)
async def test_an_approval_runs_the_call_only_if_the_decision_still_stands(tmp_path: Path, then: Verdict) -> None:
    trace = Trace([])
    engine, db = engine_on(tmp_path, trace, non_blocking=True)
    try:
        async with running(pipeline_with(Fixed(ASK), engine)) as rig:
            await rig.call(1, "t", {"q": 1})  # asked once
        requested = [body for kind, body in trace.entries if kind == "approval_requested"]
        await engine.resolve(requested[0]["approval_id"], "approve", "op", Channel.CONTROL_PLANE)
        async with running(pipeline_with(Sequence_(ASK, then), engine)) as rig:
            stale = await rig.call(2, "t", {"q": 1})
        assert stale.verdict is not None and stale.verdict.action is Action.DENY
        assert "changed while the approval was pending" in stale.verdict.reason
        assert not stale.forwarded and rig.upstream.sent == []
        async with running(pipeline_with(Fixed(ASK), engine)) as rig:
            again = await rig.call(3, "t", {"q": 1})
        assert again.verdict is not None and again.verdict.action is not Action.ALLOW  # the approval was used
        assert rig.upstream.sent == []
    finally:
        db.close()
