"""Starting the upstream command, with nothing but the standard library: its environment, its pipes,
its process group.

Invariant: the child never sees the gateway's own secrets (every ``DRAWBRIDGE_*`` variable is removed
before spawn, plus whatever the caller's ``EnvPolicy`` removes), it runs in a process group of its
own, and its stdin and stdout are pipes only the gateway holds the other ends of.

Why a module apart from ``child_process``: wrap starts its server before it imports the gateway
(the parser, the pipeline, the recorder: half a second of imports), so that the server's own start
overlaps them. Nothing reaches the server before the gateway is up: a child started so waits on its
stdin, and if the gateway cannot start it is stopped (``SpawnedChild.stop``) and never hears a line.
``child_process.UpstreamProcess.adopt`` takes such a child over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

EnvFilter = Callable[[Mapping[str, str]], dict[str, str]]
"""Takes the gateway's environment, returns the child's."""

STOP_SECONDS = 2.0
"""How long a child stopped before the gateway started gets to exit at the end of its stdin, then
after SIGTERM, before SIGKILL (the MCP stdio shutdown sequence)."""


@dataclass(frozen=True)
class EnvPolicy:
    """Which environment variables the upstream inherits.

    By default it inherits everything except the gateway's own variables (an MCP client configures the
    server's credentials in the environment it launches the gateway with, so they must pass). Names
    in ``deny_names`` and names starting with a prefix in ``deny_prefixes`` are never inherited, even
    when listed in ``allow``. With ``inherit=False`` only ``allow`` passes. ``extra`` (the upstream's
    own ``env``) is added last: a name of ``deny_names`` set there passes with the value the
    configuration gives it (the operator passed it on purpose; the gateway's value never does), a
    name with a denied prefix never does.
    """

    inherit: bool = True
    allow: frozenset[str] = frozenset()
    deny_names: frozenset[str] = frozenset()
    deny_prefixes: tuple[str, ...] = ("DRAWBRIDGE_",)
    extra: Mapping[str, str] = field(default_factory=dict)

    def denied(self, name: str) -> bool:
        return name in self.deny_names or name.startswith(self.deny_prefixes)

    def __call__(self, environ: Mapping[str, str]) -> dict[str, str]:
        chosen = {
            name: value
            for name, value in environ.items()
            if (self.inherit or name in self.allow) and not self.denied(name)
        }
        chosen.update((name, value) for name, value in self.extra.items() if not name.startswith(self.deny_prefixes))
        return chosen


class UpstreamStartError(Exception):
    """The command could not be started; the message names the command and the OS error."""


class SpawnedChild:
    """A started upstream and the gateway's ends of its pipes (``stdin_fd`` to write, ``stdout_fd`` to
    read), until ``UpstreamProcess.adopt`` takes them or ``stop`` ends it."""

    def __init__(
        self, popen: subprocess.Popen[bytes], stdin_fd: int, stdout_fd: int, stderr_fd: int | None = None
    ) -> None:
        self.popen = popen
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        self.popen.kill()

    def take_pipes(self) -> tuple[int, int]:
        """Hand the pipes over (stdin's write end, stdout's read end): from here on the taker closes
        them, and ``stop`` leaves them alone."""
        pipes = (self.stdin_fd, self.stdout_fd)
        self.stdin_fd = self.stdout_fd = -1
        if -1 in pipes:
            raise RuntimeError("the child's pipes were handed over already")
        return pipes

    def take_stderr(self) -> int:
        """Hand the read end of the child's stderr pipe over (spawned with ``stderr_pipe``)."""
        fd, self.stderr_fd = self.stderr_fd, None
        if fd is None:
            raise RuntimeError("the child's stderr is not a pipe of the gateway's, or was handed over already")
        return fd

    def stop(self) -> None:
        """End a child the gateway will not serve: close its pipes (EOF on its stdin) and give it time
        to exit, then SIGTERM its group, then SIGKILL."""
        _close_fds(*(fd for fd in (self.stdin_fd, self.stdout_fd) if fd >= 0), self.stderr_fd)
        self.stdin_fd = self.stdout_fd = -1
        self.stderr_fd = None
        try:
            self.popen.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.popen.poll() is not None:
                break
            try:
                if sys.platform == "win32":  # pragma: no cover
                    self.popen.kill()
                else:
                    os.killpg(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.popen.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                continue


@dataclass
class Upstream:
    """The server a gateway relays to: its command and environment, and the child already started for
    it, if any (or why it could not be started)."""

    argv: list[str]
    env_filter: EnvFilter
    started: SpawnedChild | str | None = None


def _close_fds(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def spawn_child(
    argv: Sequence[str],
    *,
    env_filter: EnvFilter | None = None,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
    stderr_pipe: bool = False,
) -> SpawnedChild:
    """Start ``argv`` in a new session with piped stdin and stdout; its stderr is the gateway's, or
    with ``stderr_pipe`` a pipe whose read end the child holds as ``stderr_fd``."""
    if not argv:
        raise UpstreamStartError("no upstream command was given")
    source = os.environ if environ is None else environ
    env = (env_filter or EnvPolicy())(source)
    # The child's stdin and stdout are pipes of our own (close-on-exec here; the child gets them as
    # fds 0 and 1, and no other descriptor of the gateway).
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe() if stderr_pipe else (None, None)
    try:
        popen = subprocess.Popen(
            list(argv),
            stdin=stdin_read,
            stdout=stdout_write,
            stderr=stderr_write,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        _close_fds(stdin_write, stdout_read, stderr_read)
        raise UpstreamStartError(_start_failure(argv[0], cwd, exc)) from exc
    except BaseException:
        _close_fds(stdin_write, stdout_read, stderr_read)
        raise
    finally:
        # The child holds these ends now: EOF on its stdout comes when it (and what it started) is gone.
        _close_fds(stdin_read, stdout_write, stderr_write)
    return SpawnedChild(popen, stdin_write, stdout_read, stderr_read)


def _start_failure(command: str, cwd: str | None, exc: OSError) -> str:
    """Why the child did not start, blaming what failed: the child's working directory (the OS error
    then names it, and the same errno would otherwise read as a missing program) or the command."""
    if cwd is not None and exc.filename == cwd:
        if isinstance(exc, FileNotFoundError):
            return f"cannot start upstream {command!r}: working directory {cwd} does not exist"
        return f"cannot start upstream {command!r}: working directory {cwd}: {exc.strerror or exc}"
    return f"cannot start upstream {command!r}: {exc.strerror or exc}"


__all__ = ["EnvFilter", "EnvPolicy", "SpawnedChild", "Upstream", "UpstreamStartError", "spawn_child"]
