"""The upstream MCP server as a child process: its environment, its pipes, its death.

Invariant: the child never sees the gateway's own secrets (every ``DRAWBRIDGE_*`` variable is removed
before spawn, plus whatever the caller's ``EnvPolicy`` removes), and the gateway never outlives its
knowledge of the child: when the child's stdout ends, ``lines()`` ends, and ``exit_description()`` says
how the child ended. The child's stderr is the gateway's stderr (passed through), or, under serve,
relayed as log lines that name the upstream (``relay_stderr``).

Theory of operation. ``UpstreamProcess.spawn`` starts the command in its own process group with piped
stdin and stdout (``child_spawn``; ``adopt`` takes over a child started so before the event loop ran).
Writes go through one lock so that lines from concurrent calls never interleave; a write to a child that
is gone raises ``UpstreamGone``. ``send_nowait`` hands whole lines to the pipe's buffer without waiting
when nothing is being written and the buffer is below its limit (else it writes nothing and the caller
uses ``send``): on asyncio the pipe transport buffers a write whole and flushes it in the background, so
such a line can never be torn. ``lines()`` frames stdout with the size limit (``line_batches()``: the
lines of one read together). ``aclose()`` follows the MCP stdio shutdown sequence: close the child's
stdin, give it a grace period, then SIGTERM the process group, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Final

import anyio

from drawbridge.activity_log import activity
from drawbridge.canonical import sanitize
from drawbridge.gateway.pipeline.result_text import LineRedactor, redacted_text
from drawbridge.gateway.protocol.jsonrpc import LineFramer, Oversize
from drawbridge.gateway.upstreams.child_spawn import EnvFilter, SpawnedChild, spawn_child
from drawbridge.gateway.upstreams.pipes import FdReceiveStream

GRACE_SECONDS: Final = 2.0
KILL_SECONDS: Final = 2.0
READ_CHUNK: Final = 65536
STDERR_LINE_CAP: Final = 4096
"""The longest stderr line relayed whole; the rest of a longer one is cut (after it was redacted, so
that a secret across the cut is not half shown)."""
STDERR_READ_CAP: Final = 65536
"""What of a stderr line is read and redacted; the rest of a longer one is read and dropped."""


async def _pipe_writer(fd: int) -> asyncio.StreamWriter:
    """An asyncio stream writer over the write end of a pipe (it owns ``fd`` from here on): its
    transport takes every write whole into a buffer and flushes it in the background."""
    loop = asyncio.get_running_loop()
    pipe = open(fd, "wb", buffering=0)  # noqa: SIM115 -- the transport owns and closes it
    try:
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), pipe
        )
    except BaseException:
        pipe.close()
        raise
    return asyncio.StreamWriter(transport, protocol, None, loop)


def relay_stderr(fd: int, label: str) -> None:
    """Relay the child's stderr, line by line, as log lines naming the upstream (``upstream_stderr``),
    in a thread of its own that ends with the child's stderr; it owns ``fd``. Not on any call's path.
    A secret the built-in detectors find (an upstream that logs the credential it failed with) is
    redacted as ``result_guards`` redacts it: a log line never carries one, and the lines after a private
    key's BEGIN line are redacted up to its END line (``LineRedactor``)."""

    def relay() -> None:
        redact = LineRedactor(redacted_text)  # a key's body lines after its BEGIN line go too
        with open(fd, "rb") as lines:
            while raw := lines.readline(STDERR_READ_CAP):
                whole = raw.endswith(b"\n")
                while not whole and (rest := lines.readline(STDERR_READ_CAP)):  # the rest is not shown
                    whole = rest.endswith(b"\n")
                line = redact(raw.rstrip(b"\r\n").decode("utf-8", "replace"))[:STDERR_LINE_CAP]  # cut once redacted
                activity("upstream_stderr", {"upstream": label, "line": sanitize(line)})

    threading.Thread(target=relay, name=f"drawbridge-stderr-{label}", daemon=True).start()


class UpstreamGone(Exception):
    """The child can no longer be written to."""


class UpstreamProcess:
    def __init__(
        self,
        process: SpawnedChild,
        argv: Sequence[str],
        max_message_bytes: int,
        stdin: asyncio.StreamWriter,
        stdout_fd: int,
    ) -> None:
        self._process = process
        self._stdout = FdReceiveStream(stdout_fd)
        self._framer = LineFramer(max_message_bytes)
        self.argv = tuple(argv)
        self._max = max_message_bytes
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._stdin_closed = False
        self._writer = stdin

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        env_filter: EnvFilter | None = None,
        cwd: str | None = None,
        max_message_bytes: int,
        environ: Mapping[str, str] | None = None,
        stderr_label: str | None = None,
    ) -> UpstreamProcess:
        """Start the child; with ``stderr_label`` its stderr lines are relayed as the gateway's own
        log lines naming it (``relay_stderr``), else its stderr is the gateway's."""
        child = spawn_child(argv, env_filter=env_filter, cwd=cwd, environ=environ, stderr_pipe=stderr_label is not None)
        if child.stderr_fd is not None and stderr_label is not None:
            relay_stderr(child.take_stderr(), stderr_label)
        return await cls.adopt(child, max_message_bytes=max_message_bytes)

    @classmethod
    async def adopt(cls, child: SpawnedChild, *, max_message_bytes: int) -> UpstreamProcess:
        """Take over a started child (``child_spawn``): stdout is read directly, without a transport,
        so a read takes whatever the child has written so far; stdin is written through an asyncio
        transport."""
        stdin_fd, stdout_fd = child.take_pipes()
        try:
            stdin = await _pipe_writer(stdin_fd)
        except BaseException:
            os.close(stdout_fd)
            raise
        return cls(child, child.popen.args, max_message_bytes, stdin, stdout_fd)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def send(self, data: bytes) -> None:
        """Write complete line(s); concurrent callers are serialized so lines never interleave."""
        writer = self._writer
        async with self._write_lock:
            if self._stdin_closed or writer.transport.is_closing():
                raise UpstreamGone("the upstream's stdin is closed")
            try:
                writer.write(data)
                await writer.drain()
            except (OSError, RuntimeError) as exc:  # BrokenPipeError, ConnectionResetError, ...
                raise UpstreamGone(f"writing to the upstream failed: {type(exc).__name__}") from exc

    def send_nowait(self, data: bytes) -> bool:
        """Hand complete line(s) to the pipe now, if that needs no waiting; False: nothing was written.

        True means the bytes are in the pipe transport's buffer, whole and after every earlier line,
        and reach the child as the transport flushes (as ``send`` would leave them before its wait
        for the buffer to drain). Raises ``UpstreamGone`` when the write found the pipe closed.
        """
        writer = self._writer
        if self._stdin_closed or self._write_lock.locked():
            return False
        transport = writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() >= transport.get_write_buffer_limits()[1]:
            return False
        writer.write(data)
        if transport.is_closing():  # the write itself found the child gone
            raise UpstreamGone("writing to the upstream failed: BrokenPipeError")
        return True

    async def lines(self) -> AsyncIterator[bytes | Oversize]:
        """Lines of the child's stdout until it ends (EOF or a read error)."""
        async for batch in self.line_batches():
            for item in batch:
                yield item

    async def line_batches(self) -> AsyncIterator[list[bytes | Oversize]]:
        """The same lines, as the lists that arrived in one read (a reader may then handle them
        together: one write for their records, one for their answers)."""
        stdout = self._stdout
        framer = self._framer
        while True:
            try:
                chunk = await stdout.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                break
            batch = framer.feed(chunk)
            if batch:
                yield batch
        last = framer.close()
        if last is not None:
            yield [last]

    def more_lines(self) -> list[bytes | Oversize]:
        """Lines the child has written since the last read, without waiting (none at its end: the
        next ``line_batches`` step sees that)."""
        try:
            chunk = self._stdout.receive_nowait(READ_CHUNK)
        except (anyio.ClosedResourceError, OSError):
            return []
        return self._framer.feed(chunk) if chunk else []

    async def wait_exit(self, timeout: float) -> int | None:
        """The exit status if the child exits within ``timeout`` seconds, else None."""
        with anyio.move_on_after(timeout):
            while self._process.returncode is None:
                await anyio.sleep(0.01)
        return self._process.returncode

    def exit_description(self) -> str:
        code = self._process.returncode
        if code is None:
            return "the upstream closed its stdout"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the upstream was killed by {name}"
        return f"the upstream exited with status {code}"

    async def close_stdin(self) -> None:
        async with self._write_lock:
            if self._stdin_closed:
                return
            self._stdin_closed = True
            self._writer.close()  # what is buffered is still flushed, then the pipe is closed
            try:
                await self._writer.wait_closed()
            except (OSError, RuntimeError):
                pass

    async def aclose(self, grace: float = GRACE_SECONDS) -> None:
        """Stop the child: close its stdin, wait ``grace`` seconds, then SIGTERM, then SIGKILL its group."""
        with anyio.CancelScope(shield=True):
            # A child that stopped reading its stdin can hold a write (and so the close) forever.
            with anyio.move_on_after(max(grace, 0.5)):
                await self.close_stdin()
            if await self.wait_exit(grace) is None:
                self._signal_group(signal.SIGTERM)
                if await self.wait_exit(KILL_SECONDS) is None:
                    self._signal_group(signal.SIGKILL)
                    await self.wait_exit(KILL_SECONDS)
            else:
                # The leader exited; descendants it left in the group must not outlive the gateway.
                self._signal_group(signal.SIGTERM)
            await self._stdout.aclose()

    def _signal_group(self, sig: signal.Signals) -> None:
        if sys.platform == "win32":  # pragma: no cover
            if self._process.returncode is None:
                self._process.kill()
            return
        try:
            os.killpg(self._process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
