"""``result_guards``: the stage between an upstream's answer to a tools/call and the agent, where a
result is redacted of secrets and held to a size (``config_guards`` reads the entries).

Invariant: with guards configured, no ``CallToolResult`` of a guarded call reaches the agent but
through ``ResultGuards.apply``: the pipeline applies it to every answer a forwarded call gets
(``CallPipeline.answered``: MCP, OpenAPI and CLI upstreams, wrap and serve, both eras; a JSON-RPC
error's message and data are redacted alike; a large answer is guarded on a worker thread, and the
flight settles only once that is done), and a call that asks to run as a task, whose result
would come back by ``tasks/result`` past this stage, is refused before it is forwarded
(``task_refusal``); a task the upstream made unasked is withheld. What is recorded of a guard's work
(``GuardReport``) names the entry, the kinds and counts of secrets, and byte counts: never a secret,
nor anything derived from one.

Theory of operation. The first entry whose ``tools`` and ``agents`` globs match the served tool name
and the agent applies (an entry that guards nothing exempts its tools). Secrets first: with
``on_secret: redact`` each is replaced (``result_text.redacted``), with ``refuse`` the result is
replaced by an ``isError`` result naming the kinds. Then the size of what is left: ``truncate`` cuts
it (``result_text.cut``), ``refuse`` replaces it by an ``isError`` result naming the size and the
limit. Without ``result_guards`` the pipeline holds None and never calls this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.config_guards import ResultGuardRule
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR, encode_line
from drawbridge.gateway.pipeline.result_text import cut, redacted, result_size
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.protocol.tasks import created_task
from drawbridge.policy.secret_patterns import BUILTIN, Detector

GUARDED_OUTCOMES: Final = frozenset(
    {Outcome.OK, Outcome.TOOL_ERROR, Outcome.INPUT_REQUIRED, Outcome.TASK_CREATED, Outcome.UPSTREAM_ERROR}
)
"""The answers that carry a ``CallToolResult`` (an ``isError`` one too); a 2026-07-28
``InputRequiredResult``, whose requests the agent reads (redacted) and whose ``requestState`` it sends
back unread (never altered: a secret in it withholds the answer); a task the upstream made unasked,
whose result would come back past the guard (it is withheld); and a JSON-RPC error, whose message and
data the upstream wrote too (redacted; never held to a size; one that is not an object is replaced)."""
INPUT_REQUIRED: Final = "input_required"
MALFORMED_ERROR: Final = (
    "the upstream answered with a JSON-RPC error that is not an object; it was withheld (result_guards entry {index})"
)
GUARD_OFF_LOOP_CHARS: Final = 256 * 1024
"""An answer whose strings hold more characters than this is guarded on a worker thread
(``CallPipeline.answered``): the scan costs some tens of nanoseconds a character, and the event loop
must go on answering other calls (and timing this one out) meanwhile."""
TASK_REFUSED: Final = (
    "invalid params: this tool's results are guarded (result_guards entry {index}), and a task's result "
    "would reach the agent past the guard; call it without 'task'"
)


@dataclass(frozen=True, slots=True)
class GuardReport:
    """What a guard did to one result: what the records, the log line and the metrics say."""

    entry: int
    secrets: tuple[tuple[str, int], ...] = ()
    """(kind, how many), by kind: redacted, or the reason for a refusal."""
    refused: str | None = None
    """``secret``, ``size``, ``task`` or ``malformed`` (an error that is not an object): the answer was withheld."""
    size: int | None = None
    """The result's bytes, when a size limit acted."""
    limit: int | None = None
    cut_bytes: int = 0
    """The bytes a truncation did not show."""

    def log_field(self) -> str:
        """``redacted:github_token*2,cut:12345``, ``refused:secret:jwt*1``, ``refused:size:70000>65536``."""
        kinds = ",".join(f"{kind}*{count}" for kind, count in self.secrets)
        if self.refused == "secret":
            return f"refused:secret:{kinds}"
        if self.refused == "size":
            return f"refused:size:{self.size}>{self.limit}"
        if self.refused in ("task", "malformed"):
            return f"refused:{self.refused}"
        parts = [f"redacted:{kinds}"] if kinds else []
        parts += [f"cut:{self.cut_bytes}"] if self.limit is not None else []
        return ",".join(parts)

    def trace_body(self) -> dict[str, Any]:
        """The ``result_guard`` member of the call's ``tool_decision`` trace entry."""
        body: dict[str, Any] = {"entry": self.entry}
        if self.secrets:
            body["secrets"] = dict(self.secrets)
        if self.refused is not None:
            body["refused"] = self.refused
        if self.limit is not None:
            body.update(size=self.size, limit=self.limit, cut_bytes=self.cut_bytes)
        return body

    def counts(self) -> list[tuple[str, str, int]]:
        """(action, kind, count) for ``drawbridge_result_guard_total``; the kind of a size limit is ``size``."""
        if self.refused == "secret":
            return [("refused", kind, count) for kind, count in self.secrets]
        out = [("redacted", kind, count) for kind, count in self.secrets]
        if self.refused in ("size", "task", "malformed"):
            out.append(("refused", str(self.refused), 1))
        elif self.limit is not None:
            out.append(("truncated", "size", 1))
        return out


def carries_more_than(value: Any, limit: int) -> bool:
    """Whether the strings (and keys) in a JSON value hold more than ``limit`` characters; stops counting
    once they do. Each item counts one besides, so that a million empty strings count too."""
    left = limit
    stack = [value]
    while stack:
        item = stack.pop()
        left -= 1
        if isinstance(item, str):
            left -= len(item)
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        if left < 0:
            return True
    return False


def _withheld(result: Mapping[str, Any], text: str) -> dict[str, Any]:
    """An ``isError`` result in the place of one withheld; an ``InputRequiredResult`` becomes a complete one."""
    kind = result.get("resultType")
    kept = {"resultType": "complete" if kind == INPUT_REQUIRED else kind} if "resultType" in result else {}
    return {**kept, "content": [{"type": "text", "text": text}], "isError": True}


class ResultGuards:
    """The configured entries, in order (module docstring)."""

    def __init__(self, rules: Sequence[ResultGuardRule]) -> None:
        self.rules = tuple(rules)
        self._detectors: dict[int, tuple[Detector, ...]] = {
            rule.index: (*rule.secret_patterns, *(BUILTIN if rule.redact_secrets else ())) for rule in self.rules
        }

    @classmethod
    def of(cls, rules: Sequence[ResultGuardRule] | None) -> ResultGuards | None:
        """The guards of a configured list; None without one (the pipeline then never calls them)."""
        return cls(rules) if rules else None

    def rule_for(self, agent: str, tool: str) -> ResultGuardRule | None:
        """The entry that guards this call, if one does."""
        for rule in self.rules:
            if rule.matches(agent, tool):
                return rule if rule.acts else None
        return None

    def task_refusal(self, call: ToolCall, params: Any) -> str | None:
        """Why a call that asks to run as a task is refused, when its tool is guarded."""
        if not isinstance(params, Mapping) or "task" not in params:
            return None
        rule = self.rule_for(call.agent, call.tool)
        return None if rule is None else TASK_REFUSED.format(index=rule.index)

    def answer(self, call: ToolCall, body: Mapping[str, Any]) -> tuple[dict[str, Any], GuardReport] | None:
        """The upstream's response with its result (or its error) guarded, or None when it passes as it came."""
        if "error" in body:
            if isinstance(body["error"], Mapping):
                return self._error(call, body)
            if (rule := self.rule_for(call.agent, call.tool)) is None:
                return None
            error = {"code": INTERNAL_ERROR, "message": MALFORMED_ERROR.format(index=rule.index)}
            return {**body, "error": error}, GuardReport(rule.index, refused="malformed")
        if not isinstance(body.get("result"), Mapping):
            return None  # not an answer the agent gets (an internal error names the problem instead)
        guarded = self.apply(call.agent, call.tool, body["result"])
        return None if guarded is None else ({**body, "result": guarded[0]}, guarded[1])

    def _error(self, call: ToolCall, body: Mapping[str, Any]) -> tuple[dict[str, Any], GuardReport] | None:
        """A JSON-RPC error's message and data, redacted like a result (or withheld under ``refuse``)."""
        rule = self.rule_for(call.agent, call.tool)
        if rule is None or not self._detectors[rule.index]:
            return None
        error, found = redacted(body["error"], self._detectors[rule.index])
        if not found:
            return None
        secrets = tuple(sorted(found.items()))
        if rule.on_secret == "refuse":
            kinds = ", ".join(kind for kind, _count in secrets)
            code = error.get("code")
            code = code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR
            error = {"code": code, "message": f"the upstream's error was withheld: it held a secret ({kinds}); "
                     f"result_guards entry {rule.index} refuses such results"}
            return {**body, "error": error}, GuardReport(rule.index, secrets, refused="secret")
        return {**body, "error": error}, GuardReport(rule.index, secrets)

    def apply(self, agent: str, tool: str, result: Mapping[str, Any]) -> tuple[dict[str, Any], GuardReport] | None:
        """The result as the agent gets it and what was done, or None when the guard left it as it came."""
        rule = self.rule_for(agent, tool)
        if rule is None:
            return None
        if created_task(result) is not None:
            text = (f"the upstream answered with a task, whose result would reach the agent past result_guards "
                    f"entry {rule.index}; it was withheld")
            return _withheld({}, text), GuardReport(rule.index, refused="task")
        out: dict[str, Any] = dict(result)
        secrets: tuple[tuple[str, int], ...] = ()
        detectors = self._detectors[rule.index]
        if detectors:
            state = result.get("requestState") if result.get("resultType") == INPUT_REQUIRED else None
            if state is not None:  # opaque, and sent back as it came: never altered, withheld if it holds one
                _, in_state = redacted({"requestState": state}, detectors)
                if in_state:
                    secrets = tuple(sorted(in_state.items()))
                    text = (f"the upstream's request for input was withheld: its requestState held a secret "
                            f"({', '.join(kind for kind, _count in secrets)}); result_guards entry {rule.index}")
                    return _withheld(result, text), GuardReport(rule.index, secrets, refused="secret")
            out, found = redacted({k: v for k, v in result.items() if k != "requestState" or state is None}, detectors)
            if state is not None:
                out["requestState"] = state
            secrets = tuple(sorted(found.items()))
            if secrets and rule.on_secret == "refuse":
                kinds = ", ".join(kind for kind, _count in secrets)
                text = (f"the result was withheld: it held a secret ({kinds}); "
                        f"result_guards entry {rule.index} refuses such results")
                return _withheld(result, text), GuardReport(rule.index, secrets, refused="secret")
        if rule.max_bytes is not None and (size := result_size(out)) > rule.max_bytes:
            if rule.on_oversize == "refuse" or result.get("resultType") == INPUT_REQUIRED:  # a cut one would not work
                text = (f"the result was withheld: it is {size} bytes, over the limit of {rule.max_bytes} bytes "
                        f"(result_guards entry {rule.index})")
                return _withheld(result, text), GuardReport(rule.index, secrets, "size", size, rule.max_bytes)
            out, more = cut(out, rule.max_bytes, size)
            return out, GuardReport(rule.index, secrets, None, size, rule.max_bytes, more)
        if not secrets:
            return None
        return out, GuardReport(rule.index, secrets)



Guarded = tuple[dict[str, Any], GuardReport, bytes]
"""What ``result_guards`` made of an answer: the body, the report, and the body's line (no newline)."""


def guarded_line(guards: ResultGuards, call: ToolCall, body: Mapping[str, Any]) -> Guarded | None:
    """The answer guarded and encoded (both costly for a large one, so both off the loop when it is)."""
    guarded = guards.answer(call, body)
    return None if guarded is None else (*guarded, encode_line(guarded[0])[:-1])


__all__ = [
    "GUARDED_OUTCOMES", "GUARD_OFF_LOOP_CHARS", "TASK_REFUSED", "Guarded", "GuardReport", "ResultGuards",
    "carries_more_than", "guarded_line",
]
