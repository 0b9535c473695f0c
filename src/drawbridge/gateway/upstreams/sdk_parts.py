"""The two modules of the ``mcp`` SDK the gateway runs with, loaded without the SDK's package.

Invariant: the code is the SDK's own, unchanged: ``mcp/shared/inbound.py`` (the 2026-07-28 inbound
ladder, the routing headers and their value codec) and ``mcp/shared/uri_template.py`` (RFC 6570
templates). What is skipped is ``mcp/__init__``, which imports the SDK's client and server and,
through them, OpenTelemetry and more: several MiB a gateway holds for nothing. In a process that has
imported the SDK package already (one that is also an SDK client), the SDK's own modules are used.

``inbound()`` loads its module on first use: it reads the SDK's types (pydantic models, some 25 MiB),
which only the 2026-07-28 era and HTTP upstreams need; a gateway whose agents speak the handshake era
over stdio upstreams never loads them. The names read before the ladder is needed are kept here
(``MCP_PROTOCOL_VERSION_HEADER``, read by every HTTP request, and ``X_MCP_HEADER_KEY``, read when a
served tool's schema is first looked at): the SDK's own values, as a test checks.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Final

MCP_PROTOCOL_VERSION_HEADER: Final = "mcp-protocol-version"
X_MCP_HEADER_KEY: Final = "x-mcp-header"


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


@functools.cache
def inbound() -> ModuleType:
    """``mcp/shared/inbound.py``: ``classify_inbound_request``, ``InboundLadderRejection``,
    ``ERROR_CODE_HTTP_STATUS``, ``HEADER_MISMATCH``, ``find_duplicated_routing_header``,
    ``unsupported_protocol_version_rejection``, ``NAME_BEARING_METHODS``, ``encode_header_value``,
    and the ``Mcp-Param-*`` codec (``find_invalid_x_mcp_header``, ``x_mcp_header_map``,
    ``mcp_param_headers``, ``validate_mcp_param_headers``)."""
    return _load("shared.inbound")


_uri_template = _load("shared.uri_template")
InvalidUriTemplate = _uri_template.InvalidUriTemplate
UriTemplate = _uri_template.UriTemplate

__all__ = ["MCP_PROTOCOL_VERSION_HEADER", "X_MCP_HEADER_KEY", "InvalidUriTemplate", "UriTemplate", "inbound"]
