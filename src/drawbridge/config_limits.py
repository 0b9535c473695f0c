"""The ``limits`` section of serve's configuration: message sizes, call time, sessions, and how the
listeners read their peers.

Invariant: limits that load are in range: a message limit of at least 1 KiB, a nesting depth from 2
to 512, a positive and finite call timeout (``.nan`` and ``.inf`` are refused: every float here
is compared so that nan fails), at least one session per agent and no fewer sessions in all, read
deadlines more than 0 and at most an hour (a peer that does not send never holds a connection
forever), and at least one connection per listener. Every key has a default, so a file without the
section gets these same limits.
"""

from __future__ import annotations

import math
from typing import Final

from drawbridge.config_reader import Reader

MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
CALL_TIMEOUT_SECONDS: Final = 120.0
MAX_DEPTH: Final = 64
MAX_SESSIONS_PER_AGENT: Final = 64
MAX_SESSIONS: Final = 1024
HEADER_READ_SECONDS: Final = 10.0
BODY_READ_SECONDS: Final = 30.0
MAX_CONNECTIONS: Final = 1024
MAX_READ_SECONDS: Final = 3600.0


def limits_section(top: Reader) -> dict[str, float]:
    """``limits``, checked (module docstring), by the names ``GatewayConfig`` gives them (its defaults
    are these same ones); empty when absent."""
    limits = top.child("limits")
    if limits is None:
        return {}
    limits.check_keys({
        "max_message_bytes", "call_timeout_seconds", "max_depth", "max_sessions_per_agent", "max_sessions",
        "header_read_seconds", "body_read_seconds", "max_connections",
    })
    reads: dict[str, float] = {}
    for key, default in (("header_read_seconds", HEADER_READ_SECONDS), ("body_read_seconds", BODY_READ_SECONDS)):
        reads[key] = limits.get(key, float, default=default)
        if not 0 < reads[key] <= MAX_READ_SECONDS:
            raise limits.fail(key, f"limits.{key} must be more than 0 and at most {MAX_READ_SECONDS:g}")
    max_connections = limits.get("max_connections", int, default=MAX_CONNECTIONS)
    if max_connections < 1:
        raise limits.fail("max_connections", "limits.max_connections must be at least 1")
    max_bytes = limits.get("max_message_bytes", int, default=MAX_MESSAGE_BYTES)
    timeout = limits.get("call_timeout_seconds", float, default=CALL_TIMEOUT_SECONDS)
    max_depth = limits.get("max_depth", int, default=MAX_DEPTH)
    per_agent = limits.get("max_sessions_per_agent", int, default=MAX_SESSIONS_PER_AGENT)
    max_sessions = limits.get("max_sessions", int, default=MAX_SESSIONS)
    if per_agent < 1:
        raise limits.fail("max_sessions_per_agent", "limits.max_sessions_per_agent must be at least 1")
    if max_sessions < per_agent:
        raise limits.fail(
            "max_sessions",
            f"limits.max_sessions must be at least limits.max_sessions_per_agent ({per_agent})",
        )
    if max_bytes < 1024:
        raise limits.fail("max_message_bytes", "limits.max_message_bytes must be at least 1024")
    if not 2 <= max_depth <= 512:
        raise limits.fail("max_depth", "limits.max_depth must be from 2 to 512")
    if not (math.isfinite(timeout) and timeout > 0):  # nan passes `<= 0`; inf would never time out
        raise limits.fail("call_timeout_seconds", "limits.call_timeout_seconds must be a positive, finite number")
    return {
        "max_message_bytes": max_bytes, "call_timeout_seconds": timeout, "max_depth": max_depth,
        "max_sessions_per_agent": per_agent, "max_sessions": max_sessions, "max_connections": max_connections, **reads,
    }


__all__ = [
    "BODY_READ_SECONDS", "CALL_TIMEOUT_SECONDS", "HEADER_READ_SECONDS", "MAX_CONNECTIONS", "MAX_DEPTH",
    "MAX_MESSAGE_BYTES", "MAX_SESSIONS", "MAX_SESSIONS_PER_AGENT", "limits_section",
]
