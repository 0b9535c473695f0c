"""An HTTP listener for the gateway's Starlette apps (``/mcp``, the control plane), on a socket bound
before anything starts.

Invariant: the listening socket is opened by ``bind`` before the gateway spawns or connects anything, so a
port in use is a one-line startup error, and ``port: 0`` gives a free port that is then reported
(``on_ready``). The socket is made with ``IPPROTO_TCP`` so that asyncio sets ``TCP_NODELAY`` on every
connection it accepts (it does so only for sockets whose protocol says TCP): without it each answer on a
kept-alive connection waits out Nagle and the peer's delayed ACK (tens of milliseconds). uvicorn serves on
that socket without signal handling of its own: the command owns SIGINT and SIGTERM and shuts down in order
(the ``/mcp`` sessions first, then the listener). No peer holds a connection by not sending, and a listener
holds a bounded number of them (``http_deadlines``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import contextmanager

import anyio
import uvicorn
from starlette.applications import Starlette

from drawbridge.gateway.transports.http_deadlines import ListenerLimits, protocol_for


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the command owns SIGINT/SIGTERM and shuts down in order."""

    @contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def bind(host: str, port: int) -> socket.socket:
    """Open the listening socket first, so a port in use is a clear startup error, and port 0 works."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(False)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(
    app: Starlette,
    sock: socket.socket,
    on_ready: Callable[[str, int], None] | None = None,
    limits: ListenerLimits = ListenerLimits(),
) -> None:
    """Serve ``app`` on an already bound socket until cancelled; then stop accepting and finish. Every
    connection is read under ``limits`` (``http_deadlines``: read deadlines, a connection cap)."""
    # log_config=None: uvicorn's loggers write through the command's log format (cli.log_format), not
    # through handlers of their own. ws="none": no route is a WebSocket, and no connection may leave the
    # protocol that holds its deadlines.
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2,
        log_config=None, http=protocol_for(limits), ws="none",  # type: ignore[arg-type]
    )
    server = _Server(config)
    done = anyio.Event()

    async def run() -> None:
        with anyio.CancelScope(shield=True):
            try:
                await server.serve(sockets=[sock])
            finally:
                done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:  # cancelled while the server still starts, too: it must then be told to exit
            while not server.started and not done.is_set():
                await anyio.sleep(0.01)
            if on_ready is not None and server.started:
                host, port = sock.getsockname()[:2]
                on_ready(host, port)
            await done.wait()
        finally:
            server.should_exit = True
            endpoint = getattr(app.state, "mcp_endpoint", None)
            with anyio.CancelScope(shield=True):
                if endpoint is not None:
                    await endpoint.close()
                with anyio.move_on_after(5):
                    await done.wait()


__all__ = ["bind", "serve_http"]
