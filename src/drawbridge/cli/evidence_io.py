"""How the ``drawbridge evidence`` commands read their inputs and end: the exit codes of ``output``.

Invariant: an input that cannot be read or parsed ends the command with exit code 2 and a message
on stderr naming the file (and line or field), never a raw value from it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from drawbridge.canonical import CanonicalizationError, parse_json
from drawbridge.cli.output import EXIT_FAILED, EXIT_OK, InputError


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


def parse_document(data: bytes, label: str) -> Any:
    """One JSON document; invalid -> exit 2 with the parser's position (never the content)."""
    try:
        return parse_json(data)
    except CanonicalizationError as exc:
        raise InputError(f"{label}: {exc}") from None


def _finish(ok: bool) -> NoReturn:
    click.get_current_context().exit(EXIT_OK if ok else EXIT_FAILED)


__all__ = ["_finish", "_label", "parse_document", "read_bytes"]
