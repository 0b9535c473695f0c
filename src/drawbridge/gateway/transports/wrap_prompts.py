"""``wrap --pin-prompts``: the wrapped server's prompts, listed by the gateway and checked against
their pins, so the agent reads and gets only prompts a person accepted.

Invariant: no prompt definition nobody accepted reaches the agent. Each page of the server's answer to
the agent's ``prompts/list`` (either era) is shown through the prompt pins as ``tools/list`` pages are
under ``--pin-tools`` (``ChildCatalogue.shown``: a ``changed`` prompt as its pinned definition, a
``new`` one left out, none while the pins cannot be read or were never checked); a ``prompts/get``
waits for the check of the listing in progress and is refused (invalid params, naming ``drawbridge
pins accept``, recorded as a ``prompt_held_back`` incident) unless the prompt is ``pinned``; so is a
``completion/complete`` whose ``ref/prompt`` names it.

Theory of operation. ``ChildPrompts`` is ``ChildCatalogue`` listing ``prompts/list`` (every page, on the
gateway's own ids, in the agent's era) instead of ``tools/list``: listed once the session is
initialized, again on ``notifications/prompts/list_changed``, each listing checked by the prompt pins
(trust on first use, ``mesh.pin_first_use`` and ``mesh.pin_held_back`` marked ``"kind": "prompt"``).
It resolves no call: prompts are not decided, only held back.
"""

from __future__ import annotations

from typing import Any

from drawbridge.canonical import sanitize
from drawbridge.catalogue.fingerprint import PinStatus
from drawbridge.catalogue.names import namespaced
from drawbridge.gateway.protocol.jsonrpc import Message
from drawbridge.gateway.protocol.methods import COMPLETE, PROMPTS_GET, PROMPTS_LIST, PROMPTS_LIST_CHANGED
from drawbridge.gateway.transports.wrap_catalogue import ChildCatalogue

HELD_BACK_INCIDENT = "prompt_held_back"


def prompt_named(message: Message) -> str | None:
    """The prompt a request names: ``prompts/get``'s ``name``, or the ``ref/prompt`` of a
    ``completion/complete`` (whose values could tell a held-back prompt's arguments); None for any
    other request, or a malformed one (the server answers that itself)."""
    params = message.params if isinstance(message.params, dict) else {}
    if message.method == COMPLETE:
        ref = params.get("ref")
        params = ref if isinstance(ref, dict) and ref.get("type") == "ref/prompt" else {}
    elif message.method != PROMPTS_GET:
        return None
    name = params.get("name")
    return name if isinstance(name, str) else None


class ChildPrompts(ChildCatalogue):
    """The wrapped server's prompts under ``--pin-prompts`` (module docstring)."""

    LIST_METHOD = PROMPTS_LIST
    LIST_KEY = "prompts"
    CHANGED_BY = PROMPTS_LIST_CHANGED

    def _store(self, tools: list[Any]) -> None:
        self.tools = tuple(tools)
        self.catalogue_version += 1
        self._routes = {}  # listed (no prompt is a call to resolve)
        self._problem = None

    def listing_waits(self, method: str | None = None) -> bool:
        """A ``prompts/get`` (or a completion of a prompt's arguments, which the relay passes as one)
        always waits for the check (then ``refusal`` decides); a ``prompts/list`` until a first check
        was published."""
        return method == PROMPTS_GET or super().listing_waits(method)

    async def checked(self) -> None:
        await super().checked()
        if self._pins is not None:
            await self._pins.wait_checked(self.name)

    def refusal(self, message: Message) -> str | None:
        """Why the agent's ``prompts/get`` (or ``completion/complete`` of a prompt) is refused now, or
        None when its prompt is pinned."""
        name = prompt_named(message)
        if name is None or self._pins is None:
            return None  # the server answers a malformed request itself
        shown, pinned_as = sanitize(name)[:200], sanitize(namespaced(self.name, name))[:200]  # the control plane's name
        accept = (f"a person reviews it (drawbridge pins show --kind prompt {pinned_as}) and accepts it "
                  f"(drawbridge pins accept --kind prompt {pinned_as})")
        held = self._pins.held(self.name)
        if held is not None:
            return f"prompt {shown!r} is held back: {held}"
        status = self._pins.status(self.name, name)
        if status is PinStatus.PINNED:
            return None
        if (unpinnable := self._pins.why_unpinnable(self.name, name)) is not None:
            return f"prompt {shown!r} is held back: {unpinnable}"
        if status is PinStatus.CHANGED:
            return f"prompt {shown!r} is held back: its definition changed since the server's prompts were pinned; {accept}"
        return f"prompt {shown!r} is held back: it is new since the server's prompts were pinned (or not listed); {accept}"


__all__ = ["HELD_BACK_INCIDENT", "ChildPrompts", "prompt_named"]
