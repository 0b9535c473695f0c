"""Reading the configuration's YAML: typed, located access to its mappings (``config`` uses it).

Invariant: every value read through a ``Reader`` has the type asked for, and every problem is a
``ConfigError`` located as ``file:line``; a key a section does not know is an error, never ignored.
A key written without a value (``pin_tools:``, ``telemetry: null``) is an error too, not the
default: read as "off" it would quietly turn a feature the file names off. No message repeats what was
written where an environment variable's name goes, once it is refused (``env_name_problem``): it may
be the secret itself, written in place of its variable's name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What the configuration accepts as an environment variable's name."""

AGENT_ID = re.compile(r"[A-Za-z0-9._:@/-]+")
"""Every agent id: the configuration's (a token's agent, the anonymous agent, an OAuth mapping),
``--agent`` of serve and wrap, and so every id the logs, the trace and the policies carry."""

AGENT_ID_CHARS = "[A-Za-z0-9._:@/-]"

AGENT_GLOB = re.compile(r"[A-Za-z0-9._:@/*?\[\]^\\-]+")
"""A glob over agent ids (a grant's agent, ``policy set``'s): the characters of an agent id and the glob
metacharacters only; a space, a line break or an escape character could match no agent."""


_KIND_NAMES: dict[type, str] = {
    str: "a string", int: "an integer", float: "a number", bool: "true or false",
    CommentedSeq: "a list", list: "a list", CommentedMap: "a mapping", dict: "a mapping",
}
"""What a message calls each type a key may be asked for (never ruamel's class names)."""


class ConfigError(ValueError):
    """A configuration problem, located as ``file:line: problem``."""

    def __init__(self, file: str, line: int | None, problem: str) -> None:
        self.file, self.line, self.problem = file, line, problem
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {problem}")


def line_of(node: Any, key: Any = None) -> int | None:
    try:
        if key is not None and isinstance(node, CommentedMap):
            return int(node.lc.key(key)[0]) + 1
        return int(node.lc.line) + 1
    except Exception:  # noqa: BLE001 -- plain values carry no position
        return None


def item_line(seq: Any, index: int) -> int | None:
    """The line of a list's entry: a plain value (a string, a number) carries no position of its own,
    but the list knows where each of its entries is."""
    try:
        return int(seq.lc.item(index)[0]) + 1
    except Exception:  # noqa: BLE001 -- a list not read from YAML carries no positions
        return line_of(seq)


class Reader:
    """Typed field access on a mapping node that remembers what was read."""

    def __init__(self, file: str, node: Any, where: str, *, line: int | None = None) -> None:
        """``line``: where the node is, when it may be a plain value that carries no position (a list's
        entry: ``item_line``; a key's value: the key's line), so that "must be a mapping" is located."""
        if not isinstance(node, CommentedMap):
            raise ConfigError(file, line_of(node) or line, f"{where} must be a mapping")
        self.file, self.node, self.where = file, node, where

    def fail(self, key: str | None, problem: str) -> ConfigError:
        return ConfigError(self.file, line_of(self.node, key) if key else line_of(self.node), problem)

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.node:
            if not isinstance(key, str) or key not in allowed:
                raise self.fail(
                    key if isinstance(key, str) else None,
                    f"unknown key {key!r} in {self.where} (allowed: {', '.join(sorted(allowed))})",
                )

    def null(self, key: str) -> ConfigError:
        """A key present with no value (YAML ``key:`` or ``null``)."""
        where = f"{self.where}.{key}" if self.where != "config" else key
        return self.fail(key, f"{where} has no value (null); give it one or remove the key")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False) -> Any:
        if key in self.node and self.node[key] is None:
            raise self.null(key)
        if key not in self.node:
            if required:
                raise self.fail(None, f"{self.where}: missing required key {key!r}")
            return default
        value = self.node[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind in (int, float):
            raise self.fail(key, f"{self.where}.{key} must be a number, not a boolean")
        if not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            names = dict.fromkeys(_KIND_NAMES.get(k, k.__name__) for k in kinds)
            raise self.fail(key, f"{self.where}.{key} must be {' or '.join(names)}")
        return value

    def child(self, key: str) -> Reader | None:
        if key not in self.node:
            return None
        if self.node[key] is None:
            raise self.null(key)
        where = f"{self.where}.{key}" if self.where != "config" else key
        return Reader(self.file, self.node[key], where, line=line_of(self.node, key))


def url_problem(url: str) -> str | None:
    """Why a URL cannot be connected to (an unclosed IPv6 bracket, a port that is not a number, no
    host), found when the configuration is read rather than at every attempt; None when it can."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    return None if host else "names no host"


def str_list(reader: Reader, key: str) -> tuple[str, ...]:
    value = reader.get(key, object, default=[])
    if not isinstance(value, (CommentedSeq, list)) or not all(isinstance(item, str) for item in value):
        raise reader.fail(key, f"{reader.where}.{key} must be a list of strings")
    return tuple(value)


def str_map(reader: Reader, key: str) -> dict[str, str]:
    sub = reader.child(key)
    if sub is None:
        return {}
    out: dict[str, str] = {}
    for name, value in sub.node.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise sub.fail(name if isinstance(name, str) else None, f"{sub.where} must map strings to strings")
        out[name] = value
    return out


def env_name_problem(name: str, subject: str, holds: str) -> str | None:
    """Why ``name`` cannot name the environment variable that holds ``holds`` (None: it can), in words
    that never repeat it: what was written where a variable's name goes may be the secret itself (a
    token, a URL, a header's value), so the sentence is about ``subject``, the place it was given."""
    if ENV_NAME.fullmatch(name):
        return None
    return (
        f"{subject} is not an environment variable name (letters, digits and _, not starting with a digit): "
        f"it names the variable that holds {holds}, never {holds} itself"
    )


def env_map(reader: Reader, key: str) -> dict[str, str]:
    """An ``env`` a child process is started with: refused here, at load, what ``exec`` cannot carry (a
    name that is empty or holds ``=`` or NUL, a value that holds NUL), which would otherwise fail every
    call. A message names a valid variable, never its value (it may be a secret), nor a name refused."""
    env = str_map(reader, key)
    sub = reader.child(key)
    for name, value in env.items():
        assert sub is not None  # a non-empty map came from this section
        if not name or "=" in name or "\x00" in name:
            raise sub.fail(  # never the name: one holding '=' may be NAME=value, a secret
                name or None,
                f"{sub.where}: a name given is not an environment variable name (empty, or holds '=' or NUL)",
            )
        if "\x00" in value:
            raise sub.fail(
                name, f"{sub.where}.{name}: the value holds a NUL character, which an environment cannot carry"
            )
    return env


def resolve_path(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else (base / path))


NAME_RE = re.compile(r"[A-Za-z0-9_-]+")


def named_entry(
    file: str, node: Any, section: str, index: int, keys: set[str], line: int | None = None
) -> tuple[Reader, str]:
    """One entry of an upstream list: its reader (unknown keys refused) and its ``name``, which prefixes
    tool names and so must match ``[A-Za-z0-9_-]+``."""
    reader = Reader(file, node, f"{section}[{index}]", line=line)
    reader.check_keys(keys)
    name = reader.get("name", str, required=True)
    if not NAME_RE.fullmatch(name):
        raise reader.fail("name", f"{section}[{index}].name {name!r} must match [A-Za-z0-9_-]+ (it prefixes tool names)")
    return reader, name


__all__ = [
    "AGENT_GLOB", "AGENT_ID", "AGENT_ID_CHARS", "NAME_RE", "ConfigError", "Reader", "env_name_problem", "item_line",
    "line_of", "named_entry", "resolve_path", "str_list", "str_map",
]
