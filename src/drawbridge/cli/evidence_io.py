"""How the ``drawbridge evidence`` commands read their inputs and end: the exit codes of ``output``.

Invariant: an input that cannot be read or parsed ends the command with exit code 2 and a message
on stderr naming the file (and line or field), never a raw value from it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from drawbridge.canonical import CanonicalizationError, parse_json
from drawbridge.cli.output import EXIT_FAILED, EXIT_OK, InputError
from drawbridge.evidence.classify import record_text


def _label(path: str) -> str:
    return "standard input" if path == "-" else path


def read_bytes(path: str) -> bytes:
    """The bytes of a file (``-``: standard input); unreadable -> exit 2."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


def write_out(path: str, data: bytes) -> None:
    """Write ``--out FILE``; a path that cannot be written (a directory, a missing parent, a parent
    that is a file, no permission) -> exit 2 naming the path and why."""
    try:
        Path(path).write_bytes(data)
    except IsADirectoryError:
        raise InputError(f"{record_text(path)}: is a directory, expected a file to write") from None
    except OSError as exc:
        raise InputError(f"{record_text(path)}: cannot write: {exc.strerror}") from None


def parse_document(data: bytes, label: str) -> Any:
    """One JSON document; invalid -> exit 2 with the parser's position (never the content)."""
    try:
        return parse_json(data)
    except CanonicalizationError as exc:
        raise InputError(f"{label}: {exc}") from None


AUDIT_IMPORT_FORMAT = ("an audit import is an assay.provider_audit_record.v0 file in strict JSON (UTF-8 without a "
                       "byte order mark, each key once, nesting at most 64 levels): Assay reads no other")


def audit_import_files(paths: Sequence[str]) -> tuple[list[Path], list[dict[str, str]]]:
    """The files ``--audit-import PATH...`` names, and the entries of its directories that are not read.

    A file is taken as given; a directory gives its ``*.json`` regular files in name order (what Assay
    reads), and each other entry is listed as skipped, by name, so that an import that reads nothing
    says why. A file named twice (the same path, or a file and its directory) is one import."""
    files: list[Path] = []
    skipped: list[dict[str, str]] = []
    seen: set[str] = set()

    def take(file: Path) -> None:
        key = os.path.realpath(file)
        if key not in seen:
            seen.add(key)
            files.append(file)

    for path in paths:
        target = Path(path)
        if not target.is_dir():
            if not target.exists():
                raise InputError(f"{record_text(path)}: no such file or directory")
            take(target)
            continue
        try:
            entries = sorted(target.iterdir(), key=lambda entry: entry.name)
        except OSError as exc:
            raise InputError(f"{record_text(path)}: cannot list directory: {exc.strerror}") from None
        for entry in entries:
            if not entry.name.endswith(".json"):
                skipped.append({"source": record_text(str(entry)), "reason": "not a *.json file: not read"})
            elif not entry.is_file():
                skipped.append({"source": record_text(str(entry)), "reason": "not a regular file: not read"})
            else:
                take(entry)
    return files, skipped


def _finish(ok: bool) -> NoReturn:
    click.get_current_context().exit(EXIT_OK if ok else EXIT_FAILED)


__all__ = ["AUDIT_IMPORT_FORMAT", "_finish", "_label", "audit_import_files", "parse_document", "read_bytes", "write_out"]
