"""Changing one tool's action in an agent's own policy file, as a text edit (pure).

Invariant: an edit changes the policy file only in the lines it names (the console header and
the rule it writes, rewrites or removes, plus the ``rules:`` line when the list becomes empty or
stops being empty); every other byte of the file (comments, blank lines, quoting, anchors, line
endings) is kept as written. A plan is handed out only after the new text has been parsed again
and checked: same policy name, agent and schemas, every other rule unchanged and in order, and
(for a set action) the new rule deciding the tool for the agent. Whatever cannot be edited that
way is refused with a message, never approximated by re-serialising the file.

Theory of operation. ``plan_edit`` takes the file's text, the ``Policy`` loaded from it (the
agent's own), and the policy set in force with that policy in it, and returns an ``EditPlan``
(the new text and what it does) or an ``EditRefused`` (an HTTP status and why):

* **The agent's own policy** is the first policy, in evaluation order, whose ``agent`` is the
  agent id itself, written without any glob character (``own_policy``). When there is none the
  edit is refused with 404 and a message asking for one to be written (``name``, ``agent``,
  ``rules: []``): the console does not create files, so that the file's name, the policy's
  name and its place among the others stay a person's choice.
* **A rule that names the tool exactly** has one pattern in ``tools`` whose only match is the
  tool, and no ``when``. It is a **console rule** when the line right above its ``-`` is a
  header ``# set from console, <date> by <by>``; otherwise it was written by hand.
* **Setting** ``allow`` / ``deny`` / ``human_approval``. "The rule that decides today" is the
  fall-through of ``explain`` (the first unconditional candidate). When it names the tool exactly
  and sits in the own policy, it is rewritten in place: only its action word changes (quotes,
  ``tools`` spelling and its own comments stay) and the header is written (or replaced) right
  above its ``-``; a hand-written rule thereby becomes a console rule (its previous action is
  in the ``.bak`` file and the trace). Otherwise a new rule
  ``- tools: ["<tool>"]`` / ``  action: <action>`` under a header is inserted right before the
  deciding rule when that rule is in the own policy (above the comment lines attached to it, so
  that they stay with it; conditional rules above keep their say), else after the last rule of
  the own policy (still before any shared policy). A console rule for the tool that an earlier
  rule shadows is removed in the same edit, so the console keeps at most one live rule per tool;
  a shadowed hand-written one is left alone.
* **inherit** removes the console rules naming the tool exactly, so evaluation falls to
  whatever comes next. If the first rule naming the tool exactly is hand-written, it is refused
  with 409 (such rules are edited in the file). With no such rule nothing changes.
* New lines copy the indentation of the neighbouring rule (the column of ``-`` and the gap after
  it) and the file's line ending; the tool name is written as a YAML double-quoted string in
  printable ASCII with glob characters escaped, so the rule matches the tool literally.

Refusals: 400 for a bad request (unknown action, a tool name or ``by`` that is empty, too long or
holds a control character, ``allow``/``human_approval`` for a name with glob characters: the
escaped pattern would also match the tool literally named like the pattern, so only ``deny``,
which cannot relax anything, is written for such names), 404 (no own policy), 409 (a hand-written
rule for ``inherit``; a layout the text edit does not handle: a flow-style root or non-empty flow
``rules`` list, line breaks other than LF/CRLF, or a self-check that fails).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from drawbridge.policy.evaluate import explain
from drawbridge.policy.globs import GLOB_METACHARACTERS, GlobKind, escape_glob
from drawbridge.policy.load import PolicyLoadError, PolicySource, parse_policy, parse_yaml
from drawbridge.policy.model import Action, Basis, Decision, Policy, PolicySet, Rule
from drawbridge.policy.yaml_text import quoted

INHERIT: Final = "inherit"
CONSOLE_HEADER_PREFIX: Final = "# set from console, "
MAX_TOOL_CHARS: Final = 512
MAX_BY_CHARS: Final = 200
MAX_DATE_CHARS: Final = 64

Requested = Action | Literal["inherit"]


class Placement(enum.StrEnum):
    """Where the edit put (or took away) the tool's rule."""

    REWRITE = "rewrite_in_place"
    BEFORE_RULE = "before_deciding_rule"
    END_OF_POLICY = "end_of_policy"
    REMOVE = "remove"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, slots=True)
class EditRefused:
    """An edit that is not made. ``status`` is the HTTP status the control plane answers with."""

    status: int
    message: str
    error: PolicyLoadError | None = field(default=None, compare=False)


@dataclass(frozen=True)
class EditPlan:
    """A checked edit: the new text and what it changes.

    ``before``/``after`` are the fall-through decisions for (agent, tool) with the old and the
    new file (what the policy decides when no condition holds). ``rule_index``/``line`` locate
    the rule written (None for a removal); ``removed`` lists the old indexes of rules taken out.
    """

    new_text: str
    changed: bool
    agent: str
    tool: str
    requested: Requested
    by: str
    date: str
    policy: str
    source_file: str
    placement: Placement
    before: Decision
    after: Decision
    rule_index: int | None
    line: int | None
    removed: tuple[int, ...]
    header: str | None
    new_policy: Policy = field(repr=False, compare=False)

    @property
    def before_action(self) -> Action:
        return self.before.action

    @property
    def after_action(self) -> Action:
        return self.after.action


# ----------------------------------------------------------------------------- small helpers


def own_policy(policy_set: PolicySet, agent: str) -> Policy | None:
    """The first policy, in evaluation order, written for exactly this agent id (no glob)."""
    for policy in policy_set.policies:
        if is_own_policy(policy, agent):
            return policy
    return None


def is_own_policy(policy: Policy, agent: str) -> bool:
    glob = policy.agent
    return glob.kind is GlobKind.EXACT and glob.text == agent and glob.exact_value == agent


def names_tool_exactly(rule: Rule, tool: str) -> bool:
    """One pattern, matching only ``tool``, and no conditions."""
    return not rule.conditions and len(rule.tools) == 1 and rule.tools[0].exact_value == tool


def console_header(date: str, by: str) -> str:
    return f"{CONSOLE_HEADER_PREFIX}{date} by {by}"


def is_console_header(line: str) -> bool:
    return line.strip().startswith(CONSOLE_HEADER_PREFIX)


def _requested(action: object) -> Requested | None:
    if isinstance(action, Action):
        return action
    if action == INHERIT:
        return INHERIT
    if isinstance(action, str):
        try:
            return Action(action)
        except ValueError:
            return None
    return None


def _text_problem(value: object, what: str, limit: int) -> str | None:
    if not isinstance(value, str) or value == "":
        return f"{what} must be a non-empty string"
    if len(value) > limit:
        return f"{what} is longer than {limit} characters"
    if not value.isprintable():
        return f"{what} contains a control character or a line break"
    return None


def _sig(rule: Rule) -> tuple[Any, ...]:
    conditions = tuple(
        (c.arg, c.op.value, json.dumps(c.value, sort_keys=True), c.if_missing) for c in rule.conditions
    )
    return (tuple(p.text for p in rule.tools), rule.action.value, conditions)


class _Unsupported(Exception):
    """The file's layout is outside what the text edit handles."""


# ----------------------------------------------------------------------------- the file's layout


@dataclass(slots=True)
class _Item:
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
class _Layout:
    lines: list[str]
    ends: list[str]
    newline: str
    rules_key_line: int
    rules_key_col: int
    empty_flow: tuple[int, int, int] | None  # (line, start, end) of the `[]` of an empty list
    items: list[_Item]


_ACTION_TOKEN = re.compile(r"""(?P<q>["']?)(?P<word>allow|deny|human_approval)(?P=q)(?![\w-])""")
_EMPTY_FLOW = re.compile(r"\[[ \t]*\]")
_RULES_KEY = re.compile(r"""(?:rules|"rules"|'rules')[ \t]*:""")


def _split(text: str) -> tuple[list[str], list[str], str]:
    for odd in ("\x85", "\u2028", "\u2029"):
        if odd in text:
            raise _Unsupported("the file uses a line break other than LF or CRLF")
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
            raise _Unsupported("the file holds a carriage return that is not part of a CRLF line ending")
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
        raise _Unsupported(f"line {line + 1}: a rule does not start with `-` on its own")
    j = line - 1
    while j >= 0:
        stripped = lines[j].strip()
        if stripped == "" or stripped.startswith("#"):
            j -= 1
            continue
        if stripped == "-" or (stripped.startswith("-") and stripped[1:].lstrip().startswith("#")):
            return j, lines[j].index("-")
        break
    raise _Unsupported(f"line {line + 1}: cannot find the `-` that starts a rule")


def _last_content(lines: list[str], start: int, stop: int) -> int:
    for j in range(stop - 1, start, -1):
        if not _is_blank(lines[j]) and not _is_comment(lines[j]):
            return j
    return start


def _pos(pair: Any) -> tuple[int, int]:
    return int(pair[0]), int(pair[1])


def _layout(text: str, policy: Policy) -> _Layout:
    lines, ends, newline = _split(text)
    try:
        root = parse_yaml(text, policy.source_file)
    except PolicyLoadError as exc:
        raise _Unsupported(f"the file does not parse: {exc}") from None
    if not isinstance(root, CommentedMap) or "rules" not in root:
        raise _Unsupported("the file is not a native policy with a `rules` list")
    key_line, key_col = _pos(root.lc.key("rules"))
    if lines[key_line][:key_col].strip() != "" or not _RULES_KEY.match(lines[key_line], key_col):
        raise _Unsupported("the policy is written as a flow mapping ({...}); only block style is edited")
    seq = root["rules"]
    if not isinstance(seq, CommentedSeq):
        raise _Unsupported("`rules` is not a list")
    if len(seq) != len(policy.rules):
        raise _Unsupported("the text and the loaded policy disagree on the number of rules")
    value_line, value_col = _pos(root.lc.value("rules"))
    if len(seq) == 0:
        match = _EMPTY_FLOW.match(lines[value_line], value_col)
        if match is None:
            raise _Unsupported("the empty `rules` list is not written as `[]` on one line")
        return _Layout(lines, ends, newline, key_line, key_col, (value_line, value_col, match.end()), [])
    if lines[value_line][value_col:value_col + 1] == "[":
        raise _Unsupported(
            "`rules` is written as a flow sequence ([...]); the console edits block lists only "
            "(one `- tools: ...` item per rule)"
        )
    keys = list(root)
    boundary = len(lines)
    after = keys.index("rules") + 1
    if after < len(keys):
        boundary = _pos(root.lc.key(keys[after]))[0]
    items: list[_Item] = []
    for i, node in enumerate(seq):
        content_line, content_col = _pos(seq.lc.item(i))
        if policy.rules[i].line != content_line + 1:
            raise _Unsupported("the text and the loaded policy disagree on where the rules are")
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
        items.append(_Item(dash_line, dash_col, item_key_col, content_line, -1, header, start + 1, span))
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
    return _Layout(lines, ends, newline, key_line, key_col, None, items)


# ----------------------------------------------------------------------------- text operations


@dataclass(slots=True)
class _Splice:
    """Replace lines[start:stop] with ``new`` (new lines get the file's line ending)."""

    start: int
    stop: int
    new: list[str]


def _rule_lines(indent: str, gap: int, tool: str, action: Action, header: str) -> list[str]:
    return [
        f"{indent}{header}",
        f"{indent}-{' ' * gap}tools: [{quoted(escape_glob(tool))}]",
        f"{indent}{' ' * (gap + 1)}action: {action.value}",
    ]


def _style(layout: _Layout, item: _Item | None) -> tuple[str, int]:
    """Indentation (before ``-``) and gap (after it) for a new rule next to ``item``."""
    if item is None:
        return " " * (layout.rules_key_col + 2), 1
    return " " * item.dash_col, max(1, item.key_col - item.dash_col - 1)


def _removal(item: _Item) -> _Splice:
    start = item.header_line if item.header_line is not None else item.dash_line
    return _Splice(start, item.last_line + 1, [])


def _assemble(layout: _Layout, splices: list[_Splice], replaced: dict[int, str]) -> str:
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


def _close_list(layout: _Layout) -> dict[int, str]:
    """The ``rules:`` line rewritten as ``rules: []`` (the block list became empty)."""
    line = layout.lines[layout.rules_key_line]
    match = _RULES_KEY.match(line, layout.rules_key_col)
    assert match is not None  # checked in _layout
    return {layout.rules_key_line: line[: match.end()] + " []" + line[match.end():]}


def _open_list(layout: _Layout, new: list[str]) -> _Splice:
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
    return _Splice(line_no, line_no + 1, kept + new)


# ----------------------------------------------------------------------------- planning


def plan_edit(
    text: str,
    *,
    policy: Policy | None,
    policy_set: PolicySet,
    agent: str,
    tool: str,
    action: Requested | str,
    by: str,
    date: str,
) -> EditPlan | EditRefused:
    """Plan setting ``tool``'s action for ``agent`` in ``text`` (the file of ``policy``).

    ``policy`` is the agent's own policy as loaded from ``text`` (``own_policy``; None when the
    agent has none) and must be the one ``policy_set`` holds under its name: the set is where
    "the rule that decides today" is looked up. ``date`` and ``by`` go into the header.
    """
    requested = _requested(action)
    if requested is None:
        allowed = ", ".join([*(a.value for a in Action), INHERIT])
        return EditRefused(400, f"unknown action {action!r} (allowed: {allowed})")
    for value, what, limit in (
        (tool, "the tool name", MAX_TOOL_CHARS),
        (by, "`by`", MAX_BY_CHARS),
        (date, "the date", MAX_DATE_CHARS),
    ):
        problem = _text_problem(value, what, limit)
        if problem is not None:
            return EditRefused(400, problem)
    if requested in (Action.ALLOW, Action.HUMAN_APPROVAL) and GLOB_METACHARACTERS & set(tool):
        return EditRefused(
            400,
            f"the tool name {quoted(tool)} holds glob characters: a rule for it would also match the "
            f"tool literally named {quoted(escape_glob(tool))}, so the console writes only `deny` "
            "for it; write any other rule by hand",
        )
    if policy is None:
        return EditRefused(
            404,
            f"no policy is written for agent {quoted(agent)} exactly; create one in the policy "
            f"directory (name: ..., agent: {quoted(agent)}, rules: []) and try again",
        )
    if not is_own_policy(policy, agent):
        raise ValueError(f"policy {policy.name!r} is not written for agent {agent!r} exactly")
    if policy_set.by_name(policy.name) != policy:
        raise ValueError("policy_set must hold the policy loaded from text")
    try:
        layout = _layout(text, policy)
    except _Unsupported as exc:
        message = f"{policy.source_file}: cannot edit this file as text: {exc}; edit it by hand"
        return EditRefused(409, message)

    before = explain(policy_set, agent, tool).fallthrough
    decider: int | None = None
    if before.basis is Basis.RULE and before.policy == policy.name and before.rule_index is not None:
        decider = before.rule_index
    exact = [rule.index for rule in policy.rules if names_tool_exactly(rule, tool)]
    console = [i for i in exact if layout.items[i].header_line is not None]
    header = console_header(date, by)

    splices: list[_Splice] = []
    replaced: dict[int, str] = {}
    removed: tuple[int, ...] = ()
    new_index: int | None = None

    if requested == INHERIT:
        if not exact:
            return _unchanged(text, policy, policy_set, agent, tool, requested, by, date, before)
        first = policy.rules[exact[0]]
        if layout.items[first.index].header_line is None:
            return EditRefused(
                409,
                f"rule {first.index} of policy {policy.name!r} ({policy.source_file}:{first.line}) "
                f"names {quoted(tool)} and was written by hand; edit it in the file",
            )
        removed = tuple(console)
        splices = [_removal(layout.items[i]) for i in removed]
        if len(removed) == len(policy.rules):
            replaced = _close_list(layout)
        placement = Placement.REMOVE
    else:
        assert isinstance(requested, Action)
        if decider is not None and decider in exact:
            item = layout.items[decider]
            if item.action_span is None:
                return EditRefused(
                    409,
                    f"{policy.source_file}:{policy.rules[decider].line}: the action of the rule naming "
                    f"{quoted(tool)} is not written as a plain word; edit it by hand",
                )
            aline, astart, astop = item.action_span
            replaced[aline] = layout.lines[aline][:astart] + requested.value + layout.lines[aline][astop:]
            header_line = " " * item.dash_col + header
            if item.header_line is not None:
                replaced[item.header_line] = header_line
            else:
                splices.append(_Splice(item.dash_line, item.dash_line, [header_line]))
            placement, new_index = Placement.REWRITE, decider
        else:
            # No live rule names the tool exactly: a new one goes in, and console rules for the
            # tool that an earlier rule shadows go out (all of them come after the decider).
            removed = tuple(i for i in console if decider is None or i > decider)
            splices = [_removal(layout.items[i]) for i in removed]
            if decider is not None:
                target = layout.items[decider]
                indent, gap = _style(layout, target)
                new = _rule_lines(indent, gap, tool, requested, header)
                splices.append(_Splice(target.attach_start, target.attach_start, new))
                placement, new_index = Placement.BEFORE_RULE, decider
            elif layout.empty_flow is not None:
                indent, gap = _style(layout, None)
                splices.append(_open_list(layout, _rule_lines(indent, gap, tool, requested, header)))
                placement, new_index = Placement.END_OF_POLICY, 0
            else:
                last = layout.items[-1]
                indent, gap = _style(layout, last)
                new = _rule_lines(indent, gap, tool, requested, header)
                splices.append(_Splice(last.last_line + 1, last.last_line + 1, new))
                placement, new_index = Placement.END_OF_POLICY, len(policy.rules) - len(removed)

    new_text = _assemble(layout, splices, replaced)
    return _checked(
        text, new_text, policy, policy_set, agent, tool, requested, by, date, before,
        placement, new_index, removed, header if requested != INHERIT else None,
    )


def _unchanged(
    text: str,
    policy: Policy,
    policy_set: PolicySet,
    agent: str,
    tool: str,
    requested: Requested,
    by: str,
    date: str,
    before: Decision,
) -> EditPlan:
    return EditPlan(
        text, False, agent, tool, requested, by, date, policy.name, policy.source_file,
        Placement.UNCHANGED, before, before, None, None, (), None, policy,
    )


def _replace(policy_set: PolicySet, old: Policy, new: Policy) -> PolicySet:
    return PolicySet(tuple(new if p is old or p == old else p for p in policy_set.policies))


def _checked(
    text: str,
    new_text: str,
    policy: Policy,
    policy_set: PolicySet,
    agent: str,
    tool: str,
    requested: Requested,
    by: str,
    date: str,
    before: Decision,
    placement: Placement,
    new_index: int | None,
    removed: tuple[int, ...],
    header: str | None,
) -> EditPlan | EditRefused:
    """Parse the new text again and check that it says what the edit meant, and nothing else."""

    def refuse(problem: str) -> EditRefused:
        return EditRefused(409, f"{policy.source_file}: the text edit would {problem}; edit the file by hand")

    try:
        new_policy = parse_policy(PolicySource(policy.source_file, new_text))
    except PolicyLoadError as exc:
        return EditRefused(409, refuse(f"not load ({exc})").message, exc)
    if (new_policy.name, new_policy.agent.text, new_policy.description) != (
        policy.name, policy.agent.text, policy.description
    ):
        return refuse("change the policy's name, agent or description")
    old_schemas = {k: json.dumps(v.schema, sort_keys=True) for k, v in policy.schemas.items()}
    new_schemas = {k: json.dumps(v.schema, sort_keys=True) for k, v in new_policy.schemas.items()}
    if old_schemas != new_schemas:
        return refuse("change the policy's schemas")
    expected = [_sig(rule) for rule in policy.rules if rule.index not in removed]
    if isinstance(requested, Action):
        assert new_index is not None
        signature = ((escape_glob(tool),), requested.value, ())
        if placement is Placement.REWRITE:
            old = _sig(policy.rules[new_index])
            expected[new_index] = (old[0], requested.value, ())
        else:
            expected.insert(new_index, signature)
    if [_sig(rule) for rule in new_policy.rules] != expected:
        return refuse("change other rules than the one for this tool")
    after = explain(_replace(policy_set, policy, new_policy), agent, tool).fallthrough
    line: int | None = None
    if isinstance(requested, Action):
        assert new_index is not None
        rule = new_policy.rules[new_index]
        if not names_tool_exactly(rule, tool):
            return refuse("write a rule that does not name the tool exactly")
        if (after.policy, after.rule_index, after.action) != (new_policy.name, new_index, requested):
            return refuse("not make the new rule decide the tool")
        line = rule.line
    return EditPlan(
        new_text, new_text != text, agent, tool, requested, by, date, policy.name, policy.source_file,
        placement, before, after, new_index, line, removed, header, new_policy,
    )


__all__ = [
    "CONSOLE_HEADER_PREFIX",
    "INHERIT",
    "EditPlan",
    "EditRefused",
    "Placement",
    "console_header",
    "is_console_header",
    "is_own_policy",
    "names_tool_exactly",
    "own_policy",
    "plan_edit",
]
