"""``drawbridge serve --stdio``: one agent connection over this process's stdin and stdout.

Invariant: every line the agent writes is answered or acted on (bad input gets a JSON-RPC error and
the loop goes on), only whole JSON lines are written back, and one slow request never holds up the
others: each request runs in its own task, notifications and responses are handled in arrival order.
When the agent closes stdin, its requests in flight get a short grace period to be answered, then are
cancelled (and the upstreams told).
"""

from __future__ import annotations

from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

from drawbridge.gateway.protocol.jsonrpc import (
    Kind,
    LineFramer,
    LineRefusal,
    Message,
    Oversize,
    read_client_line,
)
from drawbridge.gateway.protocol.one_reading import DEFAULT_MAX_DEPTH
from drawbridge.gateway.serve.downstream_session import safe_render
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.serve.routes import open_session

READ_CHUNK = 65536
SHUTDOWN_GRACE_SECONDS = 2.0


class StdioOutbound:
    """Writes whole lines to the agent; concurrent writers never interleave."""

    unsolicited = True

    def __init__(self, stream: ByteSendStream) -> None:
        self._stream = stream
        self._lock = anyio.Lock()

    async def send(self, message: dict[str, Any], related: Any = None) -> None:
        data = safe_render(message)
        if data is not None:
            await self.write(data)

    async def write(self, data: bytes) -> None:
        async with self._lock:
            await self._stream.send(data)


async def serve_stdio_session(
    gateway: Gateway,
    client_in: ByteReceiveStream,
    client_out: ByteSendStream,
    *,
    agent: str,
    max_message_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    shutdown_grace: float = SHUTDOWN_GRACE_SECONDS,
) -> None:
    """Serve one agent until it closes its end of the pipe."""
    outbound = StdioOutbound(client_out)
    session = open_session(gateway, agent, outbound, transport="stdio")

    async def answer(message: Message) -> None:
        response = await session.handle_request(message)
        if response is not None:
            try:
                await outbound.send(response)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await session.close()

    async def on_line(item: bytes | Oversize, tg: Any) -> None:
        message = read_client_line(item, max_depth)
        if isinstance(message, LineRefusal):
            await gateway.incident(message.kind, "client", message.detail, message.code)
            if message.reply is not None:
                await outbound.write(message.reply)
            return
        if message.kind is Kind.REQUEST:
            tg.start_soon(answer, message)
        else:
            await session.handle(message)

    try:
        async with anyio.create_task_group() as tg:
            framer = LineFramer(max_message_bytes)
            try:
                while not session.closed:
                    try:
                        chunk = await client_in.receive(READ_CHUNK)
                    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                        break
                    for item in framer.feed(chunk):
                        await on_line(item, tg)
                last = framer.close()
                if last is not None:
                    await on_line(last, tg)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            # The agent closed its input: answers already on their way still get a moment to arrive.
            with anyio.move_on_after(shutdown_grace):
                while session.inflight and not session.closed:
                    await anyio.sleep(0.02)
            await session.close()
    finally:
        gateway.forget_session(session)
