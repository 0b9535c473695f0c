"""What the pipeline hands the recorder: one ``CallRecord`` per tools/call, one ``RelayIncident`` per
other problem, and the ``Recorder`` shape that takes them.

Invariant: a record is built from the values the pipeline's stages returned (the parsed call, the
verdict, the outcome, the timings); it never holds an argument value except inside ``call``, which a
recorder may digest but must not store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.result_guards import GuardReport
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Provenance
from drawbridge.gateway.protocol.jsonrpc import RequestId
from drawbridge.policy.model import Action


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
    """The tool was named in the upstream's catalogue (the truth carrier's ``identity_state`` is then
    ``present``, else ``absent``)."""
    approval: Mapping[str, Any] | None = None
    """The verdict's ``approval`` (how human approval settled the call), for the records."""
    forwarded: bool = False
    """The call was handed to the upstream (telemetry's CLIENT span; the records do not depend on it)."""
    session_id: str | None = None
    """The 2025-11-25 HTTP session (``Mcp-Session-Id``) the call came in, for telemetry's
    ``mcp.session.id``; None where no session id exists (stdio, 2026-07-28). Not written to a record."""
    result_guard: GuardReport | None = None
    """What ``result_guards`` did to the result (kinds and counts, bytes; never a secret): the trace
    entry's ``result_guard``, the decision line's ``guard``, the metrics; never in an Assay record."""


@dataclass(frozen=True, slots=True)
class RelayIncident:
    """Something the gateway handled that is not a tools/call: a bad line, an upstream that misbehaved."""

    kind: str
    """parse_error, invalid_message, oversize, duplicate_id, tools_call_notification, upstream_garbage,
    upstream_oversize, unknown_response, upstream_exited, upstream_unwritable, late_response,
    catalogue_refused, prompt_held_back; over HTTP also foreign_host, foreign_origin, repeated_authorization,
    session_limit"""
    direction: str  # "client" | "upstream"
    detail: str
    code: int | None = None
    agent: str | None = None
    """The agent whose message was refused, where the gateway knows it (serve's sessions): another
    agent's task id tried, a cursor never issued, are then traced to who tried them."""


RelayEvent = CallRecord | RelayIncident

RECORD_TIMEOUT_SECONDS: Final = 5.0
"""The longest a record may take before it counts as failed (the gateway then fails closed)."""


class Recorder(Protocol):
    """Records events. A recorder that never has to wait may also offer ``record_now(events)``, which
    writes several at once and returns None, or an awaitable for what is left (an fsync)."""

    async def __call__(self, event: RelayEvent, /) -> None: ...


class _NullRecorder:
    """Record nothing (tests that do not look at records); awaitable, and synchronous as ``record_now``."""

    __slots__ = ()

    async def __call__(self, event: RelayEvent, /) -> None:
        return None

    def record_now(self, events: Sequence[RelayEvent], /) -> Awaitable[None] | None:
        return None

    def __repr__(self) -> str:
        return "null_recorder"


null_recorder: Final = _NullRecorder()

__all__ = ["RECORD_TIMEOUT_SECONDS", "CallRecord", "Recorder", "RelayEvent", "RelayIncident", "null_recorder"]
