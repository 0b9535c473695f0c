"""The call lifecycle as a unit (``gateway.pipeline.call``), with the transport and the upstream played
by the test: what only this unit does -- one record then one answer per call, the timeout, the
agent's cancellation, results withheld once evidence failed, refusals after any failed trace entry,
and the one reading of an upstream's answer."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from conftest import eventually_async, scaled
from pipeline_support import running

from drawbridge.gateway.pipeline.call import CallPipeline, GatewayError, GatewayResult, UpstreamAnswer
from drawbridge.gateway.pipeline.deciders import RECORDING_FAILED, allow_all
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.outcomes import NOT_AN_OBJECT, Outcome
from drawbridge.gateway.pipeline.records import CallRecord, RelayEvent
from drawbridge.gateway.protocol.jsonrpc import (
    EVIDENCE_UNWRITTEN,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESULT_WITHHELD,
    UPSTREAM_TIMEOUT,
)

pytestmark = pytest.mark.anyio


class Recorder:
    """Keeps the events; ``fail`` makes the next record raise; ``record_event`` appends trace entries."""

    def __init__(self) -> None:
        self.events: list[RelayEvent] = []
        self.entries: list[tuple[str, Any]] = []
        self.fail = False
        self.fail_entries = False

    async def __call__(self, event: RelayEvent) -> None:
        self.record_now([event])

    def record_now(self, events: Any) -> None:
        if self.fail:
            raise OSError("disk full")
        self.events.extend(events)

    async def record_event(self, kind: str, body: Any) -> dict[str, Any]:
        if self.fail_entries:
            raise OSError("disk full")
        self.entries.append((kind, body))
        return {"seq": len(self.entries) - 1}

    def calls(self) -> list[CallRecord]:
        return [event for event in self.events if isinstance(event, CallRecord)]


def pipeline(recorder: Recorder, **options: Any) -> CallPipeline:
    return CallPipeline(policy=allow_all, guard=EvidenceGuard(recorder), **options)


async def test_every_call_is_recorded_once_before_it_is_answered_once() -> None:
    recorder = Recorder()
    async with running(pipeline(recorder), tools={"echo"}) as rig:
        flights = [rig.start(i, "echo", {"n": i}) for i in range(3)]
        unknown = rig.start(9, "nope", {"password": "hunter2"})
        await rig.pipeline.flush()
    assert [f.request_id for f in rig.agent.delivered] == [0, 1, 2, 9]
    assert all(isinstance(f.answer, UpstreamAnswer) for f in flights)
    assert [r.request_id for r in recorder.calls()] == [0, 1, 2, 9]
    assert [r.outcome for r in recorder.calls()] == [Outcome.OK] * 3 + [Outcome.INVALID]
    # An unknown name: refused before any rule, recorded without the parsed call (nothing digested).
    assert unknown.answer == GatewayError(INVALID_PARAMS, "invalid params: unknown tool: the gateway serves no "
                                          "tool of this name (see tools/list)")
    assert recorder.calls()[3].call is None and recorder.calls()[3].action is None
    assert [f.request_id for f in rig.upstream.sent] == [0, 1, 2]


async def test_a_failed_trace_entry_fails_the_pipeline_closed_like_a_failed_call_record() -> None:
    recorder = Recorder()
    async with running(pipeline(recorder), tools={"echo"}) as rig:
        assert (await rig.call(1, "echo")).outcome is Outcome.OK
        recorder.fail_entries = True
        with pytest.raises(OSError, match="disk full"):
            await rig.pipeline.guard.append("approval_requested", {"x": 1})
        refused = await rig.call(2, "echo")
    assert refused.outcome is Outcome.REFUSED and not refused.forwarded
    assert isinstance(refused.answer, GatewayResult)
    assert RECORDING_FAILED in refused.answer.result["content"][0]["text"]
    assert [f.request_id for f in rig.upstream.sent] == [1]


async def test_a_call_that_ran_but_could_not_be_recorded_has_its_result_withheld() -> None:
    recorder = Recorder()
    async with running(pipeline(recorder), tools={"echo"}) as rig:
        recorder.fail = True
        ran = await rig.call(1, "echo")
        recorder.fail = False
        later = await rig.call(2, "echo")
    assert ran.forwarded and ran.answer == GatewayError(EVIDENCE_UNWRITTEN, RESULT_WITHHELD)
    assert later.outcome is Outcome.REFUSED and not later.forwarded
    assert [f.request_id for f in rig.upstream.sent] == [1]


async def test_a_forwarded_call_times_out_and_the_upstream_is_told() -> None:
    recorder = Recorder()
    async with running(pipeline(recorder, call_timeout=0.2), tools={"hang", "echo"}) as rig:
        rig.upstream.hold.add("hang")
        with anyio.fail_after(scaled(5)):
            hung = await rig.call(1, "hang")
            fine = await rig.call(2, "echo")
    assert hung.outcome is Outcome.TIMEOUT and hung.error_code == UPSTREAM_TIMEOUT
    assert hung.answer == GatewayError(UPSTREAM_TIMEOUT, "the upstream did not answer tools/call within 0.2 seconds")
    assert [(f.request_id, reason, timed_out) for f, reason, timed_out in rig.upstream.abandoned] == [
        (1, "gateway timeout", True)
    ]
    assert fine.outcome is Outcome.OK
    assert recorder.calls()[0].latency_ms >= 200


async def test_a_cancelled_call_is_recorded_answers_nothing_and_the_upstream_is_told() -> None:
    recorder = Recorder()
    async with running(pipeline(recorder), tools={"hang"}) as rig:
        rig.upstream.hold.add("hang")
        flight = rig.start(7, "hang")
        assert flight.forwarded
        rig.pipeline.cancel(flight, "the agent cancelled the request")
        rig.pipeline.answered(flight, {"jsonrpc": "2.0", "id": 7, "result": {"content": []}})  # too late
        await rig.pipeline.flush()
    assert flight.outcome is Outcome.CANCELLED and flight.answer is None
    assert [r.outcome for r in recorder.calls()] == [Outcome.CANCELLED]
    assert rig.upstream.abandoned == [(flight, "the agent cancelled the request", False)]


@pytest.mark.parametrize(
    ("body", "outcome", "answer"),
    [
        ({"result": {"content": []}}, Outcome.OK, None),
        ({"result": {"content": [], "isError": True}}, Outcome.TOOL_ERROR, None),
        ({"error": {"code": -32000, "message": "boom"}}, Outcome.UPSTREAM_ERROR, None),
        ({"result": "not an object"}, Outcome.UPSTREAM_ERROR, GatewayError(INTERNAL_ERROR, NOT_AN_OBJECT)),
        ({"result": ["a"]}, Outcome.UPSTREAM_ERROR, GatewayError(INTERNAL_ERROR, NOT_AN_OBJECT)),
    ],
)
async def test_the_outcome_is_read_once_from_the_answer(body: dict[str, Any], outcome: Outcome, answer: Any) -> None:
    recorder = Recorder()
    async with running(pipeline(recorder), tools={"t"}) as rig:
        rig.upstream.hold.add("t")
        flight = rig.start(1, "t")
        rig.pipeline.answered(flight, {"jsonrpc": "2.0", "id": 1, **body})
        await rig.pipeline.flush()
    assert flight.outcome is outcome and recorder.calls()[0].outcome is outcome
    # A JSON-RPC error and a result object are the upstream's own answer; anything else is never passed on.
    assert flight.answer == (answer if answer is not None else UpstreamAnswer({"jsonrpc": "2.0", "id": 1, **body}))


async def test_an_input_required_result_is_refused_to_a_handshake_era_agent() -> None:
    recorder = Recorder()
    asking = {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "inputRequests": {}}}
    async with running(pipeline(recorder), tools={"t"}) as rig:
        rig.upstream.hold.add("t")
        legacy = rig.start(1, "t", version="2025-11-25")
        rig.pipeline.answered(legacy, asking)
        modern = rig.start(2, "t", version="2026-07-28")
        rig.pipeline.answered(modern, {**asking, "id": 2})
        await rig.pipeline.flush()
    assert isinstance(legacy.answer, GatewayError) and legacy.answer.code == INTERNAL_ERROR
    assert "2025-11-25 connection cannot answer" in legacy.answer.message
    assert isinstance(modern.answer, UpstreamAnswer)
    assert legacy.outcome is modern.outcome is Outcome.INPUT_REQUIRED


async def test_a_stage_that_raises_while_the_call_waits_refuses_the_call_and_nothing_else() -> None:
    from drawbridge.gateway.pipeline.floors import Floors

    class Broken(Floors):
        def now(self, route: Any) -> None:
            return None  # "a check is in progress": the call waits

        async def when_checked(self, route: Any) -> Any:
            raise RuntimeError("the pin store went away")

    recorder = Recorder()
    broken = Broken(pins=object())  # type: ignore[arg-type]  # pins are on: the floor is asked for
    async with running(pipeline(recorder, floors=broken), tools={"echo"}) as rig:
        flight = rig.start(1, "echo")
        assert flight.verdict is None  # it waits in a task of its own
        await eventually_async(lambda: flight.completed, scaled(5), "the call's completion")
        later = await rig.call(2, "echo")
    assert flight.outcome is Outcome.REFUSED and not flight.forwarded
    assert flight.verdict is not None and flight.verdict.reason == "the decision failed (RuntimeError); failing closed"
    assert later.outcome is Outcome.REFUSED  # the same stage fails for it too, and the gateway goes on
    assert [r.request_id for r in recorder.calls()] == [1, 2] and rig.upstream.sent == []
