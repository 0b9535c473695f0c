"""The one lifecycle of a tools/call, whatever the transport and whatever the upstream kind.

Invariant: a tools/call reaches an upstream only when, for exactly the name and arguments the
upstream receives, the floors, the policy and -- for ``human_approval`` -- a settled approval said
``allow``. Anything else (deny, an approval that cannot be obtained, a decider that fails, a name
no catalogue lists, a request that cannot be read one way, evidence that failed earlier) ends in an
answer from the gateway itself, naming the rule and the reason but never an argument value. Every
call gets exactly one record and then exactly one answer (none when the agent cancelled it), and
the record reaches the OS first; a call that ran but could not be recorded is answered with
``EVIDENCE_UNWRITTEN``, never with its result. This module alone builds the record, guards the
recorder, applies the call timeout and cancellation, withholds results and turns verdicts into
refusals: wrap's relay and serve's sessions only move bytes and hand calls here.

Theory of operation. A transport hands each tools/call request to ``start`` (which never waits) or
``call`` (which returns once the call is answered), with the agent's id, the session's protocol
version, a ``Replier`` (the agent's side: how to ask it in-band, how to write answers) and a
``Resolver`` (the catalogue: which upstream serves the name, through which ``Forwarder``). A
``Flight`` then goes through the stages, each returning what the next takes:

1. parse: ``tool_call.parse_tool_call``; the gateway's own retry fields (``client_link``) are taken
   out of what is forwarded;
2. resolve: the name in the catalogue (``Resolver``); an unknown name is invalid; with rate limits
   (``rate_limits``) a call with no token left is refused here, before it is decided (never fast path);
3. floors: ``floors.Floors`` (pins, CLI dispatchers), raised over the policy; arguments the upstream
   could never run (``floors.refused_arguments``) are denied here, before any policy or person;
4. policy: the ``Decider``, guarded (``deciders``): a failing decider is a deny;
5. approval: ``approvals.gate.ApprovalGate`` for ``human_approval`` and for 2026-07-28 retries; when
   a person allowed the call, 3 and 4 run again and must ask the same question;
6. forward: ``Forwarder.send``, once the evidence guard has checked that the call's record can be
   built (``EvidenceGuard.admit``), under the call timeout (one watch task for every call: their
   deadlines come in the order they were sent); a task call to a tool ``result_guards`` guards is refused;
7. settle: the upstream's answer (``answered``; its result guarded, ``result_guards``, a large one on a
   worker thread while the loop goes on), its loss (``lost``), the timeout, or the agent's cancellation (``cancel``) -- whoever comes first; the others find it settled;
8. record: one ``CallRecord`` through the ``EvidenceGuard``;
9. answer: ``Replier.deliver``, or the return of ``call``.

The fast path is a property of this unit, not a second route: when the catalogue, the floors and the
policy answer without waiting (``Decider.decide_now``), steps 1 to 6 run inside ``start`` with no
task, and the flight is completed by ``flush``, which the transport calls at the end of each read:
the flights settled by one read of the upstream are recorded together (one write per evidence file)
and answered together (one write per agent). A call that must wait (an approval, a pin check, a
catalogue not listed yet) gets a decision task, and is then completed the same way.

Size. This module is one unit on purpose: every way a call ends (refused, forwarded and answered,
lost, timed out, cancelled, withheld) is a transition of ``Flight`` made here, so one reading shows
that each call is recorded once and answered once; the values the stages pass on and the stages
themselves live in the modules beside it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import anyio
import anyio.abc
from anyio.abc import TaskStatus

from drawbridge.catalogue.floors import NO_FLOOR
from drawbridge.gateway.pipeline.approvals.gate import ApprovalGate
from drawbridge.gateway.pipeline.approvals.settlement import clip
from drawbridge.gateway.pipeline.client_link import (
    NO_LINK, ClientLink, Elicit, forwardable_params, is_gateway_retry, retry_link,
)
from drawbridge.gateway.pipeline.deciders import (
    RECORDING_FAILED,
    Decider,
    decider_failure,
    guarded_decision,
    guarded_decision_now,
)
from drawbridge.gateway.pipeline.floors import Floors, Route, floored_verdict, refused_arguments
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.outcomes import Outcome, outcome_of_response
from drawbridge.gateway.pipeline.rate_limits import RateLimiter
from drawbridge.gateway.pipeline.records import CallRecord
from drawbridge.gateway.pipeline.call_answers import Answer, GatewayError, GatewayResult, UpstreamAnswer
from drawbridge.gateway.pipeline.result_guards import (
    GUARD_OFF_LOOP_CHARS, GUARDED_OUTCOMES, Guarded, GuardReport, ResultGuards, carries_more_than, guarded_line,
)
from drawbridge.gateway.pipeline.tool_call import ToolCall, parse_tool_call, requested_tool_name
from drawbridge.gateway.pipeline.upstream_answers import INPUT_REQUIRED_FOR_HANDSHAKE, rewritten
from drawbridge.gateway.pipeline.verdicts import (
    GATEWAY_POLICY,
    Action,
    Provenance,
    Verdict,
    refusal_for,
    refusal_result,
)
from drawbridge.gateway.protocol.jsonrpc import (
    EVIDENCE_UNWRITTEN,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESULT_WITHHELD,
    UPSTREAM_EXITED,
    UPSTREAM_TIMEOUT,
    Message,
    MessageError,
    encode_line,
)
from drawbridge.state.errors import failure_text

logger = logging.getLogger("drawbridge.gateway")

DEFAULT_CALL_TIMEOUT_SECONDS: Final = 120.0
UNKNOWN_TOOL: Final = "unknown tool: the gateway serves no tool of this name (see tools/list)"
DECISION_CHANGED: Final = (
    "the decision changed while the approval was pending (the policy or the tool's catalogue entry "
    "changed; it now says {action}); call again"
)


# ------------------------------------------------------------------------------------- collaborators


class Forwarder(Protocol):
    """An upstream kind, as the lifecycle sees it."""

    def send(self, flight: Flight) -> Awaitable[None] | None:
        """Hand the decided call over (``flight.message``, ``flight.resolved.route``). Its end comes back
        through ``CallPipeline.answered`` or ``lost``; ``send`` itself never raises for the call."""
        ...

    def abandon(self, flight: Flight, reason: str, *, timed_out: bool) -> Awaitable[None] | None:
        """The call is no longer wanted (timed out, or the agent cancelled it): tell the upstream."""
        ...


@dataclass(frozen=True, slots=True)
class Resolved:
    route: Route
    forwarder: Forwarder


WAIT: Final = object()
"""``Resolver.resolve_now``'s answer when the catalogue is not known yet: ``resolve`` must be awaited."""


class CatalogueUnavailable(Exception):
    """The catalogue cannot be read now (the message says why): the call is refused."""


class Resolver(Protocol):
    """The catalogue a call is resolved in: the served name to its route and its upstream."""

    def resolve_now(self, tool: str) -> Resolved | None | object:
        """The resolution, None for an unknown name, or ``WAIT``."""
        ...

    async def resolve(self, tool: str) -> Resolved | None:
        """The resolution once the catalogue is known; raises ``CatalogueUnavailable``."""
        ...


class Replier(Protocol):
    """The agent's side of its calls, as the lifecycle sees it."""

    session_id: str | None
    """The transport's session id for these calls, where one exists (HTTP ``Mcp-Session-Id``)."""

    def elicit(self, flight: Flight) -> Elicit | None:
        """How to ask this call's agent in-band (2025-11-25 ``elicitation/create``), if it can be."""
        ...

    def deliver(self, flights: Sequence[Flight]) -> Awaitable[None] | None:
        """Write the answers of these recorded flights (``flight.answer``, None: nothing is due), in order."""
        ...


# -------------------------------------------------------------------------------------------- flight


@dataclass(eq=False, slots=True)
class Flight:
    """One tools/call from the moment the pipeline takes it to its answer."""

    message: Message
    """The request; a 2026-07-28 retry's gateway fields are taken out of it (what is forwarded)."""
    agent: str
    version: str | None
    replier: Replier
    resolver: Resolver
    started: float
    awaited: bool = False
    """Completed by the task that awaits it (``call``), not by ``flush``."""
    call: ToolCall | None = None
    link: ClientLink = NO_LINK
    resolved: Resolved | None = None
    verdict: Verdict | None = None
    decided_at: float | None = None
    forwarded: bool = False
    settled: bool = False
    completed: bool = False
    outcome: Outcome | None = None
    error: str | None = None
    error_code: int | None = None
    finished_at: float | None = None
    answer: Answer | None = None
    deadline: float | None = None
    """``time.monotonic()`` when the forwarded call times out."""
    done: anyio.Event | None = None
    """Set when an awaited flight is settled."""
    scope: anyio.CancelScope | None = None
    """What the flight's decision awaits; cancelled when the flight is settled meanwhile."""
    handle: Any = None
    """The forwarder's own bookkeeping for this call (an upstream request, a queued line)."""
    guarded: GuardReport | None = None
    """What ``result_guards`` did to the answer, when it did something."""

    @property
    def request_id(self) -> Any:
        return self.message.id


# ------------------------------------------------------------------------------------------ pipeline


class CallPipeline:
    """The lifecycle (module docstring). One per gateway process, shared by every transport."""

    def __init__(
        self,
        *,
        policy: Decider,
        guard: EvidenceGuard,
        floors: Floors | None = None,
        approvals: ApprovalGate | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
        rate_limits: RateLimiter | None = None,
        result_guards: ResultGuards | None = None,
        refuse_after_record_failure: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = policy
        self.guard = guard
        self.floors = floors if floors is not None else Floors()
        self.approvals = approvals
        self.call_timeout = call_timeout
        self.rate_limits = rate_limits
        self.result_guards = result_guards
        self.refuse_after_record_failure = refuse_after_record_failure
        self.clock = clock
        policy_now = getattr(policy, "decide_now", None)
        self._policy_now: Callable[[ToolCall], Verdict | None] | None = policy_now if callable(policy_now) else None
        self._settled: list[Flight] = []
        self._withdrawals: list[tuple[Any, str]] = []
        self._withdrawing: anyio.Event | None = None
        """Set while withdrawn approvals are being ended (``_end_withdrawn``)."""
        """Approvals of calls that can no longer run, with why: ``flush`` ends them."""
        """Settled flights of ``start`` that ``flush`` completes."""
        self._timed: dict[Flight, None] = {}
        """Forwarded flights waiting for their upstream, in the order they were sent (= deadline order)."""
        self._wake: anyio.Event | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._deciding = 0
        self._undecided: anyio.Event | None = None
        """Set when the last decision that waited has ended (``decisions_done``)."""

    # ---------------------------------------------------------------------------------- running

    @property
    def running(self) -> bool:
        return self._tasks is not None

    @property
    def deciding(self) -> int:
        """How many calls are being decided by a task of their own (an approval, a pin check)."""
        return self._deciding

    async def decisions_done(self) -> None:
        """Return once no call is being decided (every call taken so far is refused or forwarded)."""
        while self._deciding:
            if self._undecided is None:
                self._undecided = anyio.Event()
            await self._undecided.wait()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The pipeline's own tasks (the timeout watch, decisions that wait), until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tasks = tg
            try:
                tg.start_soon(self._watch_deadlines)
                task_status.started()
                await anyio.sleep_forever()
            finally:
                self._tasks = None
                tg.cancel_scope.cancel()

    # ------------------------------------------------------------------------------------ taking

    def start(
        self, message: Message, *, agent: str, version: str | None, replier: Replier, resolver: Resolver
    ) -> Flight:
        """Take a tools/call and carry it as far as it goes without waiting; never awaits. The flight
        is answered through ``replier.deliver`` by ``flush`` (or by its decision task)."""
        flight = self._admit(message, agent, version, replier, resolver, awaited=False)
        if flight.settled:
            return flight
        verdict = self._decide_now(flight)
        if verdict is None:
            self._deciding += 1  # counted from now: the task may not have started when someone asks
            self._spawn(self._decision_task, flight)
            return flight
        sending = self._act(flight, verdict)
        if sending is not None:
            self._spawn(self._await_sending, sending)
        return flight

    async def call(
        self, message: Message, *, agent: str, version: str | None, replier: Replier, resolver: Resolver
    ) -> Flight:
        """Take a tools/call and return it recorded, with its ``answer``. Cancelling the caller
        cancels the call: the upstream is told, the call is recorded, the cancellation goes on."""
        flight = self._admit(message, agent, version, replier, resolver, awaited=True)
        try:
            if not flight.settled:
                verdict = self._decide_now(flight)
                if verdict is None:
                    self._deciding += 1
                    verdict = await self._decide_in_scope(flight)
                if verdict is not None and not flight.settled:
                    sending = self._act(flight, verdict)
                    if sending is not None:
                        await sending
            assert flight.done is not None
            await flight.done.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                abandoning = self.cancel(flight, "the agent cancelled the request")
                if abandoning is not None:
                    await abandoning
                await self._complete([flight], deliver=False)
            raise
        if self._withdrawals or self._withdrawing is not None:
            await self._end_withdrawn()
        await self._complete([flight], deliver=False)
        return flight

    def _admit(
        self,
        message: Message,
        agent: str,
        version: str | None,
        replier: Replier,
        resolver: Resolver,
        *,
        awaited: bool,
    ) -> Flight:
        """Stages 1 and 2: parse and resolve (module docstring)."""
        flight = Flight(message, agent, version, replier, resolver, self.clock(), awaited)
        if awaited:
            flight.done = anyio.Event()
        params = message.body.get("params")
        if is_gateway_retry(params, self._owns_state):
            # The gateway's requestState (and the answers to its own question) are the gateway's:
            # verified by the approval stage, never forwarded (``client_link``).
            assert isinstance(params, dict)
            body = {**message.body, "params": forwardable_params(params)}
            flight.message = dataclasses.replace(message, raw=encode_line(body)[:-1], body=body)
            flight.link = retry_link(params, owns=self._owns_state)
        try:
            flight.call = parse_tool_call(flight.message, agent, version)
        except MessageError as exc:
            self._settle(flight, Outcome.INVALID, exc.message, exc.code, GatewayError(exc.code, exc.message))
            return flight
        flight.version = flight.call.protocol_version
        resolved = resolver.resolve_now(flight.call.tool)
        if resolved is None:
            self._unknown(flight)
        elif resolved is not WAIT:
            assert isinstance(resolved, Resolved)
            flight.resolved = resolved
        return flight

    def _owns_state(self, state: object) -> bool:  # without approvals, no requestState is the gateway's
        return self.approvals is not None and self.approvals.engine.owns_state(state)

    def _unknown(self, flight: Flight) -> None:
        flight.call = None  # recorded as an invalid request: no decision, nothing digested
        message = f"invalid params: {UNKNOWN_TOOL}"
        self._settle(flight, Outcome.INVALID, UNKNOWN_TOOL, INVALID_PARAMS, GatewayError(INVALID_PARAMS, message))

    # ---------------------------------------------------------------------------------- deciding

    def _refused_for_evidence(self) -> Verdict | None:
        if self.guard.failed and self.refuse_after_record_failure:
            return Verdict(Action.DENY, RECORDING_FAILED, Provenance(GATEWAY_POLICY))
        return None

    def _decide_now(self, flight: Flight) -> Verdict | None:
        """Stages 3 to 5 without waiting; None when this call must wait (a task then decides it)."""
        if self.guard.failed and self.refuse_after_record_failure:
            return self._refused_for_evidence()
        resolved = flight.resolved
        call = flight.call
        if resolved is None or call is None or flight.link is not NO_LINK:  # a retry goes to the approval stage
            return None
        if self.rate_limits is not None:  # the buckets are checked by the decision task
            return None
        route = resolved.route
        if (refused := refused_arguments(route, call.tool, call.arguments)) is not None:
            return refused
        floors = self.floors
        floor = NO_FLOOR if floors.pins is None and not route.dispatcher else floors.now(route)
        if floor is None or self._policy_now is None:
            return None
        verdict = guarded_decision_now(self._policy_now, call)
        if verdict is None:
            return None
        if floor is not NO_FLOOR:
            verdict = floored_verdict(verdict, floor, call.tool)
        if verdict.action is Action.HUMAN_APPROVAL and self.approvals is not None:
            return None
        return verdict

    async def _floored(self, call: ToolCall, route: Route) -> Verdict:
        """Stages 3 and 4, waiting where they must."""
        if (refused := refused_arguments(route, call.tool, call.arguments)) is not None:
            return refused
        floor = self.floors.now(route)
        if floor is None:
            floor = await self.floors.when_checked(route)
        verdict = None
        if self._policy_now is not None:
            verdict = guarded_decision_now(self._policy_now, call)
        if verdict is None:
            verdict = await guarded_decision(self.policy, call)
        verdict = floored_verdict(verdict, floor, call.tool)
        if route.generic and verdict.action is Action.HUMAN_APPROVAL:
            verdict = dataclasses.replace(verdict, generic=True)  # memory never answers for a program
        return verdict

    async def _decide(self, flight: Flight) -> Verdict | None:
        """Stages 2 to 5, waiting where they must; None when the flight was settled meanwhile (an
        unknown name found once the catalogue was known)."""
        refused = self._refused_for_evidence()
        if refused is not None:
            return refused
        call = flight.call
        assert call is not None
        if flight.resolved is None:
            try:
                resolved = await flight.resolver.resolve(call.tool)
            except CatalogueUnavailable as exc:
                return Verdict(Action.DENY, str(exc), Provenance(GATEWAY_POLICY))
            if resolved is None:
                self._unknown(flight)
                return None
            flight.resolved = resolved
        if self.rate_limits is not None and (limited := await self.rate_limits.check(call)) is not None:
            return limited
        route = flight.resolved.route
        verdict = await self._floored(call, route)
        if self.approvals is None or (verdict.action is not Action.HUMAN_APPROVAL and not flight.link.retry):
            return verdict
        link = dataclasses.replace(flight.link, elicit=flight.replier.elicit(flight))
        # The decision so far: the record keeps it should the call end while a person is asked.
        flight.verdict = verdict
        try:
            settled = await self.approvals.settle(call, verdict, link)
        except Exception as exc:  # noqa: BLE001 -- a failing approval stage is a deny, whatever it raised
            logger.error("the approval stage raised %s; the call is refused", failure_text(exc))
            return decider_failure(exc)
        if settled.action is Action.ALLOW and not link.retry:
            # A person may have taken minutes: decide again and run the call only if what was
            # approved is still what would be asked.
            again = await self._floored(call, route)
            if not verdict.same_question(again):
                return Verdict(Action.DENY, DECISION_CHANGED.format(action=again.action.value), again.provenance)
        return settled

    async def _decide_in_scope(self, flight: Flight) -> Verdict | None:
        """``_decide`` in a scope that settling the flight meanwhile (the agent cancelled) cancels; the
        caller counted the decision in ``_deciding``, which this ends."""
        verdict = None
        try:
            with anyio.CancelScope() as scope:
                flight.scope = scope
                if not flight.settled:
                    try:
                        verdict = await self._decide(flight)
                    except Exception as exc:  # noqa: BLE001 -- a stage that fails is a deny, whatever it raised
                        logger.error("deciding a call failed (%s); the call is refused", failure_text(exc))
                        verdict = decider_failure(exc)
        finally:
            flight.scope = None
            self._deciding -= 1
            if not self._deciding and self._undecided is not None:
                self._undecided.set()
                self._undecided = None
        return verdict

    async def _decision_task(self, flight: Flight) -> None:
        verdict = await self._decide_in_scope(flight)
        if verdict is not None and not flight.settled:
            sending = self._act(flight, verdict)
            if sending is not None:
                await sending
        await self.flush()

    async def _await_sending(self, sending: Awaitable[None]) -> None:
        await sending
        await self.flush()

    def _spawn(self, work: Callable[..., Awaitable[None]], *args: Any) -> None:
        if self._tasks is None:
            raise RuntimeError("the call pipeline is not running (start CallPipeline.run first)")
        self._tasks.start_soon(work, *args)

    # ----------------------------------------------------------------------------------- acting

    def _act(self, flight: Flight, verdict: Verdict) -> Awaitable[None] | None:
        """Refuse, or forward (stage 6); what is left to await of the forwarding, if anything."""
        call = flight.call
        assert call is not None
        flight.verdict = verdict
        flight.decided_at = self.clock()
        refusal = refusal_for(verdict)
        if refusal is not None:
            self._settle(flight, refusal.outcome, refusal.reason, None, GatewayResult(refusal_result(verdict, refusal, call)))
            return None
        if self.result_guards is not None and (why := self.result_guards.task_refusal(call, flight.message.params)):
            self._settle(flight, Outcome.INVALID, why, INVALID_PARAMS, GatewayError(INVALID_PARAMS, why))
            return None
        problem = self.guard.admit(call)
        if problem is not None:
            detail = f"the call's record cannot be built: {problem}; it was not run"
            flight.call = None  # recorded as an invalid request: nothing more is derived from it
            self._settle(flight, Outcome.INVALID, detail, INVALID_PARAMS, GatewayError(INVALID_PARAMS, f"invalid params: {detail}"))
            return None
        resolved = flight.resolved
        assert resolved is not None
        flight.forwarded = True
        flight.deadline = time.monotonic() + self.call_timeout
        self._timed[flight] = None
        if self._wake is not None:
            self._wake.set()
        return resolved.forwarder.send(flight)

    # --------------------------------------------------------------------------------- settling

    def _settle(
        self, flight: Flight, outcome: Outcome, error: str | None, code: int | None, answer: Answer | None
    ) -> bool:
        """The one way a flight ends; False when it had ended already (whoever came first won)."""
        if flight.settled:
            return False
        flight.settled = True
        flight.outcome, flight.error, flight.error_code, flight.answer = outcome, error, code, answer
        flight.finished_at = self.clock()
        self._timed.pop(flight, None)
        if flight.scope is not None:
            flight.scope.cancel()
        if flight.done is not None:
            flight.done.set()
        else:
            self._settled.append(flight)
        return True

    def answered(self, flight: Flight, body: Mapping[str, Any], raw: bytes | None = None,
                 *, passed: frozenset[int] = frozenset()) -> bool:
        """The upstream answered a forwarded call; False when the flight had ended already. ``passed``: the
        codes 2026-07-28 defines that its error may carry to the agent (``protocol.hop.relayed_codes``).

        A large answer to a guarded call is guarded on a worker thread (``GUARD_OFF_LOOP_CHARS``), so
        that other calls go on meanwhile and the call's timeout can still fire; the flight settles when
        it is done (True here means only that the answer was taken)."""
        if flight.settled or not flight.forwarded:
            return False
        outcome, _error, _code = outcome_of_response(body)
        call = flight.call
        guarded: Guarded | None = None
        if self.result_guards is not None and call is not None and outcome in GUARDED_OUTCOMES:
            if self._tasks is not None and carries_more_than(body, GUARD_OFF_LOOP_CHARS):
                self._spawn(self._guard_off_loop, flight, self.result_guards, call, body, raw, passed)
                return True
            guarded = guarded_line(self.result_guards, call, body)  # before any other rewrite
        return self._answer(flight, body, raw, guarded, passed)

    async def _guard_off_loop(self, flight: Flight, guards: ResultGuards, call: ToolCall, body: Mapping[str, Any],
                              raw: bytes | None, passed: frozenset[int]) -> None:
        guarded = await anyio.to_thread.run_sync(guarded_line, guards, call, body, abandon_on_cancel=True)
        self._answer(flight, body, raw, guarded, passed)
        await self.flush()

    def _answer(self, flight: Flight, body: Mapping[str, Any], raw: bytes | None,
                guarded: Guarded | None, passed: frozenset[int]) -> bool:
        """Settle a flight with the upstream's answer, ``guarded`` being what ``result_guards`` made of it."""
        if flight.settled:
            return False  # timed out or cancelled while it was being guarded
        if guarded is not None:
            body, flight.guarded, raw = guarded
        outcome, error, code = outcome_of_response(body)  # a withheld answer is an error now
        call, verdict = flight.call, flight.verdict
        answer: Answer = UpstreamAnswer(body, raw)
        if call is not None and (changed := rewritten(body, outcome, error, call, verdict, self.approvals, passed=passed)):
            outcome, error, code, new_body = changed  # ``upstream_answers``: the agent's era, an approval
            answer = GatewayError(INTERNAL_ERROR, str(error)) if new_body is None else UpstreamAnswer(new_body, encode_line(new_body)[:-1])
        elif outcome is Outcome.UPSTREAM_ERROR and "error" not in body:
            assert error is not None
            code = INTERNAL_ERROR
            answer = GatewayError(code, error)  # no CallToolResult in it: never passed on
        return self._settle(flight, outcome, error, code, answer)

    def unreadable(self, flight: Flight, detail: str) -> bool:
        """The upstream answered a forwarded call with a line the gateway dropped (too large, not
        UTF-8, not JSON): an upstream error naming the problem; False when the flight had ended."""
        if flight.settled or not flight.forwarded:
            return False
        return self._settle(flight, Outcome.UPSTREAM_ERROR, detail, INTERNAL_ERROR, GatewayError(INTERNAL_ERROR, detail))

    def lost(self, flight: Flight, detail: str, *, sent: bool = True) -> bool:
        """The upstream is gone: before it answered (``sent``), or before the call reached it (then an
        approval it waits for is withdrawn: ``withdraw_approval``)."""
        if not sent:
            flight.forwarded = False
            self.withdraw_approval(flight, detail)
        return self._settle(flight, Outcome.UPSTREAM_EXITED, detail, UPSTREAM_EXITED, GatewayError(UPSTREAM_EXITED, detail))

    def withdraw_approval(self, flight: Flight, reason: str) -> None:
        """The call can no longer run and is still waiting for a person: its approval is ended and recorded
        by the next ``flush`` (``ApprovalEngine.withdrawable``)."""
        if self.approvals is None or flight.settled or flight.scope is None or flight.call is None:
            return
        approval = self.approvals.engine.resolutions.withdrawable(flight.call)
        if approval is not None:
            self._withdrawals.append((approval, f"the call can no longer run: {reason}"))

    def cancel(self, flight: Flight, reason: str) -> Awaitable[None] | None:
        """The agent gave up on the call (or closed): no answer is due. What is left to await of telling
        the upstream, when the call had reached it."""
        if not self._settle(flight, Outcome.CANCELLED, reason, None, None):
            return None
        if flight.forwarded and flight.resolved is not None:
            return flight.resolved.forwarder.abandon(flight, reason, timed_out=False)
        return None

    async def _watch_deadlines(self) -> None:
        """Time out forwarded calls the upstream does not answer within the call timeout."""
        while True:
            if not self._timed:
                self._wake = anyio.Event()
                await self._wake.wait()
                self._wake = None
                continue
            flight = next(iter(self._timed))
            assert flight.deadline is not None
            delay = flight.deadline - time.monotonic()
            if delay > 0:
                # Every later entry has a later deadline; one settled meanwhile is skipped on waking.
                await anyio.sleep(delay)
                continue
            detail = f"the upstream did not answer tools/call within {self.call_timeout:g} seconds"
            if not self._settle(flight, Outcome.TIMEOUT, detail, UPSTREAM_TIMEOUT, GatewayError(UPSTREAM_TIMEOUT, detail)):
                continue
            assert flight.resolved is not None
            abandoning = flight.resolved.forwarder.abandon(flight, "gateway timeout", timed_out=True)
            if abandoning is not None:
                await abandoning
            await self.flush()

    # ------------------------------------------------------------------------- recording, answering

    async def flush(self) -> None:
        """Complete the flights settled since the last flush (``start``'s): record them together,
        then answer them together. Approvals withdrawn meanwhile are ended first."""
        if self._withdrawals or self._withdrawing is not None:
            await self._end_withdrawn()
        if self._settled:
            flights, self._settled = self._settled, []
            await self._complete(flights, deliver=True)

    async def _end_withdrawn(self) -> None:
        """End the approvals withdrawn so far (``withdraw_approval``), recorded before any call is
        answered: a flush that finds others ending waits for them, so that no answer (after which the
        agent may close, and the gateway stop) overtakes an approval's end; and the ending is shielded,
        so that a shutdown does not cut a question's ``approval_resolved`` off the trace."""
        while self._withdrawing is not None:
            await self._withdrawing.wait()
        if not self._withdrawals:
            return
        done = self._withdrawing = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                while self._withdrawals:
                    assert self.approvals is not None
                    approval, reason = self._withdrawals.pop(0)
                    try:
                        await self.approvals.engine.resolutions.end_unanswerable(approval, clip(reason))
                    except Exception as exc:  # noqa: BLE001 -- the approval then expires at its timeout or next start
                        logger.error("approval %s could not be withdrawn (%s)", approval.id, type(exc).__name__)
        finally:
            self._withdrawing = None
            done.set()

    async def _complete(self, flights: Sequence[Flight], *, deliver: bool) -> None:
        """Stages 8 and 9: record, then answer, each flight once (evidence first)."""
        todo = [flight for flight in flights if not flight.completed]
        if not todo:
            return
        for flight in todo:
            flight.completed = True
        rest = self.guard.record_now([self.record_of(flight) for flight in todo])
        if rest is not None:
            if deliver and self._tasks is not None:
                # The records wait for an fsync: their answers wait with them, in a task, so that
                # whoever completed them goes on serving the others meanwhile.
                self._tasks.start_soon(self._answer_when_recorded, rest, todo)
                return
            await rest
        self._withhold(todo)
        if deliver:
            await self._deliver(todo)

    async def _answer_when_recorded(self, rest: Awaitable[None], flights: list[Flight]) -> None:
        await rest
        self._withhold(flights)
        await self._deliver(flights)

    def _withhold(self, flights: Sequence[Flight]) -> None:
        """Nothing that ran is answered without evidence: once recording has failed, a forwarded
        call's result is replaced by ``EVIDENCE_UNWRITTEN`` (the agent is told why)."""
        if not self.guard.failed:
            return
        for flight in flights:
            if flight.forwarded and flight.answer is not None:
                flight.answer = GatewayError(EVIDENCE_UNWRITTEN, RESULT_WITHHELD)

    async def _deliver(self, flights: Sequence[Flight]) -> None:
        start = 0
        while start < len(flights):
            replier = flights[start].replier
            end = start + 1
            while end < len(flights) and flights[end].replier is replier:
                end += 1
            writing = replier.deliver(flights[start:end])
            if writing is not None:
                await writing
            start = end

    def record_of(self, flight: Flight) -> CallRecord:
        """Stage 8's record, from the values the stages returned (never re-derived)."""
        assert flight.outcome is not None
        finished = flight.finished_at if flight.finished_at is not None else self.clock()
        latency_ms = (finished - flight.started) * 1000.0
        call = flight.call
        if call is None:
            return CallRecord(
                agent=flight.agent,
                request_id=flight.message.id,  # type: ignore[arg-type]
                tool=requested_tool_name(flight.message),
                action=None,
                reason=None,
                provenance=None,
                outcome=flight.outcome,
                error=flight.error,
                error_code=flight.error_code,
                decision_ms=None,
                latency_ms=latency_ms,
                protocol_version=flight.version,
                session_id=flight.replier.session_id,
            )
        verdict = flight.verdict
        decided = flight.decided_at
        return CallRecord(
            agent=call.agent,
            request_id=call.request_id,
            tool=call.tool,
            action=verdict.action if verdict is not None else None,
            reason=verdict.reason if verdict is not None else None,
            provenance=verdict.provenance if verdict is not None else None,
            outcome=flight.outcome,
            error=flight.error,
            error_code=flight.error_code,
            decision_ms=(decided - flight.started) * 1000.0 if decided is not None else None,
            latency_ms=latency_ms,
            protocol_version=call.protocol_version,
            call=call,
            tool_listed=flight.resolved is not None,
            approval=verdict.approval if verdict is not None else None,
            forwarded=flight.forwarded,
            session_id=flight.replier.session_id,
            result_guard=flight.guarded,
        )


__all__ = [
    "DEFAULT_CALL_TIMEOUT_SECONDS", "INPUT_REQUIRED_FOR_HANDSHAKE", "UNKNOWN_TOOL", "WAIT", "Answer", "CallPipeline",
    "CatalogueUnavailable", "Flight", "Forwarder", "GatewayError", "GatewayResult", "Replier", "Resolved", "Resolver",
    "UpstreamAnswer",
]
