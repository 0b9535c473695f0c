"""When the evidence files reach the disk: the recorder's ``fsync`` setting, kept apart from what it writes.

Invariant: a record is complete (``record_now`` returns None, or its awaitable
completes) only when the setting's promise holds for every file it was written
to: under ``"always"`` each is fsynced, under ``"batch"`` none holds
``BATCH_LIMIT`` lines unsynced; and once an fsync has failed no record is
complete again (every later one raises).

Theory of operation. Durability, the ``fsync`` setting (the files' own fsync is
off; the recorder fsyncs through descriptors of its own, always in worker
threads, so an fsync never stalls the event loop and other calls go on
meanwhile):

- ``"batch"`` (default): a background thread fsyncs a file at most
  ``BATCH_SECONDS`` (1 s) after the first line it holds unsynced, and at once
  when it holds ``BATCH_LINES`` (256) unsynced lines; nobody waits for those
  fsyncs. Should the disk fall behind, the records whose lines take a file to
  ``BATCH_LIMIT`` (1,024) unsynced lines complete only with that file's fsync
  (their answers wait for it). A power loss can lose at most the answered
  records of the last second, and never more than 1,023 lines per file
  (usually no more than the lines written during one fsync past the 256th).
- ``"always"``: records complete only once every file they were written to is
  fsynced. Records written together share one fsync (a group commit), so many
  calls in flight do not queue behind one fsync each.
- ``"never"``: no fsync; the kernel writes back when it likes.

A failed fsync makes every later record raise, as a failed write does.

``Durability`` is the recorder's base: it counts the lines written to each
file (0 trace, 1 surface, 2 truth), names the files due an fsync, runs the
background thread of ``"batch"`` and does the fsyncs; the recorder opens the
files and their sync descriptors, writes the lines and awaits what is due.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import anyio.to_thread

from drawbridge.state.append_only import AppendOnlyError, FsyncPolicy

logger = logging.getLogger("drawbridge.evidence")

BATCH_LINES = 256
"""Under ``fsync="batch"``, the unsynced lines at which a file's fsync starts at once (in the
background thread: no record waits for it)."""
BATCH_LIMIT = 1024
"""Under ``fsync="batch"``, the unsynced lines at which the records wait for the file's fsync: the
bound on what a power loss can take when the disk falls behind. Answers held for an fsync every few
dozen lines cost the gateway about a fifth of its throughput (bench/overhead.py)."""
BATCH_SECONDS = 1.0
"""Under ``fsync="batch"``, the longest a written line waits for its file's fsync."""
_SINKS_NEVER_SYNC_BY_THEMSELVES = 2**62


class Durability:
    """The fsyncs of the recorder's three files, as its ``fsync`` setting asks. See the module docstring."""

    def __init__(self, fsync: FsyncPolicy, batch_seconds: float, batch_lines: int, batch_limit: int) -> None:
        # Under "always" and "batch" the files never fsync by themselves (except when closed); the
        # recorder counts their lines and fsyncs through descriptors of its own, in worker threads.
        self._fsync = fsync
        self._sync_fds: list[int] = []
        self._sync_targets: list[tuple[Path, int, str] | None] = [None, None, None]
        self._unsynced = [0, 0, 0]  # trace, surface, truth
        self._unsynced_since: list[float | None] = [None, None, None]
        """``time.monotonic()`` of each file's oldest unsynced line (the fsync lag ``/metrics`` shows)."""
        self._unsynced_lock = threading.Lock()
        self._batch_seconds = batch_seconds
        self._batch_lines = batch_lines
        self._batch_limit = batch_limit
        self._wake = threading.Event()
        """Set when a file gets its first unsynced line: the time bound starts."""
        self._soon = threading.Event()
        """Set when a file reaches ``batch_lines`` unsynced lines (or on closing): fsync now."""
        self._stopping = threading.Event()
        self._syncer: threading.Thread | None = None
        self._broken: str | None = None

    @property
    def _managed(self) -> bool:
        """The recorder fsyncs the files itself ("always" and "batch")."""
        return self._fsync != "never"

    def _files_fsync(self) -> tuple[FsyncPolicy, int]:
        """The ``fsync`` and ``batch_size`` the files are opened with: "batch" for the files when
        the recorder manages their fsyncs, so they sync only when closed."""
        return ("batch" if self._managed else "never"), _SINKS_NEVER_SYNC_BY_THEMSELVES

    def _sync_through(self, sink: int, path: Path, fd: int, what: str) -> None:
        """fsync ``sink`` (the file at ``path``, named ``what`` in errors) through ``fd``, which is
        closed with the recorder."""
        self._sync_fds.append(fd)
        self._sync_targets[sink] = (path, fd, what)

    def _start_syncing(self) -> None:
        """Start the background fsyncs of "batch" (under the other settings, nothing)."""
        if self._fsync == "batch":
            self._syncer = threading.Thread(
                target=self._sync_periodically, name="drawbridge-evidence-sync", daemon=True
            )
            self._syncer.start()

    def _raise_if_broken(self) -> None:
        """A failed fsync makes every later record raise."""
        if self._broken is not None:
            raise AppendOnlyError(self._broken)

    def _count(self, sink: int, due: list[int], lines: int = 1) -> None:
        """Note ``lines`` written to ``sink``; add it to ``due`` when the setting says the records
        complete only once the file is fsynced (every time under "always", at ``batch_limit``
        unsynced lines under "batch"); under "batch", wake the background thread when the file
        gets its first unsynced line (the time bound) and when it reaches ``batch_lines``."""
        if self._fsync == "always":
            due.append(sink)
        elif self._fsync == "batch":
            with self._unsynced_lock:
                before = self._unsynced[sink]
                unsynced = before + lines
                if unsynced >= self._batch_limit:
                    unsynced = 0
                    due.append(sink)
                self._unsynced[sink] = unsynced
                if before == 0 and unsynced:
                    self._unsynced_since[sink] = time.monotonic()
                elif not unsynced:
                    self._unsynced_since[sink] = None
            if before == 0 and unsynced:
                self._wake.set()
            if before < self._batch_lines <= unsynced:
                self._soon.set()

    def _sync_periodically(self) -> None:
        """The background fsyncs of "batch": a file with unsynced lines is fsynced at most
        ``batch_seconds`` after the first of them was written, or as soon as it holds
        ``batch_lines`` of them (the worker thread of this recorder)."""
        while True:
            self._wake.wait()
            self._soon.wait(self._batch_seconds)
            if self._stopping.is_set():
                return
            self._wake.clear()
            self._soon.clear()
            with self._unsynced_lock:
                sinks = [sink for sink, count in enumerate(self._unsynced) if count]
                for sink in sinks:
                    self._unsynced[sink] = 0
                    self._unsynced_since[sink] = None
            for sink in sinks:
                try:
                    self._sync(sink)
                except AppendOnlyError as exc:
                    logger.error("%s", exc)
                    return

    def fsync_lag_seconds(self) -> float:
        """How long the oldest line not yet fsynced has waited (0 when every line is synced, or when
        the setting is ``always``: records complete only once synced)."""
        with self._unsynced_lock:
            oldest = [since for since in self._unsynced_since if since is not None]
        return max(time.monotonic() - min(oldest), 0.0) if oldest else 0.0

    def _sync(self, sink: int) -> None:
        """fsync one due file (in a worker thread). A failure makes every later record raise."""
        target = self._sync_targets[sink]
        assert target is not None
        path, fd, what = target
        try:
            os.fsync(fd)
        except OSError as exc:
            self._broken = f"{what} {path}: fsync failed: {exc.strerror}; no further records will be written"
            raise AppendOnlyError(self._broken) from exc

    async def _sync_off_loop(self, due: list[int]) -> None:
        """fsync the due files, each in a worker thread of its own: they are usually due together
        (every call writes one line to each), and the answer waits for the slowest, not the sum."""
        if len(due) == 1:
            await anyio.to_thread.run_sync(self._sync, due[0])
            return
        failures: list[BaseException] = []

        async def sync(sink: int) -> None:
            try:
                await anyio.to_thread.run_sync(self._sync, sink)
            except AppendOnlyError as exc:
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            for sink in due:
                tg.start_soon(sync, sink)
        if failures:
            raise failures[0]

    def _stop_syncing(self) -> None:
        """Stop the background thread (the files' own close then fsyncs what they hold unsynced)."""
        if self._syncer is not None:
            self._stopping.set()
            self._wake.set()
            self._soon.set()
            self._syncer.join()
            self._syncer = None

    def _close_sync_fds(self) -> None:
        for fd in self._sync_fds:
            os.close(fd)
        self._sync_fds = []


__all__ = ["BATCH_LIMIT", "BATCH_LINES", "BATCH_SECONDS", "Durability"]
