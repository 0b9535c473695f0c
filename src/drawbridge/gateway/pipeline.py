"""One tools/call through the gateway: what is parsed, who decides, what the agent is told, what is recorded.

Invariant: a tools/call reaches the upstream only when a decider returned ``allow`` for exactly the tool
name and arguments the upstream will receive. Anything else (deny, human approval that cannot be
obtained, a decider that fails or is cancelled, a request whose name or arguments cannot be read
unambiguously) ends in an answer from the gateway itself, and that answer names the rule and the
reason but never repeats an argument value.

Theory of operation. The relay hands each tools/call request to ``parse_tool_call``, which reads only
``params.name``, ``params.arguments`` and ``params._meta`` and refuses what policy could misread (a
name with control or format characters, non-object arguments, a string anywhere in the call or
its id that holds a lone surrogate, which no evidence could digest). The resulting ``ToolCall`` goes to a
``Decider`` (``decide(call) -> Verdict``); ``refusal_for`` turns a verdict into either "forward" (None)
or a ``Refusal``, which ``refusal_result`` renders as a ``CallToolResult`` with ``isError: true``.
When the call is over, the relay gives a ``Recorder`` one ``CallRecord`` with the decision, its
provenance, the outcome and the timings; problems that are not a tools/call (a malformed line, an
upstream that printed garbage or exited) are recorded as ``RelayIncident``. The deciders defined here
are ``allow_all`` (tests and an explicit ``--allow-all``), ``deny_all`` (no policy loaded) and
``PolicyDecider`` (the native policy engine).

A decider or recorder that never has to wait may also offer a synchronous form that does exactly
what awaiting it does; the relay then handles a call without a task of its own. ``decide_now(call)``
returns the verdict, or None when this call needs waiting (the relay then awaits the decider).
``record_now(events)`` writes the records of several events at once and returns None, or an
awaitable for what is left (the answers wait for it). The deciders here and ``null_recorder`` offer them.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol

from drawbridge.canonical import sanitize
from drawbridge.canonical.encoders import compact_encoder
from drawbridge.gateway.jsonrpc import INVALID_PARAMS, Message, MessageError, RequestId

_log = logging.getLogger("drawbridge.gateway")
MAX_TOOL_NAME_CHARS: Final = 1024
PROTOCOL_VERSION_META_KEY: Final = "io.modelcontextprotocol/protocolVersion"
MODERN_PROTOCOL_VERSIONS: Final = frozenset({"2026-07-28"})
APPROVAL_UNAVAILABLE: Final = "approval unavailable"
REFUSAL_META_KEY: Final = "drawbridge/decision"

# Unicode categories a tool name may not contain: controls, format characters (zero-width joiners,
# bidi overrides), surrogates, line and paragraph separators. Each can make a name that looks like
# one tool to a human or a glob and like another to the upstream.
_FORBIDDEN_NAME_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_text_encode = compact_encoder(sort_keys=False, ensure_ascii=False, allow_nan=True)


class Action(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    HUMAN_APPROVAL = "human_approval"


class Outcome(StrEnum):
    """How a tools/call ended, as seen by the gateway."""

    OK = "ok"  # the upstream returned a result without isError
    TOOL_ERROR = "tool_error"  # the upstream returned a result with isError: true
    INPUT_REQUIRED = "input_required"  # the upstream returned an InputRequiredResult (2026-07-28)
    UPSTREAM_ERROR = "upstream_error"  # the upstream answered with a JSON-RPC error
    REFUSED = "refused"  # the decision was deny
    APPROVAL_UNAVAILABLE = "approval_unavailable"  # human_approval, and no way to obtain it
    APPROVAL_PENDING = "approval_pending"  # human_approval asked; the gateway answered for now (retry later)
    INVALID = "invalid"  # the request could not be read unambiguously; no decision was taken
    TIMEOUT = "timeout"  # the upstream did not answer within the call timeout
    UPSTREAM_EXITED = "upstream_exited"  # the upstream was gone before it answered
    CANCELLED = "cancelled"  # the agent cancelled the request


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a decision came from: the policy, its file, the rule's 0-based index."""

    policy: str | None = None
    source_file: str | None = None
    rule_index: int | None = None

    def label(self) -> str:
        if self.policy is None:
            return "default deny"
        name = sanitize(self.policy)
        if self.rule_index is None:
            return f'policy "{name}"'
        return f'policy "{name}" rule {self.rule_index}'


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    reason: str
    provenance: Provenance = field(default_factory=Provenance)
    approval: Mapping[str, Any] | None = None
    """How human approval settled this call (``approval.engine.Settlement.evidence()``: how, who,
    channel, strength, approval or grant id); None when the policy alone decided."""
    answer: Mapping[str, Any] | None = None
    """A ready ``CallToolResult`` the gateway answers with while an approval is open (a 2026-07-28
    ``InputRequiredResult``, or a non-blocking approval's retry instructions); the call is not run."""
    person_only: bool = False
    """Only a person may lift this ``human_approval``: it was raised by a catalogue floor (a changed
    pin), which no grant and no approval memory may relax."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The parts of a tools/call that policy reads. ``arguments`` is never written anywhere raw."""

    agent: str
    tool: str
    arguments: Mapping[str, Any]
    meta: Mapping[str, Any] | None
    request_id: RequestId
    protocol_version: str | None = None

    @property
    def modern(self) -> bool:
        return self.protocol_version in MODERN_PROTOCOL_VERSIONS


class Decider(Protocol):
    async def __call__(self, call: ToolCall, /) -> Verdict: ...


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What happened to one tools/call request, for the trace and the evidence records."""

    agent: str
    request_id: RequestId
    tool: str | None
    """The requested name, with control characters replaced; None when the request carried no string name."""
    action: Action | None
    """None when no decision was taken (the request was invalid)."""
    reason: str | None
    provenance: Provenance | None
    outcome: Outcome
    error: str | None
    """A precise description of the failure; never contains argument values."""
    error_code: int | None
    decision_ms: float | None
    latency_ms: float
    protocol_version: str | None
    call: ToolCall | None = None
    """The parsed call, for recorders that digest arguments; a recorder must not store it raw."""
    tool_listed: bool = False
    approval: Mapping[str, Any] | None = None
    """The verdict's ``approval`` (how human approval settled the call), for the records."""
    """The tool was named in an upstream ``tools/list`` answer seen in this session (the truth
    carrier's ``identity_state`` is then ``present``, else ``absent``)."""


@dataclass(frozen=True, slots=True)
class RelayIncident:
    """Something the relay handled that is not a tools/call: a bad line, an upstream that misbehaved."""

    kind: str
    """parse_error, invalid_message, oversize, duplicate_id, tools_call_notification, upstream_garbage,
    upstream_oversize, unknown_response, upstream_exited, upstream_unwritable, late_response"""
    direction: str  # "client" | "upstream"
    detail: str
    code: int | None = None


RelayEvent = CallRecord | RelayIncident


class Recorder(Protocol):
    async def __call__(self, event: RelayEvent, /) -> None: ...


# ------------------------------------------------------------------------------------------- parsing


def tool_name_problem(name: str) -> str | None:
    """Why a tool name cannot be decided on, or None. The message never contains the name."""
    if not name:
        return "tool name is empty"
    if len(name) > MAX_TOOL_NAME_CHARS:
        return f"tool name is longer than {MAX_TOOL_NAME_CHARS} characters"
    if name.isascii() and name.isprintable():
        # The usual name: printable ASCII holds no character of a forbidden category, and its only
        # whitespace is the space.
        if name[0] == " " or name[-1] == " ":
            return "tool name has leading or trailing whitespace"
        return None
    for position, char in enumerate(name):
        if unicodedata.category(char) in _FORBIDDEN_NAME_CATEGORIES:
            return f"tool name contains a control or format character (U+{ord(char):04X} at index {position})"
    if name != name.strip():
        return "tool name has leading or trailing whitespace"
    return None


def envelope_version(meta: Any) -> str | None:
    """The protocol version a 2026-07-28 request carries in its ``_meta`` envelope, if any."""
    if isinstance(meta, dict):
        version = meta.get(PROTOCOL_VERSION_META_KEY)
        if isinstance(version, str):
            return version
    return None


def parse_tool_call(message: Message, agent: str, session_version: str | None) -> ToolCall:
    """Read a tools/call request; raise ``MessageError(INVALID_PARAMS)`` for what policy cannot read."""
    assert message.id is not None
    params = message.body.get("params")

    def invalid(problem: str) -> MessageError:
        return MessageError(INVALID_PARAMS, f"invalid params: {problem}", message.id)

    if not isinstance(params, dict):
        raise invalid("tools/call params must be a JSON object")
    if has_lone_surrogate(message.raw, (message.id, params)):
        raise invalid(
            "a string in the call holds a lone surrogate (half of a UTF-16 pair escaped as \\uD800-\\uDFFF), "
            "which is not Unicode text"
        )
    name = params.get("name")
    if not isinstance(name, str):
        raise invalid("tools/call params.name must be a string")
    problem = tool_name_problem(name)
    if problem is not None:
        raise invalid(problem)
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise invalid("tools/call params.arguments must be a JSON object")
    meta = params.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        raise invalid("tools/call params._meta must be a JSON object")
    version = envelope_version(meta) or session_version
    return ToolCall(agent, name, arguments, meta, message.id, version)


def has_lone_surrogate(raw: bytes, value: Any) -> bool:
    """True when a string (or an object key) in ``value``, parsed from the line ``raw``, holds a lone
    surrogate: JSON can escape one, no text encoding can hold it, and no evidence can digest it.
    Only an escape in the line can make one, so a line without ``\\uD...`` is not searched."""
    if b"\\ud" not in raw and b"\\uD" not in raw:
        return False
    try:
        _text_encode(value).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def requested_tool_name(message: Message) -> str | None:
    """The requested name for the record of an invalid request: each control or format character (the
    ones ``tool_name_problem`` refuses, line breaks included) becomes U+FFFD; None if there is no name."""
    params = message.body.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str):
        return None
    return "".join(
        "\ufffd" if unicodedata.category(char) in _FORBIDDEN_NAME_CATEGORIES else char
        for char in name[:MAX_TOOL_NAME_CHARS]
    )


# --------------------------------------------------------------------------------- refusals


@dataclass(frozen=True, slots=True)
class Refusal:
    outcome: Outcome
    reason: str


def refusal_for(verdict: Verdict) -> Refusal | None:
    """None means forward. Only ``allow`` forwards; an unknown action can not reach here (it is an enum)."""
    if verdict.action is Action.ALLOW:
        return None
    if verdict.answer is not None:
        return Refusal(Outcome.APPROVAL_PENDING, verdict.reason)
    if verdict.action is Action.HUMAN_APPROVAL:
        # With an approval block, the reason says why no approval could be obtained.
        reason = verdict.reason if verdict.approval is not None else APPROVAL_UNAVAILABLE
        return Refusal(Outcome.APPROVAL_UNAVAILABLE, reason)
    return Refusal(Outcome.REFUSED, verdict.reason)


def refusal_text(verdict: Verdict, refusal: Refusal) -> str:
    action = "" if verdict.action is Action.DENY else f" ({verdict.action.value})"
    return f"drawbridge refused this call: {verdict.provenance.label()}{action}: {sanitize(refusal.reason)}"


def refusal_result(verdict: Verdict, refusal: Refusal, call: ToolCall) -> dict[str, Any]:
    """The ``CallToolResult`` the agent receives instead of the tool's answer (the verdict's ready
    ``answer`` while an approval is open)."""
    if verdict.answer is not None:
        return dict(verdict.answer)
    decision: dict[str, Any] = {"action": verdict.action.value, "outcome": refusal.outcome.value}
    if verdict.provenance.policy is not None:
        decision["policy"] = sanitize(verdict.provenance.policy)
    if verdict.provenance.rule_index is not None:
        decision["rule_index"] = verdict.provenance.rule_index
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": refusal_text(verdict, refusal)}],
        "isError": True,
        "_meta": {REFUSAL_META_KEY: decision},
    }
    if call.modern:
        result["resultType"] = "complete"
    return result


# ----------------------------------------------------------------------------------------- deciders

GATEWAY_POLICY: Final = "drawbridge"


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


def _checked(verdict: object) -> Verdict:
    if not isinstance(verdict, Verdict) or not isinstance(verdict.action, Action):
        return decider_failure(TypeError("decider returned something other than a Verdict"))
    return verdict


async def guarded_decision(decide: Decider, call: ToolCall, *, refuse: bool) -> Verdict:
    """Ask ``decide``, failing closed: ``refuse`` (evidence recording has failed) is a deny, and so
    is a decider that raises or returns something other than a ``Verdict``. Used by every relay."""
    if refuse:
        return Verdict(Action.DENY, RECORDING_FAILED, Provenance(GATEWAY_POLICY))
    try:
        verdict = await decide(call)
    except Exception as exc:  # noqa: BLE001 -- a failing decider is a deny, whatever it raised
        _log.error("the decider raised %s; the call is refused", type(exc).__name__)
        return decider_failure(exc)
    return _checked(verdict)


def guarded_decision_now(
    decide_now: Callable[[ToolCall], Verdict | None], call: ToolCall, *, refuse: bool
) -> Verdict | None:
    """``guarded_decision`` through a decider's synchronous form; None: it cannot decide without waiting."""
    if refuse:
        return Verdict(Action.DENY, RECORDING_FAILED, Provenance(GATEWAY_POLICY))
    try:
        verdict = decide_now(call)
    except Exception as exc:  # noqa: BLE001 -- a failing decider is a deny, whatever it raised
        _log.error("the decider raised %s; the call is refused", type(exc).__name__)
        return decider_failure(exc)
    return None if verdict is None else _checked(verdict)


def decider_failure(exc: BaseException) -> Verdict:
    """The verdict when a decider raised: deny, naming the exception type only (its text may quote arguments)."""
    return Verdict(
        Action.DENY, f"the decision failed ({type(exc).__name__}); failing closed", Provenance(GATEWAY_POLICY)
    )


class _NullRecorder:
    """Record nothing (tests that do not look at records); awaitable, and synchronous as ``record_now``."""

    __slots__ = ()

    async def __call__(self, event: RelayEvent, /) -> None:
        return None

    def record_now(self, events: Sequence[RelayEvent], /) -> None:
        return None

    def __repr__(self) -> str:
        return "null_recorder"


null_recorder: Final = _NullRecorder()



class PolicyDecider:
    """Decides with the native policy engine (``drawbridge.policy``): one evaluation per call, no I/O.

    ``store`` is a ``drawbridge.policy.PolicyStore``; its current set is read at each call, so a hot
    reload (``drawbridge.policy.watch_policies(store)``) takes effect on the next call.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    async def __call__(self, call: ToolCall, /) -> Verdict:
        return self.decide_now(call)

    def decide_now(self, call: ToolCall, /) -> Verdict:
        """The same decision, synchronously: evaluation never waits."""
        decision = self.store.evaluate(call.agent, call.tool, call.arguments)
        return Verdict(
            Action(decision.action.value),
            decision.reason,
            Provenance(decision.policy, decision.source_file, decision.rule_index),
        )


def policy_decider(path: str) -> PolicyDecider:
    """A decider for the policy file or directory at ``path``.

    Raises ``drawbridge.policy.PolicyLoadError`` (a ValueError, located ``file:line: problem``) when
    the policy does not load: a gateway never starts on a policy it cannot read.
    """
    from drawbridge.policy import PolicyStore

    return PolicyDecider(PolicyStore.open(path))


def evidence_recorder(evidence_dir: str | None, truth_out: str | None) -> Recorder:
    """A recorder that writes the hash-chained trace and the evidence records."""
    raise ValueError("evidence recording is not available in this build yet")
