"""``pin_prompts`` under serve: each MCP upstream's prompts checked against their accepted pins.

Invariant: an agent never reads, nor gets, a prompt definition nobody accepted. ``prompts/list``
shows a ``changed`` prompt as its pinned definition and leaves a ``new`` one out
(``CataloguePins.shown``, by fingerprint); ``prompts/get`` of a prompt that is not ``pinned`` (new,
changed, not listed, or any prompt of a server whose prompt catalogue is unchecked or whose pins
cannot be read) is refused with invalid params, naming ``drawbridge pins accept``, and recorded as a
``prompt_held_back`` relay incident. Prompts have no policy decision, so there is no floor to lower:
whatever is not as accepted fails closed.

Theory of operation. ``PinnedPromptsGateway`` is the hub (``hub.Gateway``) with two more upstream
events: an upstream that becomes ready (connect, reconnect) and its
``notifications/prompts/list_changed``. Each marks that upstream's prompts unchecked at once
(``PromptSource.stale``: the published check no longer covers what the upstream lists) and reloads
them in the background: every page of ``prompts/list``, then ``CataloguePins.check`` on the prompt
pins (``kind=PROMPTS``: trust on first use, ``mesh.pin_first_use``, ``mesh.pin_held_back``, the
observation ``POST /tools/pins/accept`` pins from, each record marked ``"kind": "prompt"``). A
listing that fails leaves the prompts unchecked (held back) until the next event. ``prompts/list``
and ``prompts/get`` wait (bounded) for a check in progress, so an agent that asks right after a
change reads the checked catalogue.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio

from drawbridge.canonical import sanitize
from drawbridge.catalogue.fingerprint import PinStatus
from drawbridge.catalogue.names import namespaced
from drawbridge.gateway.pipeline.pins import CataloguePins
from drawbridge.gateway.protocol.methods import PROMPTS_LIST, PROMPTS_LIST_CHANGED
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.upstreams.session import State, UpstreamSession

logger = logging.getLogger("drawbridge.gateway.pins")

HELD_BACK_INCIDENT = "prompt_held_back"


class PromptSource:
    """One upstream's prompts as the prompt pins read them (``CatalogueSource``: its ``tools`` are
    the prompts it listed last; ``catalogue_version`` moves on every load and every ``stale``)."""

    def __init__(self, upstream: UpstreamSession) -> None:
        self.upstream = upstream
        self.name = upstream.name
        self.tools: tuple[Any, ...] = ()
        self.catalogue_version = 0
        self.lock = anyio.Lock()

    @property
    def generation(self) -> int:
        return self.upstream.generation

    def stale(self) -> None:
        """What the upstream lists may have changed: the last check covers it no more."""
        self.catalogue_version += 1


class PinnedPromptsGateway(Gateway):
    """The hub, reloading and checking an upstream's prompts on connect, reconnect and
    ``notifications/prompts/list_changed`` (module docstring)."""

    def __init__(self, upstreams: Sequence[UpstreamSession], *, prompt_pins: CataloguePins, **options: Any) -> None:
        super().__init__(upstreams, **options)
        self.prompt_pins = prompt_pins
        self.prompt_sources = {u.name: PromptSource(u) for u in upstreams}
        for source in self.prompt_sources.values():
            prompt_pins.add_source(source)

    async def upstream_state(self, upstream: UpstreamSession) -> None:
        if upstream.state is State.READY:
            self._reload_prompts(upstream)
        await super().upstream_state(upstream)

    async def upstream_notification(self, upstream: UpstreamSession, message: dict[str, Any], related: int | None) -> None:
        if message.get("method") == PROMPTS_LIST_CHANGED:
            self._reload_prompts(upstream, "list_changed")
        await super().upstream_notification(upstream, message, related)

    def _reload_prompts(self, upstream: UpstreamSession, cause: str | None = None) -> None:
        source = self.prompt_sources.get(upstream.name)
        if source is None:
            return
        source.stale()  # before anything awaits: from now on the prompts wait for the check
        if self._tasks is not None:
            self._tasks.start_soon(self._check_prompts, source, cause)

    async def _check_prompts(self, source: PromptSource, cause: str | None) -> None:
        async with source.lock:
            upstream = source.upstream
            wanted = source.catalogue_version
            try:
                prompts = await upstream.list_all(PROMPTS_LIST, "prompts") if "prompts" in upstream.capabilities else []
            except Exception as exc:  # noqa: BLE001 -- unchecked prompts stay held back
                logger.warning(
                    "upstream %r: listing its prompts failed (%s); they stay held back until they can be checked",
                    upstream.name, type(exc).__name__,
                )
                return
            if source.catalogue_version != wanted:
                return  # they changed again while listed: the reload queued behind this one checks them
            source.tools = tuple(prompts)
            source.stale()
            await self.prompt_pins.check(upstream.name, cause)

    # -- what agents are shown and may get

    async def shown_prompts(self, server: str, prompts: list[Any]) -> list[Any]:
        """One upstream's ``prompts/list`` items as agents are shown them (only accepted definitions)."""
        await self.prompt_pins.wait_checked(server)
        shown = self.prompt_pins.shown(server, prompts)
        return prompts if shown is None else shown

    async def prompt_refusal(self, server: str, name: str) -> str | None:
        """Why ``prompts/get`` of ``name`` (the upstream's own) is refused now, or None when it is
        pinned; a refusal is recorded as a ``prompt_held_back`` incident."""
        pins = self.prompt_pins
        await pins.wait_checked(server)
        shown = sanitize(namespaced(server, name))[:200]
        accept = f"a person reviews it (drawbridge pins show --kind prompt {shown}) and accepts it " \
                 f"(drawbridge pins accept --kind prompt {shown})"
        held = pins.held(server)
        if held is not None:
            reason = f"prompt {shown!r} is held back: {held}"
        elif (status := pins.status(server, name)) is PinStatus.PINNED:
            return None
        elif (unpinnable := pins.why_unpinnable(server, name)) is not None:
            reason = f"prompt {shown!r} is held back: {unpinnable}"
        elif status is PinStatus.CHANGED:
            reason = (
                f"prompt {shown!r} is held back: its definition changed since the prompts of server "
                f"{sanitize(server)!r} were pinned; {accept}"
            )
        else:
            reason = (
                f"prompt {shown!r} is held back: it is new since the prompts of server {sanitize(server)!r} "
                f"were pinned (or not listed); {accept}"
            )
        return reason


__all__ = ["HELD_BACK_INCIDENT", "PinnedPromptsGateway", "PromptSource"]
