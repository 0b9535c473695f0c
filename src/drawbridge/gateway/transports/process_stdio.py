"""The gateway process's own stdin and stdout as async byte streams.

Invariant: while the relay runs, only the relay writes to the client's pipe. File descriptors 0 and 1
are moved to private descriptors (close-on-exec, so the upstream never inherits them), fd 0 is pointed
at /dev/null and fd 1 at stderr; a stray ``print`` lands on stderr instead of corrupting the protocol.
Both are restored on exit. The streams themselves are ``upstreams.pipes``'s, as for a child's pipes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from anyio.abc import ByteReceiveStream, ByteSendStream

from drawbridge.gateway.upstreams.pipes import FdReceiveStream, FdSendStream


def _claim(fd: int, replacement: int) -> int:
    """Move ``fd`` to a private close-on-exec descriptor and point ``fd`` at ``replacement``."""
    private = os.dup(fd)
    os.set_inheritable(private, False)
    os.dup2(replacement, fd)
    return private


@asynccontextmanager
async def process_stdio() -> AsyncIterator[tuple[ByteReceiveStream, ByteSendStream]]:
    """Claim fds 0 and 1 for the relay; yield (client_in, client_out)."""
    sys.stdout.flush()
    saved_in = os.dup(0)
    saved_out = os.dup(1)
    os.set_inheritable(saved_in, False)
    os.set_inheritable(saved_out, False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        private_in = _claim(0, devnull)
        private_out = _claim(1, 2)
    finally:
        os.close(devnull)
    client_in = FdReceiveStream(private_in)
    client_out = FdSendStream(private_out)
    try:
        yield client_in, client_out
    finally:
        await client_in.aclose()
        await client_out.aclose()
        with suppress(OSError):
            os.dup2(saved_in, 0)
        with suppress(OSError):
            os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
