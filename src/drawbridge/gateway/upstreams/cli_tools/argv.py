"""The argument vector of a CLI call, built from its decided arguments, or a refusal saying why.

Invariant: no shell ever reads what an agent sent, and what a program reads is only what the call's
arguments state. The vector is ``[bin, subcommand?, *args, *flags]`` handed to ``exec`` as it is.
Refused, before anything runs: an argument, a flag name or value, or a subcommand holding a shell
metacharacter (``METACHARACTERS``: a program that passes its arguments on to a shell must not receive
them); a subcommand that is not one plain word (``-c``, ``--exec-path=`` are options, not
subcommands); with ``allowed_args``, any element that starts with ``-`` and is not an allowed flag
(compared without its ``=value``), whether it came as an argument, a flag or a flag's value.
Positional arguments are always allowed. ``stdin`` is data piped to the program, not an argument,
and is not checked for metacharacters.

``flags`` (an object) become ``-k value`` for one-letter keys and ``--key value`` otherwise, in the
order of their names (so a call always means one vector); ``true`` is the flag alone, ``false`` and
``null`` leave it out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

METACHARACTERS: Final = (";", "&", "|", "`", "$(", "${", ">", "<", "\n", "\r", "\x00")
SUBCOMMAND: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*")
FLAG_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ArgvRefused(ValueError):
    """The call's arguments cannot be run as they are (the message says which and why, not the value)."""


@dataclass(frozen=True, slots=True)
class Invocation:
    argv: tuple[str, ...]
    stdin: bytes | None


def _metacharacter(text: str) -> str | None:
    for token in METACHARACTERS:
        if token in text:
            return {"\n": "a line break", "\r": "a carriage return", "\x00": "a NUL character"}.get(token, repr(token))
    return None


def _check(text: str, what: str) -> None:
    found = _metacharacter(text)
    if found is not None:
        raise ArgvRefused(f"{what} holds the shell metacharacter {found}, which is refused")


def _flag_args(flags: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key in sorted(flags):
        value = flags[key]
        if not FLAG_NAME.fullmatch(key):
            raise ArgvRefused(f"flag name {key[:40]!r} is not a plain name (letters, digits, _ . -)")
        flag = f"-{key}" if len(key) == 1 else f"--{key}"
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (str, int, float)):
            out.extend((flag, str(value)))
        else:
            raise ArgvRefused(f"flag {flag}: a value is a string, a number or a boolean")
    return out


def build_invocation(
    binary: str,
    subcommand: str | None,
    arguments: Mapping[str, Any],
    allowed_args: Sequence[str] | None,
) -> Invocation:
    """The vector and the stdin of a call (module docstring); raises ``ArgvRefused``."""
    args = arguments.get("args", [])
    flags = arguments.get("flags", {})
    stdin = arguments.get("stdin")
    if args is None:
        args = []
    if flags is None:
        flags = {}
    if not isinstance(args, list) or not all(isinstance(item, str) for item in args):
        raise ArgvRefused("args must be a list of strings")
    if not isinstance(flags, Mapping):
        raise ArgvRefused("flags must be an object")
    if stdin is not None and not isinstance(stdin, str):
        raise ArgvRefused("stdin must be a string")
    vector: list[str] = []
    if subcommand is not None:
        _check(subcommand, "the subcommand")
        if not SUBCOMMAND.fullmatch(subcommand):
            raise ArgvRefused("the subcommand must be one plain word, not an option or a path")
        vector.append(subcommand)
    for index, item in enumerate(args):
        _check(item, f"args[{index}]")
    vector.extend(args)
    flag_args = _flag_args(flags)
    for item in flag_args:
        _check(item, "a flag")
    vector.extend(flag_args)
    if allowed_args is not None:
        allowed = set(allowed_args)
        start = 1 if subcommand is not None else 0
        for item in vector[start:]:
            if item.startswith("-") and item.split("=", 1)[0] not in allowed:
                shown = item.split("=", 1)[0][:40]
                listed = ", ".join(allowed_args) if allowed_args else "none"
                raise ArgvRefused(f"the flag {shown} is not allowed here (allowed_args: {listed})")
    return Invocation((binary, *vector), stdin.encode("utf-8") if stdin is not None else None)


__all__ = ["METACHARACTERS", "ArgvRefused", "Invocation", "build_invocation"]
