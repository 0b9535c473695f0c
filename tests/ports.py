"""Loopback ports for the processes the tests start (a gateway's listener, a PostgreSQL cluster).

A port is found free and only then bound by the process a test starts, so it must not be taken in
between. ``bind(0)`` draws from the kernel's ephemeral range, which every outgoing connection of every
test draws from too, and which two xdist workers share: a port found free there can be another
socket's by the time the process binds it ("Address already in use"). ``free_port`` draws below that
range instead, from a slice of its own for each xdist worker, walking the slice so that one worker
never hands out the same port twice in a row; what the kernel cannot bind now is skipped.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import Final

LOWEST: Final = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker) if worker.isdigit() else 0
    size = (_ephemeral_low() - LOWEST) // max(count, 1)
    return range(LOWEST + index * size, LOWEST + (index + 1) * size)


_SLICE: Final = _slice()
_next = random.randrange(len(_SLICE)) if len(_SLICE) > 0 else 0


def free_port() -> int:
    """A loopback port nothing is bound to now, that no other worker of this run hands out."""
    global _next
    for _ in range(min(len(_SLICE), 2000)):
        port = _SLICE[_next % len(_SLICE)]
        _next += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the ephemeral range on this machine
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


__all__ = ["free_port"]
