"""The trace log on disk: an append-only NDJSON file holding one hash chain.

Invariant: this writer only ever appends whole entries to a log that verified
when it was opened, so the file is always a valid chain (or a valid chain plus
one cut-short last line, after a crash mid-write, which the next open refuses).
It never truncates, rewrites or starts a second chain on top of a file it cannot
verify. The entry format and the verifier live in ``drawbridge.evidence.chain``.

Theory of operation.

* Open. The file is opened with ``O_WRONLY | O_APPEND | O_CREAT`` (created with
  mode 0o600) and locked with an exclusive ``flock``: a second writer on the same
  file, in this process or another, is a startup error, because two writers would
  fork the chain. The existing content is then read and verified from the start
  (optionally against a checkpoint's ``expected_head``); the last entry becomes
  the head the next entry links to. A log that does not verify -- a changed byte,
  a missing entry, a partial last line -- raises ``TraceLogCorrupt`` naming the
  line, seq and problem. The remedy is a person's decision (keep the file as
  evidence, move it aside, start a new log), never the writer's.
* Append. ``append(kind, at, body)`` builds the next entry (pure core), renders
  it as one line and hands the line to a single ``os.write`` (``append_many``:
  several entries, chained in order, joined in one ``os.write``). With ``O_APPEND``
  the kernel places the whole write at the end of the file, so a concurrent
  reader sees whole lines or a partial last line, never an interleaving. A short
  or failed write, or a failed fsync, poisons the writer: every later append
  raises, because the state of the file is no longer known (after a failed fsync
  the kernel may have dropped the dirty pages). The caller fails closed.
* Durability (``fsync``):

  - ``"always"`` (default): ``os.fsync`` after every entry, before ``append``
    returns. A record the caller has been answered for survives a power loss.
  - ``"batch"``: ``os.fsync`` after every ``batch_size`` entries, on ``sync()``
    and on ``close()``. A power loss can lose up to ``batch_size - 1`` answered
    records (a process crash loses none: they are in the kernel already).
  - ``"never"``: no fsync at all; the kernel writes back when it likes. For
    tests and throwaway runs.

  When the file is created and the policy is not ``"never"``, its directory is
  fsynced too, so the new file's name survives a power loss.
* The tree. Beside the chain, the writer keeps the RFC 6962 Merkle tree over the lines (a
  ``CompactRange``, O(log n) hashes, rebuilt from the file when it is opened): ``tree_head()``
  is the size and root a signed checkpoint states (``drawbridge.evidence.tlog``). ``on_append``,
  when set, is told how many lines each write added (after they reached the kernel).
* Threads and asyncio. A ``threading.Lock`` covers build + write + fsync + head
  update, so entries from many threads form one chain in lock order. From async
  code call ``await log.append_async(...)``: it runs ``append`` in a worker thread
  through ``anyio.to_thread.run_sync``, because an fsync under ``"always"`` can
  take milliseconds and must not stall the event loop for every other call. The
  worker is not abandoned on cancellation, so a cancelled ``append_async`` may
  still have written its entry; the next entry links to it either way.

Scope: POSIX local filesystems (``flock``, ``O_APPEND`` atomicity). ``at`` is the
caller's clock and is not required to increase (clocks step back); order is
given by ``seq``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio.to_thread

from drawbridge.canonical import Canonical
from drawbridge.evidence.chain import ChainHead, build_entry, head_of, next_line, verify_chain
from drawbridge.evidence.merkle import CompactRange
from drawbridge.evidence.tlog import trace_leaf
from drawbridge.state.append_only import (
    FILE_MODE,
    FSYNC_POLICIES,
    AppendOnlyError,
    AppendOnlyFile,
    AppendOnlyLocked,
    FsyncPolicy,
)

__all__ = [
    "FILE_MODE",
    "FSYNC_POLICIES",
    "FsyncPolicy",
    "TraceLog",
    "TraceLogCorrupt",
    "TraceLogError",
    "TraceLogLocked",
]

TraceLogError = AppendOnlyError
"""The trace log cannot be opened or written. Callers must fail closed."""

TraceLogLocked = AppendOnlyLocked
"""Another writer holds the file."""


class TraceLogCorrupt(AppendOnlyError):
    """The existing file does not verify as a trace chain; the writer refuses to continue it."""


class TraceLog:
    """Append-only writer of one hash-chained trace file. See the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        fsync: FsyncPolicy = "always",
        *,
        batch_size: int = 64,
        expected_head: ChainHead | None = None,
        replica: str | None = None,
    ) -> None:
        self._file = AppendOnlyFile(path, fsync, batch_size=batch_size, what="trace log")
        self.replica = replica
        """A replica of several on one shared state: every entry's body names it (``replica``). A body
        given as ``Canonical`` bytes must already hold it (the recorder renders it in)."""
        self._tree = CompactRange()
        self.on_append: Callable[[int], None] | None = None
        try:
            self._head = self._recover(expected_head)
        except BaseException:
            self._file.close()
            raise

    def _recover(self, expected_head: ChainHead | None) -> ChainHead | None:
        path = self._file.path
        try:
            with open(path, "rb") as existing:
                report = verify_chain(self._leaves(existing), expected_head=expected_head)
        except OSError as exc:
            raise TraceLogError(f"cannot read trace log {path}: {exc.strerror}") from exc
        problem = report.first_problem
        if problem is not None:
            raise TraceLogCorrupt(
                f"trace log {path} does not verify, refusing to append to it: "
                f"{problem.code} at line {problem.line}: {problem.message} "
                f"({report.entries} entries verified before it)"
            )
        return report.head

    def _leaves(self, lines: Iterable[bytes]) -> Iterator[bytes]:
        """The lines, each whole one added to the tree as it passes."""
        tree = self._tree
        for line in lines:
            if line.endswith(b"\n"):
                tree.append(trace_leaf(line))
            yield line

    def tree_head(self) -> tuple[int, bytes]:
        """The number of lines written and the RFC 6962 root over them."""
        with self._file.lock:
            return self._tree.size, self._tree.root()

    def _appended(self, lines: Sequence[bytes]) -> None:
        for line in lines:
            self._tree.append(trace_leaf(line))
        if self.on_append is not None:
            self.on_append(len(lines))

    @property
    def _fd(self) -> int:
        return self._file._fd

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def fsync_policy(self) -> FsyncPolicy:
        return self._file.fsync_policy

    @property
    def head(self) -> ChainHead | None:
        """The last entry written (None for an empty log)."""
        with self._file.lock:
            return self._head

    def append(self, kind: str, at: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Append the next entry and return it; durable on return under ``fsync="always"``.

        A malformed kind/at/body raises ``ChainFormatError`` (a ValueError) and writes nothing.
        """
        with self._file.lock:
            self._file.check_usable()
            entry, line = build_entry(self._head, kind, at, self._named(body))
            self._file.write_line_locked(line, f"entry seq {entry['seq']}")
            self._head = head_of(entry)
            self._appended((line,))
            return entry

    def append_many(
        self, items: Sequence[tuple[str, str, Mapping[str, Any] | Canonical]]
    ) -> ChainHead | None:
        """Append several entries, chained in order, with one write (and, under ``"always"``, one
        fsync); return the new head. All or none of them become the head's ancestors, as the write
        succeeds or not. A body may come as ``Canonical`` bytes (``chain.next_line``)."""
        with self._file.lock:
            self._file.check_usable()
            head = self._head
            lines = []
            for kind, at, body in items:
                head, line = next_line(head, kind, at, self._named(body))
                lines.append(line)
            if lines:
                assert head is not None
                label = f"entries seq {head.seq - len(lines) + 1}..{head.seq}"
                self._file.write_lines_locked(b"".join(lines), len(lines), label)
                self._head = head
                self._appended(lines)
            return self._head

    def _named(self, body: Mapping[str, Any] | Canonical) -> Mapping[str, Any] | Canonical:
        replica = self.replica
        if replica is None or type(body) is Canonical or "replica" in body:
            return body
        return {**body, "replica": replica}

    async def append_async(self, kind: str, at: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``append`` from async code, in a worker thread so that fsync never blocks the event loop."""
        return await anyio.to_thread.run_sync(functools.partial(self.append, kind, at, body))

    def sync(self) -> None:
        """Force written entries to disk now (what ``"batch"`` does every ``batch_size`` entries)."""
        self._file.sync()

    def close(self) -> None:
        """Sync (unless ``"never"``) and release the file. Idempotent."""
        self._file.close()

    def __enter__(self) -> TraceLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
