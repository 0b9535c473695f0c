"""Walking a paginated MCP list (``tools/list``, ``prompts/list``, ...): every page, in order.

Invariant: a listing is whole or it fails. Pages are followed by ``nextCursor`` until a page has none;
an answer that is not a result holding the list, a cursor given twice, or more than ``MAX_LIST_PAGES``
pages end the listing with ``ListingFailed`` (which names the method and the JSON-RPC error code,
never the upstream's text), so nobody acts on part of a catalogue. The requests are the caller's
(``ask``): this module only reads the answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

MAX_LIST_PAGES: Final = 100

Ask = Callable[[dict[str, Any] | None], Awaitable[Mapping[str, Any]]]
"""Send the list request with these params (None for the first page); its response body."""


class ListingFailed(Exception):
    """The listing did not come out whole (the message says why)."""


def error_summary(body: Mapping[str, Any]) -> str:
    """What a refused request's response says, for logs: the error code, never the upstream's text."""
    error = body.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        return f"JSON-RPC error {code}" if isinstance(code, int) else "a JSON-RPC error"
    return "no usable result"


async def list_all(ask: Ask, method: str, key: str) -> list[Any]:
    """Every item of the list ``key`` that ``method`` answers with, page after page."""
    items: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_LIST_PAGES):
        body = await ask({"cursor": cursor} if cursor is not None else None)
        result = body.get("result")
        if not isinstance(result, dict) or not isinstance(result.get(key), list):
            raise ListingFailed(f"{method} failed ({error_summary(body)})")
        items.extend(result[key])
        cursor = result.get("nextCursor")
        if not isinstance(cursor, str) or not cursor:
            return items
        if cursor in seen:
            raise ListingFailed(f"{method} returned a cursor it had returned before")
        seen.add(cursor)
    raise ListingFailed(f"{method} did not end within {MAX_LIST_PAGES} pages")


__all__ = ["MAX_LIST_PAGES", "Ask", "ListingFailed", "error_summary", "list_all"]
