"""A listener stopped while it is still starting stops: ``serve_http`` cancelled before its server said
it started returns (the gateway's SIGTERM right after startup used to hang for ever on the control
plane's listener, whose server was never told to exit)."""

from __future__ import annotations

import anyio
import pytest
from conftest import scaled
from starlette.applications import Starlette

from drawbridge.gateway.transports.http_listener import bind, serve_http


@pytest.mark.anyio
@pytest.mark.parametrize("after", [0.0, 0.001, 0.005, 0.02])
async def test_a_listener_cancelled_while_starting_returns(after: float) -> None:
    sock = bind("127.0.0.1", 0)
    try:
        with anyio.fail_after(scaled(10)):
            async with anyio.create_task_group() as tg:
                tg.start_soon(serve_http, Starlette(), sock)
                await anyio.sleep(after)
                tg.cancel_scope.cancel()
    finally:
        sock.close()
