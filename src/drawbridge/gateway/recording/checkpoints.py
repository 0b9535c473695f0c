"""Signed checkpoints of the trace, while the gateway runs: every N lines or T seconds, at the end of a
run, and on request.

Invariant: a checkpoint is signed only over lines the trace has written, and it reaches the disk only
after they did (the trace is fsynced first, unless the ``fsync`` setting is "never"); checkpoints are
signed in the order of their sizes, so every one is a prefix of the next and the log never signs two
inconsistent trees. A run is opened with a ``run_start`` entry and sealed at a clean shutdown by a
``run_end`` entry and a checkpoint that covers it (``drawbridge.evidence.runs``).

Theory of operation. The trace log tells the ``Checkpointer`` how many lines each write added
(``TraceLog.on_append``, on whichever thread wrote them: it only counts and wakes). A thread of its
own signs when ``every_lines`` lines are waiting, and at most ``every_seconds`` after a line was
written; ``checkpoint_now`` signs at once (the control plane's ``GET /evidence/checkpoint``, the end of
a run). Signing takes the tree head from the trace log (``tree_head``), signs it with the checkpoint
key (Ed25519, about 0.1 ms) and writes it through ``CheckpointFiles``. ``published`` callbacks see
every new checkpoint (telemetry sends it off the machine). A checkpoint that cannot be written is
logged and retried at the next turn; the calls are not held for it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from drawbridge.evidence.runs import RUN_END, RUN_START, run_end_body, run_start_body
from drawbridge.evidence.tlog import Checkpoint, sign_checkpoint
from drawbridge.gateway.recording.cadence import EVERY_LINES as EVERY_LINES
from drawbridge.gateway.recording.cadence import EVERY_SECONDS as EVERY_SECONDS
from drawbridge.state.append_only import AppendOnlyError
from drawbridge.state.checkpoint_files import CheckpointFiles
from drawbridge.state.signing_keys import EvidenceKeys
from drawbridge.state.trace_log import TraceLog

logger = logging.getLogger("drawbridge.evidence")



@dataclass(frozen=True)
class CheckpointSettings:
    every_lines: int = EVERY_LINES
    every_seconds: float = EVERY_SECONDS

    def __post_init__(self) -> None:
        if self.every_lines < 1 or not self.every_seconds > 0:
            raise ValueError("checkpoints come every >= 1 lines and every > 0 seconds")


Published = Callable[[int, str], None]


class Checkpointer:
    """Signs the trace's tree head (module docstring)."""

    def __init__(
        self,
        trace: TraceLog,
        keys: EvidenceKeys,
        files: CheckpointFiles,
        settings: CheckpointSettings = CheckpointSettings(),
        *,
        durable: bool = True,
        clock: Callable[[], str],
    ) -> None:
        self._trace = trace
        self._keys = keys
        self._files = files
        self._settings = settings
        self._durable = durable
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting = 0
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._signed_size = -1
        self._latest: str | None = None
        self.published: list[Published] = []
        self._run: tuple[str, int] | None = None
        # The trace is fsynced through a descriptor of its own, outside the trace log's lock, so that the
        # calls' writes never wait for a checkpoint's fsync.
        self._sync_fd = os.open(trace.path, os.O_RDONLY | os.O_CLOEXEC) if durable else None
        trace.on_append = self._lines_written
        self._thread = threading.Thread(target=self._run_periodically, name="drawbridge-checkpoints", daemon=True)
        self._thread.start()

    @property
    def origin(self) -> str:
        return self._keys.origin

    @property
    def latest(self) -> str | None:
        """The latest signed note (None before the first)."""
        return self._latest

    def _lines_written(self, count: int) -> None:
        self._waiting += count
        if self._waiting >= self._settings.every_lines:
            self._due.set()

    def _run_periodically(self) -> None:
        while not self._stopping.is_set():
            self._due.wait(self._settings.every_seconds)
            if self._stopping.is_set():
                return
            self._due.clear()
            try:
                self.checkpoint_now()
            except (AppendOnlyError, OSError) as exc:
                logger.error("signing a trace checkpoint failed (%s); retrying later", exc)

    def checkpoint_now(self) -> str | None:
        """Sign the trace as it stands, unless the latest checkpoint already covers it; the latest note."""
        with self._lock:
            size, root = self._trace.tree_head()
            if size == self._signed_size or (size == 0 and self._latest is None):
                return self._latest
            self._waiting = 0
            if self._sync_fd is not None:
                os.fsync(self._sync_fd)
            note = sign_checkpoint(Checkpoint(self._keys.origin, size, root), self._keys.checkpoint)
            self._files.write(size, note)
            self._signed_size, self._latest = size, note
        for published in self.published:
            try:
                published(size, note)
            except Exception as exc:  # noqa: BLE001 -- sending a copy off the machine never stops the signing
                logger.error("publishing a checkpoint failed (%s)", type(exc).__name__)
        return note

    def begin_run(self, run_id: str, producer: dict[str, str], replica: str | None = None) -> None:
        """Write the run's ``run_start`` entry (what every later entry of this process belongs to)."""
        body = run_start_body(run_id, self._keys.origin, producer, replica)
        entry = self._trace.append(RUN_START, self._clock(), body)
        self._run = (run_id, entry["seq"])

    def end_run(self) -> str | None:
        """Seal the run: its ``run_end`` entry, then a checkpoint covering it. None when it cannot be
        written (the run then stays incomplete, as a crash would leave it)."""
        if self._run is None:
            return None
        run_id, start = self._run
        self._run = None
        try:
            self._trace.append(RUN_END, self._clock(), run_end_body(run_id, start))
            return self.checkpoint_now()
        except (AppendOnlyError, OSError) as exc:
            logger.error("the run could not be sealed (%s); it stays incomplete", exc)
            return None

    def close(self) -> None:
        """Stop signing (the run is sealed by ``end_run`` first) and close the checkpoint log."""
        self._stopping.set()
        self._due.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        if self._trace.on_append == self._lines_written:
            self._trace.on_append = None
        self._files.close()
        if self._sync_fd is not None:
            os.close(self._sync_fd)
            self._sync_fd = None


def evidence_producer() -> dict[str, str]:
    from drawbridge import __version__

    return {"name": "drawbridge", "version": __version__}


def new_run_id(clock: Callable[[], str]) -> str:
    """``run-<UTC time, digits only>-<8 hex>``: unique, sortable, and an Assay ``run_id`` (no ``:``)."""
    digits = "".join(char for char in clock()[:19] if char.isdigit())
    return f"run-{digits}-{os.urandom(4).hex()}"


__all__ = ["EVERY_LINES", "EVERY_SECONDS", "CheckpointSettings", "Checkpointer", "evidence_producer", "new_run_id"]
