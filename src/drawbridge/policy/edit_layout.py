"""Where the rules of a policy file stand in its text: the layout a per-tool edit splices (pure).

Invariant: a layout is read only from a text that agrees with the ``Policy`` loaded from it (as
many rules, each on the line the loader recorded), written in block style with LF or CRLF line
breaks; any other text raises ``UnsupportedLayout`` (the edit is refused), never a guess.

Theory of operation. ``read_layout`` parses the text again with ruamel (``parse_yaml``), which
keeps the position of every key and item, and reads from the lines around those positions what a
text edit needs. For the list: the ``rules:`` key and, when the list is empty, its ``[]``. For each
rule: the line and column of its ``-`` (on the rule's first line, or alone on a line above it), the
column of its keys, its last line (the comment lines right below it that are indented deeper than
its ``-`` are its own), the console header right above its ``-`` (``# set from console, <date> by
<by>``: the mark of a rule the console wrote), the first of the comment lines attached above it
(no deeper than its ``-``: they stay with it when a rule is inserted before it) and the span of
its action word when that is written as a plain word. The list ends at the next key of the root
mapping or a document marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from drawbridge.policy.load import PolicyLoadError, parse_yaml
from drawbridge.policy.model import Policy

CONSOLE_HEADER_PREFIX: Final = "# set from console, "


def console_header(date: str, by: str) -> str:
    return f"{CONSOLE_HEADER_PREFIX}{date} by {by}"


def is_console_header(line: str) -> bool:
    return line.strip().startswith(CONSOLE_HEADER_PREFIX)


class UnsupportedLayout(Exception):
    """The file's layout is outside what the text edit handles."""


@dataclass(slots=True)
class RuleItem:
    """Where one rule of the ``rules`` block sequence sits (0-based lines)."""

    dash_line: int
    dash_col: int
    key_col: int
    content_line: int
    last_line: int
    header_line: int | None
    attach_start: int
    action_span: tuple[int, int, int] | None


@dataclass(slots=True)
class Layout:
    """Where the parts of the file that an edit touches sit (0-based lines; ``ends`` holds each
    line's own line ending, "" for a last line without one)."""

    lines: list[str]
    ends: list[str]
    newline: str
    rules_key_line: int
    rules_key_col: int
    empty_flow: tuple[int, int, int] | None  # (line, start, end) of the `[]` of an empty list
    items: list[RuleItem]


_ACTION_TOKEN = re.compile(r"""(?P<q>["']?)(?P<word>allow|deny|human_approval)(?P=q)(?![\w-])""")
_EMPTY_FLOW = re.compile(r"\[[ \t]*\]")
RULES_KEY = re.compile(r"""(?:rules|"rules"|'rules')[ \t]*:""")


def _split(text: str) -> tuple[list[str], list[str], str]:
    for odd in ("\x85", "\u2028", "\u2029"):
        if odd in text:
            raise UnsupportedLayout("the file uses a line break other than LF or CRLF")
    lines: list[str] = []
    ends: list[str] = []
    parts = text.split("\n")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if last and part == "":
            break
        end = "" if last else "\n"
        if end and part.endswith("\r"):
            part, end = part[:-1], "\r\n"
        if "\r" in part:
            raise UnsupportedLayout("the file holds a carriage return that is not part of a CRLF line ending")
        lines.append(part)
        ends.append(end)
    newline = "\r\n" if "\r\n" in ends else "\n"
    return lines, ends, newline


def _is_blank(line: str) -> bool:
    return line.strip() == ""


def _is_comment(line: str) -> bool:
    return line.strip().startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _find_dash(lines: list[str], line: int, col: int) -> tuple[int, int]:
    head = lines[line][:col].rstrip()
    if head:
        if head.endswith("-") and head[:-1].strip() == "":
            return line, len(head) - 1
        raise UnsupportedLayout(f"line {line + 1}: a rule does not start with `-` on its own")
    j = line - 1
    while j >= 0:
        stripped = lines[j].strip()
        if stripped == "" or stripped.startswith("#"):
            j -= 1
            continue
        if stripped == "-" or (stripped.startswith("-") and stripped[1:].lstrip().startswith("#")):
            return j, lines[j].index("-")
        break
    raise UnsupportedLayout(f"line {line + 1}: cannot find the `-` that starts a rule")


def _last_content(lines: list[str], start: int, stop: int) -> int:
    for j in range(stop - 1, start, -1):
        if not _is_blank(lines[j]) and not _is_comment(lines[j]):
            return j
    return start


def _pos(pair: Any) -> tuple[int, int]:
    return int(pair[0]), int(pair[1])


def read_layout(text: str, policy: Policy) -> Layout:
    lines, ends, newline = _split(text)
    try:
        root = parse_yaml(text, policy.source_file)
    except PolicyLoadError as exc:
        raise UnsupportedLayout(f"the file does not parse: {exc}") from None
    if not isinstance(root, CommentedMap) or "rules" not in root:
        raise UnsupportedLayout("the file is not a native policy with a `rules` list")
    key_line, key_col = _pos(root.lc.key("rules"))
    if lines[key_line][:key_col].strip() != "" or not RULES_KEY.match(lines[key_line], key_col):
        raise UnsupportedLayout("the policy is written as a flow mapping ({...}); only block style is edited")
    seq = root["rules"]
    if not isinstance(seq, CommentedSeq):
        raise UnsupportedLayout("`rules` is not a list")
    if len(seq) != len(policy.rules):
        raise UnsupportedLayout("the text and the loaded policy disagree on the number of rules")
    value_line, value_col = _pos(root.lc.value("rules"))
    if len(seq) == 0:
        match = _EMPTY_FLOW.match(lines[value_line], value_col)
        if match is None:
            raise UnsupportedLayout("the empty `rules` list is not written as `[]` on one line")
        return Layout(lines, ends, newline, key_line, key_col, (value_line, value_col, match.end()), [])
    if lines[value_line][value_col:value_col + 1] == "[":
        raise UnsupportedLayout(
            "`rules` is written as a flow sequence ([...]); the console edits block lists only "
            "(one `- tools: ...` item per rule)"
        )
    keys = list(root)
    boundary = len(lines)
    after = keys.index("rules") + 1
    if after < len(keys):
        boundary = _pos(root.lc.key(keys[after]))[0]
    items: list[RuleItem] = []
    for i, node in enumerate(seq):
        content_line, content_col = _pos(seq.lc.item(i))
        if policy.rules[i].line != content_line + 1:
            raise UnsupportedLayout("the text and the loaded policy disagree on where the rules are")
        dash_line, dash_col = _find_dash(lines, content_line, content_col)
        item_key_col = content_col if content_line == dash_line else dash_col + 2
        header = dash_line - 1 if dash_line > 0 and is_console_header(lines[dash_line - 1]) else None
        start = dash_line - 1
        while start >= 0 and _is_comment(lines[start]) and _indent(lines[start]) <= dash_col:
            start -= 1
        span = None
        if isinstance(node, CommentedMap) and "action" in node:
            aline, acol = _pos(node.lc.value("action"))
            match = _ACTION_TOKEN.match(lines[aline], acol)
            if match is not None:
                span = (aline, match.start("word"), match.end("word"))
        items.append(RuleItem(dash_line, dash_col, item_key_col, content_line, -1, header, start + 1, span))
    for j in range(items[-1].content_line + 1, boundary):
        if lines[j].startswith(("---", "...")):
            boundary = j
            break
    for i, item in enumerate(items):
        stop = items[i + 1].dash_line if i + 1 < len(items) else boundary
        last = _last_content(lines, item.content_line, stop)
        # Comment lines right below, indented deeper than its `-`, are the rule's own.
        while last + 1 < stop and _is_comment(lines[last + 1]) and _indent(lines[last + 1]) > item.dash_col:
            last += 1
        item.last_line = last
    return Layout(lines, ends, newline, key_line, key_col, None, items)



__all__ = [
    "CONSOLE_HEADER_PREFIX",
    "RULES_KEY",
    "Layout",
    "RuleItem",
    "UnsupportedLayout",
    "console_header",
    "is_console_header",
    "read_layout",
]
