"""The MCP method names the gateway acts on: one constant per name, used by every transport.

Invariant: only a message whose method is exactly ``TOOLS_CALL`` is a tools/call; a method that an
upstream with sloppy dispatch might still run as one (``looks_like_tools_call``: other case, edge
whitespace) is refused, never forwarded.
"""

from __future__ import annotations

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


def looks_like_tools_call(method: str) -> bool:
    """A method an upstream with sloppy dispatch might run as tools/call, without being exactly that."""
    return method != TOOLS_CALL and method.strip().lower() == TOOLS_CALL
