"""Changing one tool's action in an agent's own policy file, as a text edit (pure).

Invariant: an edit changes the policy file only in the lines it names (the console header and
the rule it writes, rewrites or removes, plus the ``rules:`` line when the list becomes empty or
stops being empty); every other byte of the file (comments, blank lines, quoting, anchors, line
endings) is kept as written. A plan is handed out only after the new text has been parsed again
and checked: same policy name, agent and schemas, every other rule unchanged and in order, and
(for a set action) the new rule deciding every call of the tool for the agent (no conditional
rule is tried before it). Whatever cannot be edited that
way is refused with a message, never approximated by re-serialising the file.

Theory of operation. ``plan_edit`` takes the file's text, the ``Policy`` loaded from it (the
agent's own), and the policy set in force with that policy in it, and returns an ``EditPlan``
(the new text and what it does) or an ``EditRefused`` (an HTTP status and why):

* **The agent's own policy** is the first policy, in evaluation order, whose ``agent`` is the
  agent id itself, written without any glob character (``own_policy``), or, when the id given is a
  glob (``*``: the draft ``discover --generate-policy`` writes), the policy whose ``agent`` is that
  glob as written. When there is none the
  edit is refused with 404 and a message asking for one to be written (``name``, ``agent``,
  ``rules: []``): the console does not create files, so that the file's name, the policy's
  name and its place among the others stay a person's choice.
* **A rule that names the tool exactly** has one pattern in ``tools`` whose only match is the
  tool, and no ``when``. It is a **console rule** when the line right above its ``-`` is a
  header ``# set from console, <date> by <by>``; otherwise it was written by hand.
* **Setting** ``allow`` / ``deny`` / ``human_approval`` means every call of the tool by the agent
  gets that action (floors aside): the rule written decides before every rule of the own policy
  that matches the tool, conditional ones included (first match wins). When the first rule of
  the own policy matching the tool is a console rule naming it exactly, only its action word
  changes and its header is renewed. Otherwise a new rule ``- tools: ["<tool>"]`` /
  ``  action: <action>`` under a header is inserted right before that first matching rule (above
  the comment lines attached to it, so that they stay with it), or after the last rule of the
  own policy when none of its rules matches (still before any shared policy). Hand-written rules
  are never rewritten: they stay as written behind the console rule, and ``inherit`` gives them
  their say back. Other console rules for the tool (shadowed now) are removed in the same edit,
  so the console keeps at most one rule per tool. When a conditional rule of a policy evaluated
  before the own policy (another policy for the same agent) would still decide some calls, the
  edit is refused (409, naming that rule): an edit never reports an action some calls would not
  get.
* **inherit** removes the console rules naming the tool exactly, so evaluation falls to
  whatever comes next (the hand-written rules they stood in front of, included). With no console
  rule but a hand-written rule of the own policy that names the tool literally (one of its
  patterns matches only the tool, among other patterns or under conditions included), it is
  refused with 409 naming that rule's file and line: that rule would still decide the tool, so an
  answer of "unchanged" would let the user believe the tool was reverted (such rules are edited
  in the file). With neither, nothing changes (the tool is decided by globs or other policies).
* New lines copy the indentation of the neighbouring rule (the column of ``-`` and the gap after
  it) and the file's line ending; the tool name is written as a YAML double-quoted string in
  printable ASCII with glob characters escaped, so the rule matches the tool literally.

Where each rule stands in the text is read by ``edit_layout`` (the console header is its mark of a
console rule), and the lines are changed by the splices of ``edit_splice``: this module decides
which rules move, and checks the text that results.

Refusals: 400 for a bad request (unknown action, a tool name or ``by`` that is empty, too long or
holds a control character, ``allow``/``human_approval`` for a name with glob characters: the
escaped pattern would also match the tool literally named like the pattern, so only ``deny``,
which cannot relax anything, is written for such names), 404 (no own policy), 409 (a hand-written
rule for ``inherit``; a conditional rule evaluated before the own policy; a layout the text edit
does not handle: a flow-style root or non-empty flow ``rules`` list, line breaks other than
LF/CRLF, or a self-check that fails).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from drawbridge.policy.edit_layout import UnsupportedLayout, console_header, read_layout
from drawbridge.policy.edit_splice import (
    Splice,
    assemble,
    close_list,
    open_list,
    removal,
    rule_lines,
    rule_style,
)
from drawbridge.policy.evaluate import ToolView, explain
from drawbridge.policy.globs import GLOB_METACHARACTERS, GlobKind, escape_glob
from drawbridge.policy.load import PolicyLoadError, PolicySource, parse_policy
from drawbridge.policy.model import Action, Decision, Policy, PolicySet, Rule
from drawbridge.policy.yaml_text import quoted

INHERIT: Final = "inherit"
MAX_TOOL_CHARS: Final = 512
MAX_BY_CHARS: Final = 200
MAX_DATE_CHARS: Final = 64

Requested = Action | Literal["inherit"]


class Placement(enum.StrEnum):
    """Where the edit put (or took away) the tool's rule."""

    REWRITE = "rewrite_in_place"
    BEFORE_RULE = "before_deciding_rule"
    BEFORE_CONDITIONAL = "before_conditional_rule"
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
    new file (what the policy decides when no condition holds); ``before_view``/``after_view``
    add the conditional rules tried before them, so that every path a call can take is told
    (after a set action there are none: the rule written decides every call). ``rule_index``/
    ``line`` locate the rule written (None for a removal); ``removed`` lists the old indexes of
    rules taken out.
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
    before_view: ToolView = field(repr=False)
    after_view: ToolView = field(repr=False)
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
    """Written for exactly ``agent``: an exact agent id, or a glob addressed as written (``*`` names the
    policy ``discover --generate-policy`` drafts for every agent, and only that one)."""
    glob = policy.agent
    if glob.kind is GlobKind.EXACT:
        return glob.text == agent and glob.exact_value == agent
    return glob.text == agent


def names_tool_exactly(rule: Rule, tool: str) -> bool:
    """One pattern, matching only ``tool``, and no conditions."""
    return not rule.conditions and len(rule.tools) == 1 and rule.tools[0].exact_value == tool


def names_tool_literally(rule: Rule, tool: str) -> bool:
    """One of its patterns matches only ``tool`` (among others or not, under conditions or not):
    the rule was written for this tool, so ``inherit`` that leaves it in force reverts nothing."""
    return any(pattern.exact_value == tool for pattern in rule.tools)


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


def tool_refusal(tool: object, requested: Requested) -> EditRefused | None:
    """The 400 of a tool name no edit may write for ``requested``, or None. Checked before anything
    is looked up (the served tools, the agent's policy), so a name that can never be written is
    told so, not sent to look for a tool or a policy first."""
    problem = _text_problem(tool, "the tool name", MAX_TOOL_CHARS)
    if problem is not None:
        return EditRefused(400, problem)
    assert isinstance(tool, str)
    if requested in (Action.ALLOW, Action.HUMAN_APPROVAL) and GLOB_METACHARACTERS & set(tool):
        # Shown as written (printable, checked above), not as a YAML or JSON string: an escaped
        # backslash read as two would misname the very tool this message is about.
        return EditRefused(
            400,
            f"the tool name `{tool}` holds glob characters: a rule for it would also match the "
            f"tool literally named `{escape_glob(tool)}`, so the console writes only `deny` "
            "for it; write any other rule by hand",
        )
    return None


def _sig(rule: Rule) -> tuple[Any, ...]:
    conditions = tuple(
        (c.arg, c.op.value, json.dumps(c.value, sort_keys=True), c.if_missing) for c in rule.conditions
    )
    return (tuple(p.text for p in rule.tools), rule.action.value, conditions)


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
    refused = tool_refusal(tool, requested)
    if refused is not None:
        return refused
    for value, what, limit in ((by, "`by`", MAX_BY_CHARS), (date, "the date", MAX_DATE_CHARS)):
        problem = _text_problem(value, what, limit)
        if problem is not None:
            return EditRefused(400, problem)
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
        layout = read_layout(text, policy)
    except UnsupportedLayout as exc:
        message = f"{policy.source_file}: cannot edit this file as text: {exc}; edit it by hand"
        return EditRefused(409, message)

    before = explain(policy_set, agent, tool)
    exact = [rule.index for rule in policy.rules if names_tool_exactly(rule, tool)]
    console = [i for i in exact if layout.items[i].header_line is not None]
    header = console_header(date, by)

    splices: list[Splice] = []
    replaced: dict[int, str] = {}
    removed: tuple[int, ...] = ()
    new_index: int | None = None

    if requested == INHERIT:
        if not console:
            hand = next((rule for rule in policy.rules if names_tool_literally(rule, tool)), None)
            if hand is None:
                return _unchanged(text, policy, policy_set, agent, tool, requested, by, date, before)
            return EditRefused(
                409,
                f"{_rule_where(policy, hand)} names {quoted(tool)} and was written by hand: inherit "
                "would leave it deciding the tool; edit it in the file",
            )
        removed = tuple(console)
        splices = [removal(layout.items[i]) for i in removed]
        if len(removed) == len(policy.rules):
            replaced = close_list(layout)
        placement = Placement.REMOVE
    else:
        assert isinstance(requested, Action)
        # The rule written goes where it decides before every rule of the own policy that matches
        # the tool, conditional ones included: calls get the action the edit reports, on every path.
        matching = policy.rules_for_tool(tool)
        first = matching[0].index if matching else None
        if first is not None and first in console:
            item = layout.items[first]
            if item.action_span is None:
                return EditRefused(
                    409,
                    f"{policy.source_file}:{policy.rules[first].line}: the action of the rule naming "
                    f"{quoted(tool)} is not written as a plain word; edit it by hand",
                )
            aline, astart, astop = item.action_span
            replaced[aline] = layout.lines[aline][:astart] + requested.value + layout.lines[aline][astop:]
            assert item.header_line is not None
            replaced[item.header_line] = " " * item.dash_col + header
            removed = tuple(i for i in console if i != first)
            splices = [removal(layout.items[i]) for i in removed]
            placement, new_index = Placement.REWRITE, first
        else:
            # A new console rule goes in; hand-written rules stay as written (``inherit`` gives them
            # their say back) and the console rules for the tool, all after ``first``, go out.
            removed = tuple(console)
            splices = [removal(layout.items[i]) for i in removed]
            if first is not None:
                target = layout.items[first]
                indent, gap = rule_style(layout, target)
                new = rule_lines(indent, gap, tool, requested, header)
                splices.append(Splice(target.attach_start, target.attach_start, new))
                conditional = bool(policy.rules[first].conditions)
                placement = Placement.BEFORE_CONDITIONAL if conditional else Placement.BEFORE_RULE
                new_index = first
            elif layout.empty_flow is not None:
                indent, gap = rule_style(layout, None)
                splices.append(open_list(layout, rule_lines(indent, gap, tool, requested, header)))
                placement, new_index = Placement.END_OF_POLICY, 0
            else:
                last = layout.items[-1]
                indent, gap = rule_style(layout, last)
                new = rule_lines(indent, gap, tool, requested, header)
                splices.append(Splice(last.last_line + 1, last.last_line + 1, new))
                placement, new_index = Placement.END_OF_POLICY, len(policy.rules) - len(removed)

    new_text = assemble(layout, splices, replaced)
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
    before: ToolView,
) -> EditPlan:
    return EditPlan(
        text, False, agent, tool, requested, by, date, policy.name, policy.source_file,
        Placement.UNCHANGED, before.fallthrough, before.fallthrough, None, None, (), None,
        before, before, policy,
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
    before: ToolView,
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
    after_view = explain(_replace(policy_set, policy, new_policy), agent, tool)
    after = after_view.fallthrough
    line: int | None = None
    if isinstance(requested, Action):
        assert new_index is not None
        rule = new_policy.rules[new_index]
        if not names_tool_exactly(rule, tool):
            return refuse("write a rule that does not name the tool exactly")
        if after_view.conditional:
            # A conditional rule of a policy evaluated before this one (another policy written for
            # the agent) would still decide some calls: the edit would not be what it reports.
            first = after_view.conditional[0]
            return EditRefused(
                409,
                f"{_rule_where(first.policy, first.rule)} is conditional and is evaluated before "
                f"{policy.name!r}: calls for which its conditions hold would get "
                f"{first.rule.action.value}, not {requested.value}; edit the policies by hand",
            )
        if (after.policy, after.rule_index, after.action) != (new_policy.name, new_index, requested):
            return refuse("not make the new rule decide the tool")
        line = rule.line
    return EditPlan(
        new_text, new_text != text, agent, tool, requested, by, date, policy.name, policy.source_file,
        placement, before.fallthrough, after, new_index, line, removed, header, before, after_view,
        new_policy,
    )


def conditional_text(where: object) -> str | None:
    """One line for the conditional rules of an edit's ``before``/``after`` (as the control plane
    answers them): each decides the calls its conditions hold for, so a summary of the edit that
    shows only the fall-through action would tell less than every path. None when there are none."""
    conditional = where.get("conditional") if isinstance(where, dict) else None
    if not conditional:
        return None
    return "; ".join(
        f"{c.get('action')} if "
        + " and ".join(f"{w.get('field')} {w.get('operator')}" for w in c.get("conditions") or [])
        + f" ({c.get('policy')} #{c.get('rule_index')})"
        for c in conditional
    )


def _rule_where(policy: Policy, rule: Rule) -> str:
    return f"rule {rule.index} of policy {policy.name!r} ({policy.source_file}:{rule.line})"


__all__ = [
    "INHERIT",
    "EditPlan",
    "EditRefused",
    "Placement",
    "conditional_text",
    "is_own_policy",
    "names_tool_exactly",
    "names_tool_literally",
    "own_policy",
    "tool_refusal",
    "plan_edit",
]
