"""An append-only file of whole lines: the discipline every evidence file on disk follows.

Invariant: bytes are only ever added at the end of the file, whole lines per
``os.write`` (one, or several joined when records are written together), and a
line the caller was told is written has reached the kernel (and, under
``fsync="always"``, the disk). Nothing here truncates or rewrites.

Theory of operation. The file is opened ``O_WRONLY | O_APPEND | O_CREAT``
(mode 0o600) and locked with an exclusive ``flock``, so a second writer is a
startup error rather than an interleaving. With ``O_APPEND`` the kernel places
each whole write at the end, so a reader sees whole lines or a partial last
line after a crash, never a mixture. A short or failed write, or a failed
fsync, poisons the writer: the file's state is no longer known, so every later
append raises and the caller fails closed.

Durability (``fsync``), the documented setting shared by all evidence files:

- ``"always"`` (default): ``os.fsync`` after every line, before ``append`` returns.
- ``"batch"``: ``os.fsync`` every ``batch_size`` lines, on ``sync()`` and on
  ``close()``; a power loss can lose up to ``batch_size - 1`` answered records
  (a process crash loses none: they are in the kernel already).
- ``"never"``: no fsync; the kernel writes back when it likes (tests, throwaway runs).

When the file is created and the policy is not ``"never"``, its directory is
fsynced too, so the new name survives a power loss.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

FsyncPolicy = Literal["always", "batch", "never"]
FSYNC_POLICIES: tuple[str, ...] = ("always", "batch", "never")
FILE_MODE = 0o600


def _check_line(line: bytes) -> None:
    if not line.endswith(b"\n") or b"\n" in line[:-1]:
        raise ValueError("an appended line must end with one newline and hold no other")


class AppendOnlyError(Exception):
    """The file cannot be opened or written. Callers must fail closed."""


class AppendOnlyLocked(AppendOnlyError):
    """Another writer holds the file."""


class AppendOnlyFile:
    """A locked, append-only file; ``what`` names it in every error message."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        fsync: FsyncPolicy = "always",
        *,
        batch_size: int = 64,
        what: str = "evidence file",
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.path = Path(path)
        self.fsync_policy: FsyncPolicy = fsync
        self.what = what
        self.lock = threading.Lock()
        self._batch_size = batch_size
        self._unsynced = 0
        self._broken: str | None = None
        self._closed = False
        self._fd, self.created = self._open()
        try:
            self._lock_file()
            if self.created:
                os.fchmod(self._fd, FILE_MODE)
                if fsync != "never":
                    os.fsync(self._fd)
                    self._fsync_directory()
        except BaseException:
            os.close(self._fd)
            raise

    def _open(self) -> tuple[int, bool]:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        try:
            return os.open(self.path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE), True
        except FileExistsError:
            pass
        except OSError as exc:
            raise AppendOnlyError(f"cannot create {self.what} {self.path}: {exc.strerror}") from exc
        try:
            info = os.stat(self.path)
        except OSError as exc:
            raise AppendOnlyError(f"cannot open {self.what} {self.path}: {exc.strerror}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise AppendOnlyError(f"{self.what} {self.path} is not a regular file")
        try:
            return os.open(self.path, flags), False
        except OSError as exc:
            raise AppendOnlyError(f"cannot open {self.what} {self.path}: {exc.strerror}") from exc

    def _lock_file(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AppendOnlyLocked(f"{self.what} {self.path} is already open for writing elsewhere") from None

    def _fsync_directory(self) -> None:
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def write_line_locked(self, line: bytes, label: str) -> None:
        """Write one whole line; the caller holds ``self.lock``. ``label`` names the record in errors."""
        self.write_lines_locked(line, 1, label)

    def write_lines_locked(self, data: bytes, count: int, label: str) -> None:
        """Write ``count`` whole lines joined in ``data`` with one ``os.write``; the caller holds
        ``self.lock``. Under ``"always"`` one fsync covers them all (a group commit)."""
        self.check_usable()
        try:
            written = os.write(self._fd, data)
        except OSError as exc:
            raise self._poison(f"writing {label} failed: {exc.strerror}") from exc
        if written != len(data):
            raise self._poison(
                f"short write of {label} ({written} of {len(data)} bytes): the file now ends with a partial line"
            )
        self._unsynced += count
        if self.fsync_policy == "always" or (
            self.fsync_policy == "batch" and self._unsynced >= self._batch_size
        ):
            self._sync_locked()

    def append_line(self, line: bytes, label: str = "a record") -> None:
        """Append one line (it must end with ``\\n`` and hold no other newline)."""
        _check_line(line)
        with self.lock:
            self.write_line_locked(line, label)

    def append_lines(self, lines: Sequence[bytes], label: str = "records") -> None:
        """Append several lines with one ``os.write`` (each as ``append_line`` requires)."""
        for line in lines:
            _check_line(line)
        with self.lock:
            self.write_lines_locked(b"".join(lines), len(lines), label)

    def sync(self) -> None:
        with self.lock:
            self.check_usable()
            if self._unsynced:
                self._sync_locked()

    def close(self) -> None:
        """Sync (unless ``"never"``) and release the file. Idempotent."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._broken is None and self._unsynced and self.fsync_policy != "never":
                    os.fsync(self._fd)
            finally:
                os.close(self._fd)

    def __enter__(self) -> AppendOnlyFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def check_usable(self) -> None:
        if self._closed:
            raise AppendOnlyError(f"{self.what} {self.path} is closed")
        if self._broken is not None:
            raise AppendOnlyError(f"{self.what} {self.path} is unusable after an earlier failure: {self._broken}")

    def _sync_locked(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise self._poison(f"fsync failed: {exc.strerror}") from exc
        self._unsynced = 0

    def _poison(self, reason: str) -> AppendOnlyError:
        self._broken = reason
        return AppendOnlyError(f"{self.what} {self.path}: {reason}; no further records will be written")
