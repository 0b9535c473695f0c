"""Where signed checkpoints are kept beside the trace: the latest one, and every one in order.

Invariant: ``checkpoints.ndjson`` only grows, one whole line per checkpoint, in the order they were
signed; ``checkpoint`` is always one whole signed note (replaced atomically: a reader sees the old
note or the new one, never a mixture), the latest line of ``checkpoints.ndjson`` (or, after a crash
between the two writes, one line ahead of it: ``checkpoint`` is written first). Both reach the disk
before ``write`` returns, after the trace lines they cover (the caller syncs the trace first), so a
power loss never leaves a checkpoint that signs lines the trace lost.

Line format of ``checkpoints.ndjson``: ``{"tree_size":N,"note":"<signed note>"}`` (values in RFC 8785
form, fields in this order); ``tree_size`` is the size the note signs, and the lines come in
increasing size (``trace_audit`` checks both: the line's own field is not signed).

The origin a log was signed under (``log_origins``) is read from the latest checkpoint's first line
and from the trace's ``run_start`` entries: a gateway refuses keys of another origin, and keys whose
key hash is not the one that signed the latest checkpoint (``latest_note``).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from drawbridge.canonical import CanonicalizationError, canonical_bytes, parse_json
from drawbridge.evidence.runs import origins_of
from drawbridge.state.append_only import AppendOnlyFile

CHECKPOINT_FILE: Final = "checkpoint"
CHECKPOINTS_FILE: Final = "checkpoints.ndjson"


class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be read as written; the message names the file and line."""


def checkpoint_line(tree_size: int, note: str) -> bytes:
    return b'{"tree_size":' + str(tree_size).encode() + b',"note":' + canonical_bytes(note) + b"}\n"


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Put ``data`` at ``path`` whole: a temporary file, fsynced, renamed over it."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    if durable:
        _fsync_directory(path.parent)


class CheckpointFiles:
    """The writer of ``checkpoint`` and ``checkpoints.ndjson`` in one directory."""

    def __init__(self, directory: str | os.PathLike[str], *, durable: bool = True) -> None:
        self.directory = Path(directory)
        self._durable = durable
        self._log = AppendOnlyFile(
            self.directory / CHECKPOINTS_FILE, "always" if durable else "never", what="checkpoint log"
        )

    def write(self, tree_size: int, note: str) -> None:
        """``checkpoint`` first, then its history line: a crash between the two leaves the latest ahead of
        the history, never behind it (``trace_audit`` fails a history line larger than ``checkpoint``, or
        a history without it, as a latest checkpoint rolled back or deleted)."""
        replace_file(self.directory / CHECKPOINT_FILE, note.encode("utf-8"), durable=self._durable)
        self._log.append_line(checkpoint_line(tree_size, note), f"the checkpoint of size {tree_size}")

    def close(self) -> None:
        self._log.close()


@dataclass(frozen=True)
class StoredCheckpoint:
    line: int
    tree_size: int
    note: str


def parse_checkpoint_lines(data: bytes, label: str) -> list[StoredCheckpoint]:
    """The lines of a ``checkpoints.ndjson``; a line of another shape is an error naming it."""
    out: list[StoredCheckpoint] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line:
            continue
        try:
            value = parse_json(line)
        except CanonicalizationError:
            raise CheckpointFileError(f"{label} line {number} is not JSON") from None
        if (
            not isinstance(value, dict)
            or set(value) != {"tree_size", "note"}
            or not isinstance(value["tree_size"], int)
            or isinstance(value["tree_size"], bool)
            or not isinstance(value["note"], str)
        ):
            raise CheckpointFileError(f'{label} line {number} is not {{"tree_size": N, "note": "..."}}')
        out.append(StoredCheckpoint(number, value["tree_size"], value["note"]))
    return out


def latest_note(directory: str | os.PathLike[str]) -> bytes:
    """The latest signed checkpoint of the log in ``directory`` as written (empty when there is none)."""
    try:
        return (Path(directory) / CHECKPOINT_FILE).read_bytes()
    except FileNotFoundError:
        return b""


def log_origins(note: bytes, trace_path: str | os.PathLike[str]) -> list[str]:
    """The origins a log was signed under: its latest checkpoint's (``note``'s first line, as written;
    the signature is the verifier's business) and those its trace's runs name."""
    origins: list[str] = []
    first = note.split(b"\n", 1)[0].decode("utf-8", "replace")
    if first:
        origins.append(first)
    try:
        with open(trace_path, "rb") as trace:
            origins += [origin for origin in origins_of(trace) if origin not in origins]
    except FileNotFoundError:
        pass
    return origins


__all__ = [
    "CHECKPOINTS_FILE",
    "CHECKPOINT_FILE",
    "CheckpointFileError",
    "CheckpointFiles",
    "StoredCheckpoint",
    "checkpoint_line",
    "latest_note",
    "log_origins",
    "parse_checkpoint_lines",
    "replace_file",
]
