"""Who decides a tools/call by policy, and the guard that makes every decider fail closed.

Invariant: a decider's answer counts only as a ``Verdict`` with a known action. A decider that raises,
is cancelled by an error or returns anything else gives ``deny`` (``decider_failure``), naming only the
exception type: its text may quote arguments. After a failed record the pipeline refuses every call
with ``RECORDING_FAILED``: evidence is part of the contract.

A ``Decider`` is awaitable (``decide(call) -> Verdict``). One that never has to wait may also offer
``decide_now(call)``, which returns the same verdict synchronously, or None when this call needs
waiting; the pipeline then decides the call without a task of its own. The deciders defined here are
``allow_all`` (tests and an explicit ``--allow-all``), ``deny_all`` (no policy loaded) and
``PolicyDecider`` (the native policy engine, with a shadow policy beside it when one is configured:
``shadow``, which never changes its verdict).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, Protocol

from drawbridge.gateway.pipeline.shadow import shadow_verdict
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import GATEWAY_POLICY, Action, Provenance, Verdict
from drawbridge.state.policy_store import PolicyStore
from drawbridge.state.errors import failure_text, state_failure

_log = logging.getLogger("drawbridge.gateway")


class Decider(Protocol):
    async def __call__(self, call: ToolCall, /) -> Verdict: ...



class _FixedDecider:
    """A decider that gives every call the same verdict; awaitable, and synchronous as ``decide_now``."""

    def __init__(self, name: str, verdict: Verdict, doc: str) -> None:
        self._name, self._verdict, self.__doc__ = name, verdict, doc

    async def __call__(self, call: ToolCall, /) -> Verdict:
        return self._verdict

    def decide_now(self, call: ToolCall, /) -> Verdict:
        return self._verdict

    def __repr__(self) -> str:
        return self._name


allow_all: Final = _FixedDecider(
    "allow_all",
    Verdict(Action.ALLOW, "every call is allowed (--allow-all)", Provenance(GATEWAY_POLICY, None, None)),
    "Allow every call. For tests and for ``wrap --allow-all``, never a silent default.",
)
deny_all: Final = _FixedDecider(
    "deny_all",
    Verdict(Action.DENY, "no policy is loaded", Provenance(GATEWAY_POLICY, None, None)),
    "What the gateway does with no policy loaded: refuse.",
)


RECORDING_FAILED: Final = "evidence recording failed earlier in this session; failing closed"
"""The reason of every call refused once a record failed (the pipeline's guard; the evidence is part of
the contract)."""

STATE_UNAVAILABLE: Final = (
    "state unavailable: the gateway could not read or write its state database, and this call needs it "
    "(approvals, grants, rate limits); refused, retry later"
)
"""What an agent is told whatever the state's failure was (unreachable, full, locked, a malformed row): the
cause names the database, so it goes to the log (``failure_text``), never to the agent."""


def _checked(verdict: object) -> Verdict:
    if not isinstance(verdict, Verdict) or not isinstance(verdict.action, Action):
        return decider_failure(TypeError("decider returned something other than a Verdict"))
    return verdict


async def guarded_decision(decide: Decider, call: ToolCall) -> Verdict:
    """Ask ``decide``, failing closed: a decider that raises or returns something other than a
    ``Verdict`` gives deny (``decider_failure``)."""
    try:
        verdict = await decide(call)
    except Exception as exc:  # noqa: BLE001 -- a failing decider is a deny, whatever it raised
        _log.error("the decider raised %s; the call is refused", failure_text(exc))
        return decider_failure(exc)
    return _checked(verdict)


def guarded_decision_now(decide_now: Callable[[ToolCall], Verdict | None], call: ToolCall) -> Verdict | None:
    """``guarded_decision`` through a decider's synchronous form; None: it cannot decide without waiting."""
    try:
        verdict = decide_now(call)
    except Exception as exc:  # noqa: BLE001 -- a failing decider is a deny, whatever it raised
        _log.error("the decider raised %s; the call is refused", failure_text(exc))
        return decider_failure(exc)
    return None if verdict is None else _checked(verdict)


def decider_failure(exc: BaseException) -> Verdict:
    """The verdict when a decider raised: deny, naming the exception type only (its text may quote
    arguments); a state failure, even one a task group wrapped, is told as ``STATE_UNAVAILABLE``."""
    if state_failure(exc) is not None:
        return Verdict(Action.DENY, STATE_UNAVAILABLE, Provenance(GATEWAY_POLICY))
    return Verdict(
        Action.DENY, f"the decision failed ({type(exc).__name__}); failing closed", Provenance(GATEWAY_POLICY)
    )


class PolicyDecider:
    """Decides with the native policy engine (``drawbridge.policy``): one evaluation per call, no I/O.

    ``store`` is a ``drawbridge.state.policy_store.PolicyStore``; its current set is read at each call,
    so a hot reload (``watch_policies(store)``) takes effect on the next call. ``shadow``, when given, is
    decided beside it on every call and only reported, on ``Provenance.shadow`` (``shadow``).
    """

    def __init__(self, store: PolicyStore, shadow: PolicyStore | None = None) -> None:
        self.store = store
        self.shadow = shadow

    async def __call__(self, call: ToolCall, /) -> Verdict:
        return self.decide_now(call)

    def decide_now(self, call: ToolCall, /) -> Verdict:
        """The same decision, synchronously: evaluation never waits."""
        decision, digest = self.store.decide(call.agent, call.tool, call.arguments)
        shadow = None if self.shadow is None else shadow_verdict(self.shadow, call, decision.action)
        return Verdict(
            decision.action,
            decision.reason,
            Provenance(decision.policy, decision.source_file, decision.rule_index, digest or None, shadow,
                       decision.line),
            approver=decision.approver,
            memory_key=decision.memory_key,
        )


def policy_decider(path: str) -> PolicyDecider:
    """A decider for the policy file or directory at ``path``.

    Raises ``drawbridge.policy.PolicyLoadError`` (a ValueError, located ``file:line: problem``) when
    the policy does not load: a gateway never starts on a policy it cannot read.
    """
    return PolicyDecider(PolicyStore.open(path))
