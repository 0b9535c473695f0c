"""A bare asyncio line relay: the reference floor for a stdio gateway in Python.

It spawns the server given on its command line and copies whole lines both ways, with no parsing, no
decision and no record: what any Python process between an agent and a server costs at least.

    python bench/line_relay.py -- COMMAND [ARGS...]
"""

from __future__ import annotations

import asyncio
import os
import sys

LIMIT = 1 << 24


async def _copy(reader: asyncio.StreamReader, write: "callable[[bytes], object]", drain: "callable[[], object]") -> None:
    while True:
        line = await reader.readline()
        if not line:
            return
        write(line)
        await drain()


async def main(argv: list[str]) -> None:
    loop = asyncio.get_running_loop()
    child = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=LIMIT
    )
    assert child.stdin is not None and child.stdout is not None
    stdin = asyncio.StreamReader(limit=LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), os.fdopen(0, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", 0))
    stdout = asyncio.StreamWriter(transport, protocol, None, loop)
    to_child = asyncio.create_task(_copy(stdin, child.stdin.write, child.stdin.drain))
    await _copy(child.stdout, stdout.write, stdout.drain)
    to_child.cancel()
    await child.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[1:] if args[:1] == ["--"] else args))
