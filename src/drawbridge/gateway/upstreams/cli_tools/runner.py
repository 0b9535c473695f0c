"""Running one CLI call: a process of its own group, a minimal environment, capped output, a timeout.

Invariant: a call's process runs without a shell, in a new session (so its process group is its own),
with only ``PATH``, ``HOME``, ``LANG`` and the entry's ``env`` in its environment, and nothing it
started outlives the call: when the call ends -- the program exited, its timeout passed, or the call
was cancelled (the pipeline's timeout, the agent gave up) -- every process it started is killed with
SIGKILL. On Linux that holds for every descendant, even one that left the group with ``setsid``: the
program runs under a per-call child subreaper (reaper.py) that kills them all before it exits. Elsewhere
only the process group is killed. Each of stdout and stderr is kept up to ``max_output_bytes``; the rest
is read and dropped (the program never blocks on a full pipe) and counted, and a cut stream ends with
a marker that says how much was left out.

Theory of operation. ``run`` opens the process (on Linux the reaper, which spawns the program) with
anyio, pipes ``stdin`` in and reads both streams in a task group under ``move_on_after(timeout)``. The
reaper ends when the program and everything it started are gone, so the streams close then. In a
``finally`` that also runs on cancellation a reaper still running gets SIGTERM (its cleanup), then the
group is killed and the process reaped, shielded from the cancellation.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import ByteReceiveStream, Process

from drawbridge.gateway.pipeline.result_text import cut_notice

DEFAULT_LANG: Final = "C.UTF-8"
READ_CHUNK: Final = 65536
REAPER: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")
USE_REAPER: Final = sys.platform == "linux"
REAPER_GRACE_SECONDS: Final = 5.0
"""How long a reaper told to stop may take to kill what the program started before its group is killed."""


@dataclass(frozen=True, slots=True)
class Captured:
    data: bytes
    total: int
    """Bytes the program wrote, kept or not."""

    @property
    def cut(self) -> bool:
        return self.total > len(self.data)


@dataclass(frozen=True, slots=True)
class RunResult:
    exit_code: int | None
    """None when the program was still running at the timeout."""
    stdout: Captured
    stderr: Captured
    timed_out: bool


def child_environment(environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``PATH``, ``HOME`` and ``LANG`` of the gateway (``LANG`` defaults to C.UTF-8), then the entry's env."""
    env = {"PATH": environ.get("PATH") or os.defpath, "LANG": environ.get("LANG") or DEFAULT_LANG}
    if environ.get("HOME"):
        env["HOME"] = environ["HOME"]
    env.update(extra)
    return env


class _Sink:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.kept = 0
        self.total = 0

    async def drain(self, stream: ByteReceiveStream | None) -> None:
        if stream is None:
            return
        try:
            while True:
                chunk = await stream.receive(READ_CHUNK)
                self.total += len(chunk)
                room = self.limit - self.kept
                if room > 0:
                    piece = chunk[:room]
                    self.chunks.append(piece)
                    self.kept += len(piece)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return

    def captured(self) -> Captured:
        return Captured(b"".join(self.chunks), self.total)


async def _feed(process: Process, data: bytes | None) -> None:
    if process.stdin is None:
        return
    try:
        if data:
            await process.stdin.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the program stopped reading: what it read is what it got
    finally:
        await process.stdin.aclose()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


async def run(
    argv: tuple[str, ...],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    stdin: bytes | None,
    timeout: float,
    max_output_bytes: int,
) -> RunResult:
    """Run one call (module docstring). Raises ``OSError`` when the program cannot be started."""
    status_read, status_write = os.pipe() if USE_REAPER else (-1, -1)
    command = [sys.executable, "-I", "-S", REAPER, str(status_write), *argv] if USE_REAPER else list(argv)
    try:
        process = await anyio.open_process(
            command,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            pass_fds=(status_write,) if USE_REAPER else (),
        )
    except BaseException:
        _close(status_read, status_write)
        raise
    _close(status_write)
    try:
        result = await _supervise(process, stdin, timeout, max_output_bytes)
        if USE_REAPER and result.exit_code == 127:
            _raise_start_error(status_read)
    finally:
        _close(status_read)
    return result


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _raise_start_error(status_read: int) -> None:
    """The reaper wrote why the program could not be started (an errno), or nothing when it ran."""
    written = os.read(status_read, 64)
    if written:
        code = int(written) if written.isdigit() else errno.EIO
        raise OSError(code, os.strerror(code))


async def _supervise(process: Process, stdin: bytes | None, timeout: float, max_output_bytes: int) -> RunResult:
    out, err = _Sink(max_output_bytes), _Sink(max_output_bytes)
    exit_code: int | None = None
    try:
        with anyio.move_on_after(timeout) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(out.drain, process.stdout)
                tg.start_soon(err.drain, process.stderr)
                tg.start_soon(_feed, process, stdin)
                exit_code = await process.wait()
        timed_out = scope.cancelled_caught
    finally:
        with anyio.CancelScope(shield=True):
            if USE_REAPER and process.returncode is None:
                try:
                    process.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
                with anyio.move_on_after(REAPER_GRACE_SECONDS):
                    await process.wait()
            _kill_group(process.pid)
            await process.wait()
            await process.aclose()
    return RunResult(exit_code, out.captured(), err.captured(), timed_out)


def _text(name: str, captured: Captured, limit: int) -> str:
    text = captured.data.decode("utf-8", errors="replace")
    if captured.cut:
        text += "\n" + cut_notice(name, limit, captured.total - len(captured.data), "max_output_bytes")
    return text


def call_result(result: RunResult, timeout: float, max_output_bytes: int) -> dict[str, Any]:
    """The CallToolResult of a run: ``isError`` on a non-zero exit or a timeout, never a JSON-RPC error."""
    stdout = _text("stdout", result.stdout, max_output_bytes)
    stderr = _text("stderr", result.stderr, max_output_bytes)
    content: list[dict[str, Any]] = []
    if result.timed_out:
        content.append({
            "type": "text",
            "text": f"timed out after {timeout:g} seconds; the process group was killed",
        })
    elif result.exit_code != 0:
        content.append({"type": "text", "text": f"exit status {result.exit_code}"})
    if stdout or not content:
        content.append({"type": "text", "text": stdout})
    if stderr:
        content.append({"type": "text", "text": f"stderr:\n{stderr}"})
    return {
        "content": content,
        "structuredContent": {
            "exit_code": result.exit_code,
            "stdout": stdout,
            "stderr": stderr,
            "stdout_truncated": result.stdout.cut,
            "stderr_truncated": result.stderr.cut,
            "timed_out": result.timed_out,
        },
        "isError": result.timed_out or result.exit_code != 0,
    }


__all__ = ["Captured", "RunResult", "call_result", "child_environment", "run"]
