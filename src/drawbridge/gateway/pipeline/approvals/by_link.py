"""Approval by link: the agent's client is asked, with URL-mode elicitation (MCP 2025-11-25), to open
the approval's page in the web console, where a logged-in operator decides.

Invariant: a link asks; it never answers. The client's answer to the URL-mode request says only
whether its user agreed to open the page, so it resolves nothing: the approval is decided on the
console page, by a person who logged in there with the admin token (channel ``console``, strength
``operator``), which is why a link may be sent even for what only an operator may approve. The link
carries no credential (the page asks for a login first) and names only the approval; once the
approval ended (approved, denied, expired) the page shows that it ended and takes no answer. The
request repeats no argument value: the arguments are shown on the page, to the operator only.

Theory of operation. The transport offers its in-band asker as an ``InBand`` (``client_link``),
which says whether the client declared form or URL mode. With ``approval.ask_by_link: true`` and the
console served, the gate hands the engine a ``LinkAsker``; the engine opens the approval as a
blocking one and, while it waits for a resolution, ``LinkAsker`` sends the ``elicitation/create``
of ``link_params`` once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from drawbridge.gateway.pipeline.approvals.settlement import clip
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.state.approvals import Approval

logger = logging.getLogger("drawbridge.approvals")

Elicit = Callable[[ToolCall, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]


def link_params(call: ToolCall, approval: Approval, url: str, now: datetime) -> dict[str, Any]:
    """``elicitation/create`` params (URL mode) pointing a person at the approval's console page."""
    seconds = int(max(approval.remaining(now), timedelta(0)).total_seconds())
    message = (
        f"drawbridge: agent {clip(call.agent, 128)} asks to run tool {clip(call.tool, 256)}. "
        f"{clip(approval.reason)}. An operator decides this one call in the drawbridge console "
        f"(approval {approval.short_id}, open for {seconds} s; log in with the admin token)."
    )
    return {"mode": "url", "message": message, "url": url, "elicitationId": approval.id}


@dataclass(frozen=True)
class LinkAsker:
    """Sends the approval's link to the client, once, and ignores its answer (module docstring)."""

    elicit: Elicit
    pages: str
    """The console's approval pages, ending in ``/``: ``http://127.0.0.1:8788/console/approvals/``."""
    clock: Callable[[], datetime]

    def url(self, approval: Approval) -> str:
        return self.pages + approval.id

    async def __call__(self, call: ToolCall, approval: Approval) -> None:
        try:
            answer = await self.elicit(call, link_params(call, approval, self.url(approval), self.clock()))
        except Exception as exc:  # noqa: BLE001 -- the console still reaches the operator
            logger.warning("approval link could not be sent (%s); the console still decides", type(exc).__name__)
            return
        if answer.get("action") != "accept":
            logger.info("the client did not open approval %s's link; the console still decides", approval.short_id)


__all__ = ["LinkAsker", "link_params"]
