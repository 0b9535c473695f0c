"""The text operations of a per-tool policy edit: whole lines spliced into a read layout (pure).

Invariant: only the lines a splice or a replacement names change; every other line keeps its text
and its own line ending, new lines take the file's (``Layout.newline``), and the text ends with a
line break exactly when the file did.

Theory of operation. ``plan_edit`` (``policy.edit``) decides what changes and says it with the
pieces here: ``rule_lines`` writes a new rule under its header, in the indentation
``rule_style`` copies from the neighbouring rule (the column of ``-`` and the gap after it), with
the tool name as a printable-ASCII double-quoted string and its glob characters escaped;
``removal`` takes a rule out with its header and its own lines; ``close_list`` and ``open_list``
turn the ``rules:`` line into ``rules: []`` and back. ``assemble`` applies the splices from the
last to the first, so the line numbers of the layout hold for each of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from drawbridge.policy.edit_layout import RULES_KEY, Layout, RuleItem
from drawbridge.policy.globs import escape_glob
from drawbridge.policy.model import Action
from drawbridge.policy.yaml_text import quoted


@dataclass(slots=True)
class Splice:
    """Replace lines[start:stop] with ``new`` (new lines get the file's line ending)."""

    start: int
    stop: int
    new: list[str]


def rule_lines(indent: str, gap: int, tool: str, action: Action, header: str) -> list[str]:
    return [
        f"{indent}{header}",
        f"{indent}-{' ' * gap}tools: [{quoted(escape_glob(tool))}]",
        f"{indent}{' ' * (gap + 1)}action: {action.value}",
    ]


def rule_style(layout: Layout, item: RuleItem | None) -> tuple[str, int]:
    """Indentation (before ``-``) and gap (after it) for a new rule next to ``item``."""
    if item is None:
        return " " * (layout.rules_key_col + 2), 1
    return " " * item.dash_col, max(1, item.key_col - item.dash_col - 1)


def removal(item: RuleItem) -> Splice:
    start = item.header_line if item.header_line is not None else item.dash_line
    return Splice(start, item.last_line + 1, [])


def assemble(layout: Layout, splices: list[Splice], replaced: dict[int, str]) -> str:
    lines = [replaced.get(i, line) for i, line in enumerate(layout.lines)]
    ends = list(layout.ends)
    final_newline = bool(ends) and ends[-1] != ""
    for splice in sorted(splices, key=lambda s: s.start, reverse=True):
        lines[splice.start:splice.stop] = splice.new
        ends[splice.start:splice.stop] = [layout.newline] * len(splice.new)
    for i in range(len(ends) - 1):
        if ends[i] == "":
            ends[i] = layout.newline
    if ends:
        ends[-1] = (ends[-1] or layout.newline) if final_newline else ""
    return "".join(line + end for line, end in zip(lines, ends, strict=True))


def close_list(layout: Layout) -> dict[int, str]:
    """The ``rules:`` line rewritten as ``rules: []`` (the block list became empty)."""
    line = layout.lines[layout.rules_key_line]
    match = RULES_KEY.match(line, layout.rules_key_col)
    assert match is not None  # checked in read_layout
    return {layout.rules_key_line: line[: match.end()] + " []" + line[match.end():]}


def open_list(layout: Layout, new: list[str]) -> Splice:
    """Replace the empty ``[]`` with the first rule's lines."""
    assert layout.empty_flow is not None
    line_no, start, stop = layout.empty_flow
    line = layout.lines[line_no]
    before, rest = line[:start].rstrip(), line[stop:].strip()
    kept: list[str] = []
    if before:
        kept.append(before + (" " + rest if rest else ""))
    elif rest:
        kept.append(" " * start + rest)
    return Splice(line_no, line_no + 1, kept + new)


__all__ = ["Splice", "assemble", "close_list", "open_list", "removal", "rule_lines", "rule_style"]
