"""What a tools/call is answered with: the gateway's own result or error, or the upstream's answer.

One type per source, so that a transport writes each as it must (a gateway error is never mistaken for
an upstream's, and an upstream's line is relayed as it came when nothing was rewritten).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GatewayResult:
    """A ``CallToolResult`` the gateway answers with itself (a refusal, an approval still open)."""

    result: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class GatewayError:
    """A JSON-RPC error the gateway answers with (invalid, timed out, upstream gone, withheld)."""

    code: int
    message: str


@dataclass(frozen=True, slots=True)
class UpstreamAnswer:
    """The upstream's own response: its body, and the line it came in when the transport has it."""

    body: Mapping[str, Any]
    raw: bytes | None = None


Answer = GatewayResult | GatewayError | UpstreamAnswer


__all__ = ["Answer", "GatewayError", "GatewayResult", "UpstreamAnswer"]
