"""Pipes and sockets as async byte streams, read and written without blocking the event loop.

Invariant: no read or write of a pipe blocks the loop, and no thread is used per read. Pipes and
sockets (what an MCP client gives, what a child process has) are read and written non-blocking,
waiting for readiness on the event loop (``anyio.wait_readable``). Anything else (a terminal, a
regular file) is read and written in a worker thread, because a terminal's blocking mode is shared
with the shell that owns it.

On asyncio a reading stream keeps its descriptor registered with the loop between reads (instead
of registering and unregistering it around every wait, two system calls per message); it lets go
of it when the descriptor becomes readable while nobody waits, so an unread pipe never spins the
loop, and when the stream is closed. When the descriptor becomes readable while a reader waits, the
loop's callback reads it there and then, and hands the bytes to the reader: read later, in the
reader's task, the pipe would still be readable at the loop's next poll, which would queue a second,
stale callback, wake the reader's next wait for nothing and cost it a read that finds the pipe empty.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from contextlib import suppress

import anyio
import anyio.to_thread
from anyio.abc import ByteReceiveStream, ByteSendStream

READ_CHUNK = 65536


def _pollable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _Descriptor:
    """One end of a pipe this process owns: non-blocking while it is pollable, restored and closed once."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pollable = sys.platform != "win32" and _pollable(fd)
        self._restore_blocking: bool | None = None
        if self._pollable:
            self._restore_blocking = os.get_blocking(fd)
            os.set_blocking(fd, False)
        self._closed = False

    def _close_descriptor(self) -> None:
        """Tell the loop, give the descriptor its blocking mode back, close it."""
        if self._pollable:
            anyio.notify_closing(self._fd)
            if self._restore_blocking is not None:
                with suppress(OSError):
                    os.set_blocking(self._fd, self._restore_blocking)
        with suppress(OSError):
            os.close(self._fd)


class FdReceiveStream(_Descriptor, ByteReceiveStream):
    def __init__(self, fd: int) -> None:
        super().__init__(fd)
        self._loop: asyncio.AbstractEventLoop | None = None
        """The asyncio loop the descriptor is registered with, while it is."""
        self._waiter: asyncio.Future[None] | None = None
        self._drained = False
        """The last read took less than it could: the next one waits for readiness before reading
        (a read that would only fail with EAGAIN is a system call saved)."""
        self._want = READ_CHUNK
        """How much the waiting reader takes (what the loop's callback reads for it)."""
        self._ready: bytes | OSError | None = None
        """What the loop's callback read for the reader (or the error it met), not yet returned."""

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._pollable:
                ready = self._ready
                if ready is not None:
                    self._ready = None
                    if isinstance(ready, OSError):
                        raise ready
                    data = ready
                elif self._drained:
                    self._drained = False
                    await self._wait_readable(max_bytes)
                    continue
                else:
                    try:
                        data = os.read(self._fd, max_bytes)
                    except BlockingIOError:
                        await self._wait_readable(max_bytes)
                        continue
                    self._drained = len(data) < max_bytes
            else:
                data = await anyio.to_thread.run_sync(os.read, self._fd, max_bytes, abandon_on_cancel=True)
            if not data:
                raise anyio.EndOfStream
            return data

    def receive_nowait(self, max_bytes: int = READ_CHUNK) -> bytes | None:
        """What can be read now without waiting: data, ``b""`` at the end of the stream, or None
        when nothing is there yet (or the descriptor cannot be read without waiting)."""
        if self._closed:
            raise anyio.ClosedResourceError
        if not self._pollable:
            return None
        ready = self._ready
        if ready is not None:
            self._ready = None
            if isinstance(ready, OSError):
                raise ready
            return ready
        try:
            data = os.read(self._fd, max_bytes)
        except BlockingIOError:
            self._drained = True
            return None
        self._drained = len(data) < max_bytes
        return data

    async def _wait_readable(self, max_bytes: int) -> None:
        """Wait until the descriptor is readable; on asyncio, until the loop's callback has read it
        (``_ready``)."""
        if self._waiter is not None:
            raise anyio.BusyResourceError("reading from")
        # The loop the descriptor is registered with, as long as it is (asking for the running
        # loop costs a getpid() system call on Python 3.11).
        loop = self._loop
        if loop is None or loop.is_closed():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # another event loop than asyncio's
                await anyio.wait_readable(self._fd)
                return
        if self._loop is not loop:
            self._release()
            loop.add_reader(self._fd, self._on_readable)
            self._loop = loop
        self._want = max_bytes
        waiter = self._waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _on_readable(self) -> None:
        waiter = self._waiter
        if waiter is None:
            self._release()  # nobody is reading: do not wake the loop again until someone is
            return
        if waiter.done() or self._ready is not None:
            return
        try:
            data = os.read(self._fd, self._want)
        except BlockingIOError:
            return  # not readable after all: the reader goes on waiting
        except OSError as exc:
            self._ready = exc
        else:
            self._ready = data
            self._drained = len(data) < self._want
        waiter.set_result(None)

    def _release(self) -> None:
        if self._loop is not None:
            with suppress(Exception):  # the loop may be closed already
                self._loop.remove_reader(self._fd)
            self._loop = None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ready = None
        if self._pollable:
            self._release()
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_exception(anyio.ClosedResourceError())
        self._close_descriptor()


class FdSendStream(_Descriptor, ByteSendStream):
    def send_nowait(self, item: bytes) -> int:
        """Write what the descriptor takes now, without waiting: the number of bytes written (0 when
        it takes none now, and always for a descriptor that is not a pipe or a socket)."""
        if self._closed:
            raise anyio.ClosedResourceError
        if not self._pollable:
            return 0
        try:
            return os.write(self._fd, item)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise anyio.BrokenResourceError from exc

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                if self._pollable:
                    try:
                        written = os.write(self._fd, view)
                    except BlockingIOError:
                        await anyio.wait_writable(self._fd)
                        continue
                else:
                    written = await anyio.to_thread.run_sync(os.write, self._fd, view)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise anyio.BrokenResourceError from exc
            view = view[written:]

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_descriptor()


__all__ = ["READ_CHUNK", "FdReceiveStream", "FdSendStream"]
