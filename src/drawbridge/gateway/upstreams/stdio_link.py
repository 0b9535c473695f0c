"""The session's link to an upstream that is a child process: one JSON message per line each way.

Invariant: a write to a child that is gone raises ``UpstreamLost`` (never a silent drop), and ``run``
returns only when the child's stdout has ended, with how the child ended. A line over the size limit
is never parsed: it is delivered as an ``Oversize`` (its size and first bytes), which the exchange
reports and, when its start proves whose answer it was, answers that request with an error.

Theory of operation. The child itself (spawn, environment, shutdown) is ``child_process.UpstreamProcess``;
this link only frames messages onto its pipes for ``session.UpstreamSession``. Nothing on stdio ties a
server message to a request, so every message is delivered with ``related`` None, and there is
nothing to abort when a request is cancelled (the session's ``notifications/cancelled`` is all).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
from anyio.abc import TaskStatus

from drawbridge.gateway.upstreams.child_process import UpstreamGone, UpstreamProcess
from drawbridge.gateway.upstreams.requests import Deliver, UpstreamLost, render


class StdioLink:
    """The upstream as a child process: one JSON message per line on its stdin and stdout."""

    related_known = False

    def __init__(self, process: UpstreamProcess) -> None:
        self.process = process

    async def send(self, message: Mapping[str, Any]) -> None:
        try:
            await self.process.send(render(message))
        except UpstreamGone as exc:
            raise UpstreamLost(str(exc)) from exc

    async def run(self, deliver: Deliver, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> str:
        task_status.started()
        async for item in self.process.lines():
            await deliver(item, None)
        await self.process.wait_exit(0.5)
        return self.process.exit_description()

    def handshake_done(self, version: str) -> None:
        pass

    def abort(self, request_id: int) -> None:
        pass

    async def aclose(self) -> None:
        await self.process.aclose(grace=1.0)


__all__ = ["StdioLink"]
