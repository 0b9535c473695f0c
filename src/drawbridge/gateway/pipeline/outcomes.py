"""How a tools/call ended, as the gateway saw it: one ``Outcome``, derived from the answer in one place.

Invariant: ``outcome_of_response`` is the only reading of an upstream's answer to a tools/call. An
answer is ``ok`` only when its result is a JSON object without ``isError: true``; a JSON-RPC error,
and a result that is not an object (no ``CallToolResult`` can be read from it), are upstream errors.
A result whose ``resultType`` is neither absent, ``complete`` nor ``input_required`` (a task the
gateway never asked for, a value no era defines) is an upstream error too: nothing can be read from it.
A ``CreateTaskResult`` (only ever answered to a call forwarded with its task augmentation) is
``task_created``: the call was allowed and started, and how the task ends is recorded when the
gateway learns it (a ``task_ended`` trace entry, ``serve/task_book.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from drawbridge.gateway.protocol.tasks import created_task


class Outcome(StrEnum):
    OK = "ok"  # the upstream returned a result without isError
    TOOL_ERROR = "tool_error"  # the upstream returned a result with isError: true
    INPUT_REQUIRED = "input_required"  # the upstream returned an InputRequiredResult (2026-07-28)
    TASK_CREATED = "task_created"  # the upstream created a task that runs the call (2025-11-25 tasks)
    UPSTREAM_ERROR = "upstream_error"  # a JSON-RPC error, or a result that is not an object
    REFUSED = "refused"  # the decision was deny
    APPROVAL_UNAVAILABLE = "approval_unavailable"  # human_approval, and no way to obtain it
    APPROVAL_PENDING = "approval_pending"  # human_approval asked; the gateway answered for now (retry later)
    INVALID = "invalid"  # the request could not be read unambiguously; no decision was taken
    TIMEOUT = "timeout"  # the upstream did not answer within the call timeout
    UPSTREAM_EXITED = "upstream_exited"  # the upstream was gone before it answered
    CANCELLED = "cancelled"  # the agent cancelled the request


NOT_AN_OBJECT = "the upstream answered with a result that is not a JSON object"
UNKNOWN_RESULT_TYPE = "the upstream answered with a result of a resultType the gateway does not know"
KNOWN_RESULT_TYPES = (None, "complete", "input_required")


def outcome_of_response(body: Mapping[str, Any]) -> tuple[Outcome, str | None, int | None]:
    """Classify the upstream's answer to a tools/call: (outcome, error text, error code). Reads two keys."""
    if "error" in body:
        error = body["error"]
        code = error.get("code") if isinstance(error, dict) else None
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        return Outcome.UPSTREAM_ERROR, f"the upstream answered with JSON-RPC error {code}", code
    result = body.get("result")
    if not isinstance(result, dict):
        return Outcome.UPSTREAM_ERROR, NOT_AN_OBJECT, None
    if result.get("resultType") not in KNOWN_RESULT_TYPES:
        return Outcome.UPSTREAM_ERROR, UNKNOWN_RESULT_TYPE, None
    if result.get("isError") is True:
        return Outcome.TOOL_ERROR, None, None
    if result.get("resultType") == "input_required":
        return Outcome.INPUT_REQUIRED, None, None
    if created_task(result) is not None:
        return Outcome.TASK_CREATED, None, None
    return Outcome.OK, None, None


__all__ = ["NOT_AN_OBJECT", "UNKNOWN_RESULT_TYPE", "Outcome", "outcome_of_response"]
