"""The one error every stage of reading an Assay-format policy ends in: ``AssayPolicyError``.

It lives apart from the stages -- ``assay_yaml`` (text to a JSON value), ``assay_fields`` (the
value checked against the format's field types) and ``assay_policy`` (the two readings) -- so that
each raises it, located by line, column and field path, without importing the others.
"""

from __future__ import annotations

import re

__all__ = ["AssayPolicyError", "Path"]

Path = tuple[str | int, ...]
"""Where a value sits in the policy: the keys and list indexes from the root."""


class AssayPolicyError(ValueError):
    """An Assay-format policy that cannot be read; the gateway refuses to start on it.

    ``kind`` is one of ``syntax`` (not YAML/JSON), ``root_not_mapping``,
    ``structure`` (a field of the wrong type or shape), ``validation`` (the
    file reading's load-time checks) or ``deprecated`` (a v1 policy when
    deprecations are denied). ``line``/``column`` are 1-based when known. The
    message names the field and the type found, never a value from the policy.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        path: Path = (),
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.kind = kind
        self.path = path
        self.line = line
        self.column = column
        self.message = message
        where = []
        if line is not None:
            where.append(f"line {line}" + (f", column {column}" if column is not None else ""))
        if path:
            where.append(_format_path(path))
        super().__init__(": ".join([*where, message]))


def _format_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += ("." if out else "") + part
        else:
            out += "[" + repr(part) + "]"
    return out
