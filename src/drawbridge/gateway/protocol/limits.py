"""The default size limits on a JSON-RPC line, in a module of their own.

They are the defaults the command lines show (``--max-message-bytes``), read before the gateway
imports its parser: wrap starts the server as early as it can, and what the command line needs must
not pull the whole protocol stack in first. ``jsonrpc`` enforces them.
"""

from __future__ import annotations

from typing import Final

DEFAULT_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES: Final = 64 * 1024 * 1024

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES"]
