"""What wrap knows of the agent's session, and the requests its state refuses.

Invariant: wrap refuses (-32600, recorded) what ``serve --stdio`` refuses for the state of the
session (docs/errors.md): in a handshake-era session, every request before the agent's
``initialize`` but ``ping`` (a tools/call among them: the gateway would otherwise read the server's
catalogue, and forward the call, before the server was initialized), and a second ``initialize``
once one was sent and not refused. A refused request reaches neither the server nor the pipeline.
Unlike serve, wrap lets ``initialize`` follow a 2026-07-28 request: an agent probing the era
(``server/discover``, relayed to the server) falls back to the handshake when the server does not
speak 2026-07-28, which only the server can say.

Theory of operation. The relay asks ``refusal`` for each request of the agent's before it is
forwarded or decided; the first ``initialize`` that passes starts the handshake (requests sent after
it, before its answer, go on in order: the server reads them after it). The server's answer to it
settles the session (``answered_initialize``): its protocol version, or, for an error, no handshake
yet, so the agent may try again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from drawbridge.gateway.protocol.eras import envelope_version
from drawbridge.gateway.protocol.methods import INITIALIZE, PING

NOT_INITIALIZED: Final = (
    "invalid request: the session is not initialized (send initialize, or a 2026-07-28 request envelope)"
)
ALREADY_INITIALIZED: Final = "invalid request: the session is already initialized"


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

    def refusal(self, method: str, params: Any) -> str | None:
        """Why the session's state refuses this request (-32600), or None; a passing ``initialize``
        starts the handshake."""
        meta = params.get("_meta") if isinstance(params, dict) else None
        if self.version is None and not self.modern and envelope_version(meta) is not None:
            self.modern = True
        if method == INITIALIZE:
            if self.handshake:
                return ALREADY_INITIALIZED
            self.handshake = True
            self.capabilities = params.get("capabilities") if isinstance(params, dict) else None
            return None
        if not (self.modern or self.handshake) and method != PING:
            return NOT_INITIALIZED
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
            self.version = version
        elif "error" in body:
            self.handshake = False


__all__ = ["ALREADY_INITIALIZED", "NOT_INITIALIZED", "AgentSession"]
