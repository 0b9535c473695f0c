"""The wrapped server's tool catalogue, as wrap resolves calls in it: listed by the gateway itself.

Invariant: wrap forwards a tools/call only for a tool the server listed in the catalogue the gateway
read from it (every page, on its own request ids), exactly as serve routes only what its merged
catalogue holds; a name the server does not list is refused as unknown. With ``--pin-tools`` that
same catalogue is what the pins check (``pipeline.pins``), so wrap's floors are serve's, and the
agent reads only what a person accepted, as under serve: each page of the server's answer to the
agent's own ``tools/list`` that holds a tool not pinned as it is now is rewritten
(``CataloguePins.shown``: a ``changed`` tool as its pinned definition, a ``new`` one left out, no tool
while the pins cannot be read); a page of accepted definitions only passes as the server wrote it.
Before the first check nothing can be shown, so an agent's ``tools/list`` waits for it
(``listing_waits``, ``checked``) before it is sent to the server. What the agent would be shown of
the last listing is kept (``view``); a change of the pins that changes it (``reshown``: an accept, a
pin store back from an outage) is what the relay tells a handshake-era agent of, as serve does.

Theory of operation. The catalogue is read once the agent's session is initialized (2025-11-25), or,
when no handshake comes first (2026-07-28), by the first call, which waits for the listing (one
listing for every call that waits); the gateway lists in the era the agent speaks (2026-07-28
requests carry the gateway's envelope). ``notifications/tools/list_changed`` from the server starts a new
listing in the background; until it is read, calls resolve in the previous one (and their floors
wait for the pin check of the new one, as under serve). A listing that fails leaves the previous
catalogue in force; with none, calls are refused, saying why.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio

from drawbridge.catalogue.names import tool_name_problem
from drawbridge.gateway.pipeline.call import WAIT, CatalogueUnavailable, Forwarder, Resolved
from drawbridge.gateway.pipeline.floors import route_of
from drawbridge.gateway.pipeline.pins import CataloguePins
from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR, Message, encode_line, error_line
from drawbridge.gateway.protocol.methods import TOOLS_LIST, TOOLS_LIST_CHANGED
from drawbridge.gateway.protocol.modern import envelope, with_envelope
from drawbridge.gateway.protocol.paging import ListingFailed, list_all

logger = logging.getLogger("drawbridge.gateway")

LIST_TIMEOUT_SECONDS: Final = 30.0
GATEWAY_CAPABILITIES: Final[Mapping[str, Any]] = {}
"""What the gateway declares about itself on its own listing requests (it asks nothing of the agent)."""

NOT_FILTERED: Final = "the tool list could not be filtered for the agent"
"""The error that answers a ``tools/list`` whose tools cannot be read or written (serve says the same)."""

Ask = Callable[[str, dict[str, Any] | None], Awaitable[dict[str, Any]]]
"""Send the server a request of the gateway's own; its response body."""
CatalogueHook = Callable[[], Awaitable[object]]


class ChildCatalogue:
    """The Resolver of wrap (module docstring); also a ``pins.CatalogueSource``. The class attributes
    name what it lists, so that ``wrap_prompts.ChildPrompts`` lists the server's prompts the same way."""

    LIST_METHOD: str = TOOLS_LIST
    LIST_KEY: str = "tools"
    CHANGED_BY: str = TOOLS_LIST_CHANGED

    def __init__(
        self,
        name: str,
        forwarder: Forwarder,
        ask: Ask,
        *,
        modern: Callable[[], bool],
        on_catalogue: CatalogueHook | None = None,
        timeout: float = LIST_TIMEOUT_SECONDS,
    ) -> None:
        self.name = name
        self._forwarder = forwarder
        self._ask = ask
        self._modern = modern
        self.on_catalogue = on_catalogue
        self._timeout = timeout
        self.tools: tuple[Any, ...] = ()
        self.catalogue_version = 0
        self.generation = 1
        self._routes: dict[str, Resolved] | None = None
        self._loading: anyio.Event | None = None
        self._problem: str | None = None
        self._again = False
        self._pins: CataloguePins | None = None
        self._view: list[Any] | None = None
        """The last listing as the agent would be shown it (``--pin-tools``), as of its last check."""

    def pin(self, pins: CataloguePins) -> None:
        """``--pin-tools`` (the pins guard this catalogue already): every listing is checked before
        calls resolve in it, and the agent's ``tools/list`` answers are shown through the pins."""
        self._pins = pins
        self.on_catalogue = functools.partial(pins.check, self.name)

    # -- Resolver

    def resolve_now(self, tool: str) -> Resolved | None | object:
        routes = self._routes
        if routes is None:
            return WAIT
        return routes.get(tool)

    async def resolve(self, tool: str) -> Resolved | None:
        if self._routes is None:
            await self.load()
        if self._routes is None:
            raise CatalogueUnavailable(
                f"the gateway could not read the server's tool list ({self._problem}); the call was not sent"
            )
        return self._routes.get(tool)

    def names(self) -> list[str]:
        return list(self._routes or ())

    # -- listing

    def prefetch(self, tasks: Any) -> None:
        """The session is initialized: list the catalogue now, so the first call need not wait for it."""
        if self._routes is None and self._loading is None:
            tasks.start_soon(self.load)

    def changed(self, tasks: Any, method: str | None = None) -> None:
        """The server said its tool list changed (``method``, when given, is this list's
        notification): list it again, in the background."""
        if method not in (None, self.CHANGED_BY):
            return
        if self._routes is None and self._loading is None:
            return  # never listed: the next call lists it
        if self._loading is not None:
            self._again = True  # the listing in progress may predate the change: list once more
            return
        tasks.start_soon(self.load)

    async def load(self) -> None:
        """List the catalogue; a caller that comes while a listing runs waits for that one."""
        if self._loading is not None:
            await self._loading.wait()
            return
        self._loading = anyio.Event()
        try:
            while True:
                self._again = False
                try:
                    tools = await self._list()
                except (ListingFailed, TimeoutError, OSError) as exc:
                    self._problem = str(exc) or type(exc).__name__
                    logger.warning("listing the server's %s failed (%s)", self.LIST_KEY, self._problem)
                else:
                    self._store(tools)
                    if self.on_catalogue is not None:
                        await self.on_catalogue()
                    self._view = self.view()
                if not self._again:
                    break
        finally:
            loading, self._loading = self._loading, None
            loading.set()

    def _store(self, tools: list[Any]) -> None:
        routes: dict[str, Resolved] = {}
        for item in tools:
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str) and tool_name_problem(name) is None:
                routes[name] = Resolved(route_of(self.name, name, item), self._forwarder)
        self.tools = tuple(tools)
        self.catalogue_version += 1
        self._routes = routes
        self._problem = None

    # -- the agent's own tools/list, under --pin-tools

    def listing_waits(self, method: str | None = None) -> bool:
        """Whether an agent's ``tools/list`` must wait for ``checked`` before it is sent: no check of
        this server was published yet, and without one no tool can be shown."""
        return self._pins is not None and self._pins.state(self.name) is None

    def refusal(self, message: Message) -> str | None:
        """Why a request that waited for ``checked`` is refused rather than sent (a listing never is)."""
        return None

    async def checked(self) -> None:
        """List the catalogue and check it against the pins, unless a check was published (a listing
        in progress is waited for; one that fails leaves nothing checked, so nothing is shown)."""
        if self._pins is not None and self._pins.state(self.name) is None:
            await self.load()

    def view(self) -> list[Any] | None:
        """The last listing as the pins show it now (None when not pinned or never listed)."""
        if self._pins is None or self._routes is None:
            return None
        shown = self._pins.shown(self.name, self.tools)
        return list(self.tools) if shown is None else shown

    def reshown(self) -> bool:
        """The pins of this server changed (and were checked): whether what the agent's ``tools/list``
        would show differs from what it showed before, so that the agent should be told to list again."""
        view = self.view()
        changed = view is not None and view != self._view
        self._view = view
        return changed

    def shown(self, message: Message, line: bytes) -> bytes:
        """The line that answers the agent's ``tools/list``: ``line`` (the server's own) unless it holds
        a tool not pinned as it is now; then the same answer with only what a person accepted, or an
        error when its tools cannot be read or the rewritten answer cannot be written."""
        result = message.body.get("result")
        if self._pins is None or not isinstance(result, dict):
            return line  # not pinned, or an error: nothing to show
        tools = result.get(self.LIST_KEY)
        if not isinstance(tools, list):
            return error_line(message.id, INTERNAL_ERROR, NOT_FILTERED)
        shown = self._pins.shown(self.name, tools)
        if shown is None:
            return line
        try:
            return encode_line({**message.body, "result": {**result, self.LIST_KEY: shown}})
        except ValueError:  # a number JSON cannot write (NaN) in what the server sent
            return error_line(message.id, INTERNAL_ERROR, NOT_FILTERED)

    async def _list(self) -> list[Any]:
        hop = envelope(GATEWAY_CAPABILITIES) if self._modern() else None

        async def ask(params: dict[str, Any] | None) -> dict[str, Any]:
            if hop is not None:
                params = with_envelope(params, hop)
            with anyio.fail_after(self._timeout):
                return await self._ask(self.LIST_METHOD, params)

        return await list_all(ask, self.LIST_METHOD, self.LIST_KEY)


__all__ = ["ChildCatalogue"]
