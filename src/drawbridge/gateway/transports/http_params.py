"""``Mcp-Param-*`` headers of a 2026-07-28 ``tools/call`` at ``/mcp``, checked against its body.

Invariant: a 2026-07-28 ``tools/call`` of a tool whose input schema declares ``x-mcp-header`` properties
reaches the pipeline only when each declared header and its argument agree (present together and equal
after the ``=?base64?...?=`` decoding, or absent together), and no declared header is repeated;
otherwise it is answered 400 with ``HEADER_MISMATCH`` (-32020), as the spec asks of any server that
reads the body. The SDK's codec and validator (``mcp.shared.inbound``, loaded by ``sdk_parts.inbound()``
with the first such call) decide; this module only finds the schema, so client and gateway read the
headers the same way.

Theory of operation. The tool's schema is the served catalogue's; whether it declares any header is
remembered per catalogue item, so a call of a tool without such properties costs a dict lookup.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from drawbridge.gateway.protocol.jsonrpc import Message
from drawbridge.gateway.protocol.methods import TOOLS_CALL
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.upstreams.sdk_parts import X_MCP_HEADER_KEY, inbound

if TYPE_CHECKING:
    from mcp.shared.inbound import InboundLadderRejection  # the type only: the module is loaded by ``inbound()``


class _Lines(Mapping[str, str]):
    """The request's header lines as sent, repeats kept: the validator folds them and sees a repeat."""

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        self._lines = lines

    def items(self) -> Any:
        return list(self._lines)

    def __getitem__(self, key: str) -> str:
        for name, value in reversed(self._lines):
            if name.lower() == key.lower():
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._lines)

    def __len__(self) -> int:
        return len(self._lines)


def _declares(schema: Any) -> bool:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return False
    stack: list[Any] = list(properties.values())
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if X_MCP_HEADER_KEY in node:
                return True
            stack.extend(v for v in node.values() if isinstance(v, (Mapping, list)))
        elif isinstance(node, list):
            stack.extend(node)
    return False


class ParamHeaders:
    """The check, with what it remembered of each catalogue item."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._declared: dict[str, tuple[Mapping[str, Any], bool]] = {}

    def rejection(self, message: Message, lines: list[tuple[str, str]]) -> InboundLadderRejection | None:
        if message.method != TOOLS_CALL:
            return None
        params = message.body.get("params")
        name = params.get("name") if isinstance(params, Mapping) else None
        arguments = params.get("arguments") if isinstance(params, Mapping) else None
        entry = self._gateway.tools.resolve(name) if isinstance(name, str) else None
        if entry is None or (arguments is not None and not isinstance(arguments, Mapping)):
            return None  # the pipeline refuses an unknown tool or malformed arguments itself
        known = self._declared.get(entry.name)
        if known is None or known[0] is not entry.item:
            known = (entry.item, _declares(entry.item.get("inputSchema")))
            self._declared[entry.name] = known
        if not known[1]:
            return None
        return inbound().validate_mcp_param_headers(entry.item.get("inputSchema"), arguments or {}, _Lines(lines))


__all__ = ["ParamHeaders"]
