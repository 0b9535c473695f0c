"""The per-call launcher on Linux: a child subreaper that runs the program and, when the call ends, kills
every process the program started, even one that left the process group with ``setsid``.

Invariant: when this process exits, it has no descendant left. It makes itself a child subreaper
(``prctl(PR_SET_CHILD_SUBREAPER)``), so a process whose parent dies is re-parented to it rather than to
init; it spawns the program, waits for it, then SIGKILLs every descendant it can see in ``/proc`` and
reaps until it has no child at all. A descendant can only leave that tree by killing this process
first (same user) or by changing its user; nothing else escapes. SIGTERM (the gateway's signal at a
timeout or a cancelled call) does the same cleanup at once.

It is run as a script (``python -I -S reaper.py STATUS_FD PROGRAM ARGS...``) and imports only the
standard library: it must start fast, since every call pays for its start (about 15 ms). When the
program cannot be started it writes the errno to ``STATUS_FD`` and exits 127; otherwise it closes that
descriptor unwritten. Its exit status is the program's (a program killed by a signal kills it with
the same signal).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36
"""From <linux/prctl.h>."""


class _Stop(Exception):
    """SIGTERM arrived: the call ended before the program did."""


def _on_term(signum: int, frame: object) -> None:
    raise _Stop


def _descendants(root: int) -> list[int]:
    """Every process whose chain of parents reaches ``root`` (zombies included)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue  # gone meanwhile
        ppid = int(text[text.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), ()):
            found.append(child)
            pending.append(child)
    return found


def _reap_available() -> bool:
    """Reap every child that has ended; False once there is no child left at all."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass
    except ChildProcessError:
        return False
    return True


def _kill_descendants() -> None:
    """SIGKILL and reap until no child is left: as a subreaper, no child left means no descendant left."""
    me = os.getpid()
    while _reap_available():
        for pid in _descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)  # at least one of those just killed ends; then look again
        except ChildProcessError:
            return


def _exit_like(status: int) -> None:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no handler to reset
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def main(argv: list[str]) -> None:
    status_fd, program = int(argv[0]), argv[1:]
    os.set_inheritable(status_fd, False)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(status_fd, str(ctypes.get_errno()).encode())
        os._exit(127)
    signal.signal(signal.SIGTERM, _on_term)
    try:
        try:
            pid = os.posix_spawnp(
                program[0], program, os.environ,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM),
            )
        except OSError as exc:
            os.write(status_fd, str(exc.errno or 0).encode())
            os._exit(127)
        os.close(status_fd)
        # The program holds the pipes now: the gateway sees their end when the program's processes close them.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _, status = os.waitpid(pid, 0)
    except _Stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _kill_descendants()
        os._exit(128 + signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _kill_descendants()
    _exit_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
