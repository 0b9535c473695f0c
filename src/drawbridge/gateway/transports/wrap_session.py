"""What wrap knows of the agent's session, and the requests its state refuses.

Invariant: wrap refuses (-32600, recorded) what ``serve --stdio`` refuses for the state of the
session (docs/errors.md): in a handshake-era session, every request before the agent's
``initialize`` but ``ping`` (a tools/call among them: the gateway would otherwise read the server's
catalogue, and forward the call, before the server was initialized), and a second ``initialize``
once one was sent and not refused. A refused request reaches neither the server nor the pipeline.
Unlike serve, wrap lets ``initialize`` follow a 2026-07-28 request: an agent probing the era
(``server/discover``, relayed to the server) falls back to the handshake when the server does not
speak 2026-07-28, which only the server can say. A tools/call whose envelope names a version the
gateway does not speak in it (anything but 2026-07-28, handshake versions included) is refused as
serve refuses it (-32022, ``envelope.version_refusal``, recorded): wrap decides, records and exports
that call itself, and an agent-chosen version string would otherwise be its ``protocol_version`` in
the trace and its ``mcp.protocol.version`` on the spans, whatever its length. Other requests are
relayed with their envelope: the server says which versions it speaks. The version the server
answers ``initialize`` with is kept to ``MAX_VERSION_CHARS``.

Theory of operation. The relay asks ``refusal`` for each request of the agent's before it is
forwarded or decided; the first ``initialize`` that passes starts the handshake (requests sent after
it, before its answer, go on in order: the server reads them after it). The server's answer to it
settles the session (``answered_initialize``): its protocol version, or, for an error, no handshake
yet, so the agent may try again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from drawbridge.gateway.protocol.eras import envelope_version, unsupported_version_data
from drawbridge.gateway.protocol.jsonrpc import INVALID_REQUEST
from drawbridge.gateway.protocol.methods import INITIALIZE, PING, TOOLS_CALL
from drawbridge.gateway.serve.envelope import EnvelopeRefusal, version_refusal

NOT_INITIALIZED: Final = (
    "invalid request: the session is not initialized (send initialize, or a 2026-07-28 request envelope)"
)
ALREADY_INITIALIZED: Final = "invalid request: the session is already initialized"
MAX_VERSION_CHARS: Final = 32
"""What is kept of the version the server answered ``initialize`` with (a date, ``YYYY-MM-DD``): the
answer is the server's to give, relayed as it came, but a server that echoes the agent's request would
otherwise make an agent's string of any length every call's recorded and exported version."""


@dataclass(slots=True)
class AgentSession:
    """The agent's session as wrap sees it (module docstring)."""

    version: str | None = None
    """The protocol version the server answered ``initialize`` with."""
    modern: bool = False
    """No handshake came first: the agent speaks 2026-07-28."""
    handshake: bool = False
    """The agent's ``initialize`` was forwarded, and not answered with an error."""
    initialized: bool = False
    """The agent sent ``notifications/initialized`` after ``initialize`` (a handshake-era agent may
    now be notified)."""
    capabilities: Any = None
    """What the agent's ``initialize`` declared (for in-band questions)."""

    def refusal(self, method: str, params: Any) -> EnvelopeRefusal | None:
        """Why this request is refused (the session's state: -32600; a tools/call's envelope version:
        -32022 with serve's ``data``), or None; a passing ``initialize`` starts the handshake."""
        meta = params.get("_meta") if isinstance(params, dict) else None
        if method == TOOLS_CALL and (refused := version_refusal(envelope_version(meta))) is not None:
            return EnvelopeRefusal(refused.code, refused.message, unsupported_version_data(refused.data))
        if self.version is None and not self.modern and envelope_version(meta) is not None:
            self.modern = True
        if method == INITIALIZE:
            if self.handshake:
                return EnvelopeRefusal(INVALID_REQUEST, ALREADY_INITIALIZED)
            self.handshake = True
            self.capabilities = params.get("capabilities") if isinstance(params, dict) else None
            return None
        if not (self.modern or self.handshake) and method != PING:
            return EnvelopeRefusal(INVALID_REQUEST, NOT_INITIALIZED)
        return None

    def initialized_by_agent(self) -> bool:
        """The agent sent ``notifications/initialized``: True when it follows a handshake (before one,
        the server is not initialized, and the gateway reads no catalogue from it)."""
        self.initialized = self.handshake
        return self.initialized

    def answered_initialize(self, body: dict[str, Any]) -> None:
        result = body.get("result")
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if isinstance(version, str):
            self.version = version[:MAX_VERSION_CHARS]
        elif "error" in body:
            self.handshake = False


__all__ = ["ALREADY_INITIALIZED", "MAX_VERSION_CHARS", "NOT_INITIALIZED", "AgentSession"]
