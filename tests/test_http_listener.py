"""The gateway's HTTP listener (``/mcp`` and the control plane): accepted connections carry TCP_NODELAY.

Without it every answer on a kept-alive connection waits out Nagle's algorithm and the peer's delayed
ACK. The test serves a Starlette app with the listener's own ``bind`` and ``serve_http`` on a real
socket, keeps one connection open, finds the server's accepted socket among this process's descriptors
and reads the option from it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import anyio
import pytest
from conftest import scaled
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from drawbridge.gateway.transports.http_listener import bind, serve_http

READY_SECONDS = scaled(10.0)
"""How long the listener may take to start and answer one request."""


def _accepted_socket(server: tuple[str, int], peer: tuple[str, int]) -> socket.socket:
    """The server side of the connection from ``peer``: found by address among this process's descriptors."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            candidate = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if candidate.getsockname()[:2] == server and candidate.getpeername()[:2] == peer:
                return candidate
        except OSError:
            pass
        candidate.close()
    raise AssertionError(f"no accepted socket for {peer} on {server}")


async def _hello(_request: object) -> PlainTextResponse:
    return PlainTextResponse("hello")


@pytest.mark.anyio
async def test_accepted_connections_have_tcp_nodelay() -> None:
    assert Path("/proc/self/fd").is_dir()
    sock = bind("127.0.0.1", 0)
    server = sock.getsockname()[:2]
    app = Starlette(routes=[Route("/", _hello)])
    with anyio.fail_after(READY_SECONDS):
        async with anyio.create_task_group() as tg:
            ready = anyio.Event()
            tg.start_soon(serve_http, app, sock, lambda _h, _p: ready.set())
            await ready.wait()
            async with await anyio.connect_tcp(*server) as stream:
                await stream.send(b"GET / HTTP/1.1\r\nhost: test\r\nconnection: keep-alive\r\n\r\n")
                answer = b""
                while not answer.endswith(b"hello"):
                    answer += await stream.receive()
                assert answer.startswith(b"HTTP/1.1 200")
                peer = stream.extra(anyio.abc.SocketAttribute.local_address)[:2]
                accepted = _accepted_socket(server, peer)
                try:
                    assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
                finally:
                    accepted.close()
            tg.cancel_scope.cancel()
