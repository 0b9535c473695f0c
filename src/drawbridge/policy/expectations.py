"""Tables of expected decisions (``drawbridge policy test``), read as strictly as a policy.

Invariant: a table reads only when it says exactly what it tests: a mapping of known keys
(``policy``, ``cases``), a non-empty ``cases`` list, and each case a mapping of known keys with
``agent`` and ``tool`` (non-empty strings), ``expect`` (one of the actions), ``arguments`` (a JSON
object, optional) and ``rule`` (an integer, optional). A mistyped key (``args:`` for ``arguments:``)
would otherwise test something else than it says and pass, so anything else raises ``TableError``,
located ``file:line: problem`` like a policy's load error. The text is read by ``strict_yaml``, the
reading policies get.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from drawbridge.policy.errors import PolicyLoadError
from drawbridge.policy.load import json_value, parse_yaml
from drawbridge.policy.model import Action
from drawbridge.policy.strict_yaml import item_line, key_line, node_line, value_line

TABLE_KEYS = ("policy", "cases")
CASE_KEYS = ("agent", "tool", "arguments", "expect", "rule")
_HINTS = {"args": "the call's arguments are written `arguments`", "expected": "write `expect`"}


class TableError(PolicyLoadError):
    """A table of expected decisions that cannot be read (``file:line: problem``)."""


@dataclass(frozen=True, slots=True)
class Case:
    """One expectation: ``agent`` calling ``tool`` with ``arguments`` gets ``expect`` (by ``rule``)."""

    agent: str
    tool: str
    expect: Action
    arguments: dict[str, Any] = field(default_factory=dict)
    rule: int | None = None
    line: int = 1


@dataclass(frozen=True, slots=True)
class Table:
    """``policy``: the path the table names, as written (relative to the table file), or None."""

    policy: str | None
    cases: tuple[Case, ...]


def _known_keys(node: CommentedMap, allowed: tuple[str, ...], what: str, file: str) -> None:
    for key in node:
        if not isinstance(key, str) or key not in allowed:
            hint = _HINTS.get(key) if isinstance(key, str) else None
            problem = f"unknown key {key!r} in {what} (allowed: {', '.join(allowed)})"
            problem += f"; {hint}" if hint else ""
            raise TableError(file, key_line(node, key), problem)


def _text(node: CommentedMap, key: str, what: str, file: str) -> str:
    if key not in node:
        raise TableError(file, node_line(node), f"{what} is missing required key `{key}`")
    value = node[key]
    if not isinstance(value, str) or not value:
        raise TableError(file, value_line(node, key), f"`{key}` in {what} must be a non-empty string")
    return str(value)


def _case(node: Any, number: int, line: int, file: str) -> Case:
    what = f"case {number}"
    if not isinstance(node, CommentedMap):
        raise TableError(file, line, f"{what} must be a mapping with agent, tool and expect")
    line = node_line(node, line)
    _known_keys(node, CASE_KEYS, what, file)
    agent, tool = _text(node, "agent", what, file), _text(node, "tool", what, file)
    expect_text = _text(node, "expect", what, file)
    try:
        expect = Action(expect_text)
    except ValueError:
        allowed = ", ".join(a.value for a in Action)
        problem = f"unknown action {expect_text!r} in `expect` (allowed: {allowed})"
        raise TableError(file, value_line(node, "expect"), problem) from None
    arguments: dict[str, Any] = {}
    if "arguments" in node:
        where = value_line(node, "arguments")
        try:  # a value no JSON holds (.nan, .inf, a non-string key) is the table's error, located
            value = json_value(node["arguments"], file, where)
        except TableError:
            raise
        except PolicyLoadError as exc:
            raise TableError(exc.file, exc.line, exc.problem) from None
        if not isinstance(value, dict):
            raise TableError(file, where, f"`arguments` in {what} must be an object (a mapping), as a call's are")
        arguments = value
    rule = None
    if "rule" in node:
        rule = node["rule"]
        if isinstance(rule, bool) or not isinstance(rule, int) or rule < 0:
            problem = f"`rule` in {what} must be a rule index (an integer from 0)"
            raise TableError(file, value_line(node, "rule"), problem)
        rule = int(rule)
    return Case(agent, tool, expect, arguments, rule, line)


def read_table(text: str, file: str) -> Table:
    """A table's text into its cases; ``TableError`` for anything it would not test as written."""
    try:
        root = parse_yaml(text, file)
    except PolicyLoadError as exc:
        raise TableError(exc.file, exc.line, exc.problem) from None
    if not isinstance(root, CommentedMap):
        raise TableError(file, node_line(root), "a table is a mapping with `policy` and a `cases` list")
    _known_keys(root, TABLE_KEYS, "the table", file)
    policy = None
    if "policy" in root:
        policy = root["policy"]
        if not isinstance(policy, str) or not policy:
            raise TableError(file, value_line(root, "policy"), "`policy` must be a path (a non-empty string)")
        policy = str(policy)
    cases = root.get("cases")
    where = value_line(root, "cases") if "cases" in root else node_line(root)
    if not isinstance(cases, CommentedSeq):
        raise TableError(file, where, "a table needs a `cases` list")
    if not cases:
        raise TableError(file, where, "`cases` is empty: a table that tests nothing would always pass")
    return Table(
        policy, tuple(_case(case, i, item_line(cases, i - 1, where), file) for i, case in enumerate(cases, start=1))
    )


__all__ = ["CASE_KEYS", "TABLE_KEYS", "Case", "Table", "TableError", "read_table"]
