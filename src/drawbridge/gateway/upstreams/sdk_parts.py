"""The two modules of the ``mcp`` SDK the gateway runs with, loaded without the SDK's package.

Invariant: the code is the SDK's own, unchanged: ``mcp/shared/inbound.py`` (the 2026-07-28 inbound
ladder, the routing headers and their value codec) and ``mcp/shared/uri_template.py`` (RFC 6570
templates). What is skipped is ``mcp/__init__``, which imports the SDK's client and server and,
through them, OpenTelemetry and more: several MiB a gateway holds for nothing. In a process that has
imported the SDK package already (one that is also an SDK client), the SDK's own modules are used.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType


def _load(relative: str) -> ModuleType:
    """``mcp.<relative>``, executed from the SDK's file under a private name (or the SDK's own module)."""
    name = f"mcp.{relative}"
    if name in sys.modules or "mcp" in sys.modules:
        return importlib.import_module(name)
    package = importlib.util.find_spec("mcp")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ImportError("the mcp SDK is not installed")
    path = os.path.join(package.submodule_search_locations[0], *relative.split(".")) + ".py"
    private = f"drawbridge.gateway.upstreams._sdk.{relative}"
    spec = importlib.util.spec_from_file_location(private, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[private] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[private]
        raise
    return module


_inbound = _load("shared.inbound")
_uri_template = _load("shared.uri_template")

ERROR_CODE_HTTP_STATUS = _inbound.ERROR_CODE_HTTP_STATUS
HEADER_MISMATCH = _inbound.HEADER_MISMATCH
MCP_PROTOCOL_VERSION_HEADER = _inbound.MCP_PROTOCOL_VERSION_HEADER
NAME_BEARING_METHODS = _inbound.NAME_BEARING_METHODS
InboundLadderRejection = _inbound.InboundLadderRejection
classify_inbound_request = _inbound.classify_inbound_request
encode_header_value = _inbound.encode_header_value
find_duplicated_routing_header = _inbound.find_duplicated_routing_header
unsupported_protocol_version_rejection = _inbound.unsupported_protocol_version_rejection
X_MCP_HEADER_KEY = _inbound.X_MCP_HEADER_KEY
find_invalid_x_mcp_header = _inbound.find_invalid_x_mcp_header
mcp_param_headers = _inbound.mcp_param_headers
x_mcp_header_map = _inbound.x_mcp_header_map
validate_mcp_param_headers = _inbound.validate_mcp_param_headers
InvalidUriTemplate = _uri_template.InvalidUriTemplate
UriTemplate = _uri_template.UriTemplate

__all__ = [
    "ERROR_CODE_HTTP_STATUS",
    "HEADER_MISMATCH",
    "MCP_PROTOCOL_VERSION_HEADER",
    "NAME_BEARING_METHODS",
    "X_MCP_HEADER_KEY",
    "InboundLadderRejection",
    "InvalidUriTemplate",
    "UriTemplate",
    "classify_inbound_request",
    "encode_header_value",
    "find_duplicated_routing_header",
    "find_invalid_x_mcp_header",
    "mcp_param_headers",
    "unsupported_protocol_version_rejection",
    "validate_mcp_param_headers",
    "x_mcp_header_map",
]
