"""The MCP method names the gateway acts on: one constant per name, used by every transport.

Invariant: only a message whose method is exactly ``TOOLS_CALL`` is a tools/call; a method that an
upstream with sloppy dispatch, or another reader, might still run as one (``looks_like_tools_call``)
is refused -32601 by both commands, never forwarded. That covers other case, edge whitespace, a name
a C-string reader cuts at NUL, format characters (a zero-width space), compatibility forms (fullwidth
letters); and since which method such a name is depends on its reader, every method holding a
control, format or space character, or not in NFKC form, is refused the same way: no MCP method
holds one.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Final

INITIALIZE: Final = "initialize"
INITIALIZED: Final = "notifications/initialized"
PING: Final = "ping"
DISCOVER: Final = "server/discover"
TOOLS_LIST: Final = "tools/list"
TOOLS_CALL: Final = "tools/call"
PROMPTS_LIST: Final = "prompts/list"
PROMPTS_GET: Final = "prompts/get"
RESOURCES_LIST: Final = "resources/list"
RESOURCE_TEMPLATES_LIST: Final = "resources/templates/list"
RESOURCES_READ: Final = "resources/read"
RESOURCES_SUBSCRIBE: Final = "resources/subscribe"
RESOURCES_UNSUBSCRIBE: Final = "resources/unsubscribe"
COMPLETE: Final = "completion/complete"
SET_LEVEL: Final = "logging/setLevel"
LISTEN: Final = "subscriptions/listen"
ELICIT: Final = "elicitation/create"
ROOTS_LIST: Final = "roots/list"

REMOVED_BY_MODERN: Final[Mapping[str, str]] = {
    PING: "",
    SET_LEVEL: "a request asks for its log lines with io.modelcontextprotocol/logLevel in its _meta",
    RESOURCES_SUBSCRIBE: "a subscriptions/listen stream names the resources it wants updates of",
    RESOURCES_UNSUBSCRIBE: "closing the subscriptions/listen stream ends its resources' updates",
}
"""The requests 2026-07-28 removed (its changelog: lifecycle, logging, the subscribe pair), each with
what takes its place, if anything does: serve refuses a 2026-07-28 request for one with -32601
(``removed_by_modern``) and records the refusal (it is refused for its era, not for want of an
upstream); wrap passes it to the server, which answers it
as its era says."""

CANCELLED: Final = "notifications/cancelled"
PROGRESS: Final = "notifications/progress"
LOG_MESSAGE: Final = "notifications/message"
TOOLS_LIST_CHANGED: Final = "notifications/tools/list_changed"
PROMPTS_LIST_CHANGED: Final = "notifications/prompts/list_changed"
RESOURCES_LIST_CHANGED: Final = "notifications/resources/list_changed"
RESOURCE_UPDATED: Final = "notifications/resources/updated"
LISTEN_ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"


NOT_EXACTLY_TOOLS_CALL: Final = (
    "method not found: the method is not exactly 'tools/call' and some reader could take it for it "
    "(other case, a control, format or space character, a compatibility form); refused"
)
"""The refusal of a method ``looks_like_tools_call`` finds (it never quotes the method)."""
_UNREADABLE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
"""What no method holds: controls (NUL), format characters, unassigned and private code points, spaces."""


def removed_by_modern(method: str) -> str:
    """The -32601 message for a method 2026-07-28 removed (``REMOVED_BY_MODERN``)."""
    instead = REMOVED_BY_MODERN[method]
    said = f"method not found: {method} is not part of 2026-07-28, which removed it"
    return f"{said} ({instead})" if instead else said


def looks_like_tools_call(method: str) -> bool:
    """A method refused because a reader could take it for tools/call without it being exactly that
    (module docstring). Nearly every method is printable ASCII without a space: one comparison."""
    if method == TOOLS_CALL:
        return False
    if method.isascii():
        return not method.isprintable() or " " in method or method.lower() == TOOLS_CALL
    if any(unicodedata.category(char) in _UNREADABLE_CATEGORIES for char in method):
        return True
    normal = unicodedata.normalize("NFKC", method)
    return normal != method or normal.casefold() == TOOLS_CALL
