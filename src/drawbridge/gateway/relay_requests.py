"""What the stdio relay keeps about each request in flight, and how it reads the upstream's answer.

Invariant: a ``Pending`` request is finished once (``finish`` ignores a second outcome), and a
finished request wakes whoever waits for it (its call task's ``done`` event, its wait scope).
The relay that uses these (``stdio_relay.py``) says who finishes a request and when.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Final

import anyio

from drawbridge.gateway.client_link import ClientLink
from drawbridge.gateway.jsonrpc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
    UPSTREAM_EXITED,
    Message,
    error_line,
)
from drawbridge.gateway.pipeline import Outcome, ToolCall, Verdict

TOOLS_CALL: Final = "tools/call"


@dataclass(eq=False, slots=True)
class OwnRequest:
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class RelayConfig:
    agent: str = "anonymous"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest line accepted from the agent."""
    max_upstream_message_bytes: int = DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES
    """Largest line accepted from the upstream (results may carry images)."""
    call_timeout: float = 120.0
    """Seconds a forwarded tools/call may wait for the upstream's answer. Other requests (which may be
    long-lived, like a 2026-07-28 subscriptions/listen) are not timed out by the gateway."""
    shutdown_grace: float = 2.0
    """Seconds the upstream gets to exit after the agent closes the connection."""
    refuse_after_record_failure: bool = True
    """Once the recorder has failed, refuse every later tools/call (evidence is part of the contract)."""


@dataclass(eq=False, slots=True)
class Pending:
    message: Message
    method: str
    started: float
    call: ToolCall | None = None
    forwarded: bool = False
    wait_scope: anyio.CancelScope | None = None
    """Covers what the call task awaits for this request (the decision, the upstream's answer);
    cancelled when someone else settles the request, so the task goes straight to recording."""
    done: anyio.Event | None = None
    """Set when the request is settled; only a call task waits for it, so only its calls have one."""
    finished: bool = False
    outcome: Outcome | None = None
    error: str | None = None
    error_code: int | None = None
    finished_at: float | None = None
    response: bytes | None = None
    """A tools/call's answer, held until the call has been recorded (evidence first)."""
    inline: bool = False
    """A tools/call without a call task: whoever settles it records it and answers (``_complete``)."""
    completed: bool = False
    verdict: Verdict | None = None
    decided_at: float | None = None
    deadline: float | None = None
    """``time.monotonic()`` when an inline call times out (a relative wait is derived from it, so
    the event loop's clock, which anyio reads at a higher cost, is not needed)."""
    link: ClientLink | None = None
    """The gateway's retry fields this call carried (taken out of what is forwarded), if any."""

    def end_unsent(self, detail: str) -> None:
        """Settle a request the upstream never received: the agent is told it was not sent."""
        self.forwarded = False
        self.response = error_line(self.message.id, UPSTREAM_EXITED, detail)
        self.finish(Outcome.UPSTREAM_EXITED, detail, UPSTREAM_EXITED)

    def finish(self, outcome: Outcome, error: str | None = None, code: int | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        self.outcome, self.error, self.error_code = outcome, error, code
        self.finished_at = time.perf_counter()
        if self.done is not None:
            self.done.set()
        if self.wait_scope is not None:
            self.wait_scope.cancel()


def looks_like_tools_call(method: str) -> bool:
    """A method an upstream with sloppy dispatch might run as tools/call, without being exactly that."""
    return method != TOOLS_CALL and method.strip().lower() == TOOLS_CALL


def outcome_of_response(body: dict[str, Any]) -> tuple[Outcome, str | None, int | None]:
    """Classify the upstream's answer to a tools/call (reads two keys; the result is not validated)."""
    if "error" in body:
        error = body["error"]
        code = error.get("code") if isinstance(error, dict) else None
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        return Outcome.UPSTREAM_ERROR, f"the upstream answered with JSON-RPC error {code}", code
    result = body.get("result")
    if isinstance(result, dict):
        if result.get("isError") is True:
            return Outcome.TOOL_ERROR, None, None
        if result.get("resultType") == "input_required":
            return Outcome.INPUT_REQUIRED, None, None
    return Outcome.OK, None, None


__all__ = ["TOOLS_CALL", "OwnRequest", "Pending", "RelayConfig", "looks_like_tools_call", "outcome_of_response"]
