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
