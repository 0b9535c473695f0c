"""Planning a per-tool policy edit as a text edit: placement, rewrite, inherit, refusals, bytes kept."""

from __future__ import annotations

import difflib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drawbridge.policy import Action, PolicySource, evaluate, explain, load_policies
from drawbridge.policy.edit import (
    EditPlan,
    EditRefused,
    Placement,
    own_policy,
    plan_edit,
)

SHARED = 'name: shared\nagent: "*"\nrules:\n  - tools: ["*"]\n    action: deny\n'
HEADER = "# set from console, 2026-07-30 by marc"

# A policy written by a person: comments everywhere, blank lines, an anchor and an alias.
CLAUDE = """\
# Policy for the Claude desktop agent.
# Reviewed 2026-07-01.

name: claude
agent: "claude"   # exact id

rules:
  # reads are fine
  - tools: ["gmail.list_*", "gmail.get_*"]
    action: allow

  # mail to the ops list goes out without a human
  - tools: ["gmail.send_email"]
    action: allow
    when:
      - {arg: to, op: starts_with, value: "ops@"}

  # MCP server "gmail": writes
  #   the rest of gmail needs a human
  - tools: ["gmail.*"]
    action: human_approval   # keep it that way

schemas:
  gmail.send_email: &mail
    type: object
    properties:
      to: {type: string}
  gmail.send_draft: *mail
"""


def policy_set(text: str, *others: tuple[str, str]):
    extra = others or (("shared.yaml", SHARED),)
    return load_policies([PolicySource("claude.yaml", text), *(PolicySource(n, t) for n, t in extra)])


def plan(text: str, tool: str, action: object, *, agent: str = "claude", by: str = "marc",
         others: tuple[tuple[str, str], ...] = ()) -> EditPlan | EditRefused:
    ps = policy_set(text, *others)
    return plan_edit(
        text, policy=own_policy(ps, agent), policy_set=ps, agent=agent, tool=tool, action=action,
        by=by, date="2026-07-30",
    )


def ok(result: EditPlan | EditRefused) -> EditPlan:
    assert isinstance(result, EditPlan), result
    return result


def refused(result: EditPlan | EditRefused, status: int) -> EditRefused:
    assert isinstance(result, EditRefused), result
    assert result.status == status, result.message
    return result


def decide(text: str, tool: str, arguments: object = None, *others: tuple[str, str]) -> Action:
    return evaluate(policy_set(text, *others), "claude", tool, arguments).action


def inserted_only(old: str, new: str) -> list[str]:
    """The lines the edit inserted; fails if it changed or removed any existing line."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    added: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        assert tag in ("equal", "insert"), (tag, a[i1:i2], b[j1:j2])
        if tag == "insert":
            added += b[j1:j2]
    return added


# ----------------------------------------------------------------------------- placement


def denied_alone(tool: str, placement: Placement) -> EditPlan:
    """``deny`` for ``tool`` in ``CLAUDE``, checked to insert only its three lines at ``placement``."""
    result = ok(plan(CLAUDE, tool, "deny"))
    assert result.placement is placement
    assert inserted_only(CLAUDE, result.new_text) == [f"  {HEADER}\n", f'  - tools: ["{tool}"]\n', "    action: deny\n"]
    return result


def test_new_rule_goes_right_before_the_deciding_rule_and_above_its_comments() -> None:
    result = denied_alone("gmail.delete_email", Placement.BEFORE_RULE)
    # Exactly above the two comment lines that belong to the `gmail.*` rule.
    assert "    when:\n      - {arg: to, op: starts_with, value: \"ops@\"}\n\n" \
        f"  {HEADER}\n" in result.new_text
    assert (result.before_action, result.after_action) == (Action.HUMAN_APPROVAL, Action.DENY)
    assert (result.rule_index, result.line) == (2, 19)
    assert result.new_text.splitlines()[18] == '  - tools: ["gmail.delete_email"]'
    assert decide(result.new_text, "gmail.delete_email") is Action.DENY
    assert decide(result.new_text, "gmail.archive_email") is Action.HUMAN_APPROVAL


def test_new_rule_goes_before_a_conditional_rule_for_the_tool_so_every_call_gets_it() -> None:
    # Setting an action is for every call (first match wins): a conditional rule for the tool
    # that came first would otherwise still decide some calls the edit reports as denied.
    result = denied_alone("gmail.send_email", Placement.BEFORE_CONDITIONAL)
    # Above the comment of the conditional rule, which stays with it.
    assert f'\n\n  {HEADER}\n  - tools: ["gmail.send_email"]\n    action: deny\n' \
        "  # mail to the ops list goes out without a human\n" in result.new_text
    assert (result.before_action, result.after_action) == (Action.HUMAN_APPROVAL, Action.DENY)
    assert [c.rule.index for c in result.before_view.conditional] == [1]
    assert result.after_view.conditional == ()
    assert (result.rule_index, result.line) == (1, 13)
    assert decide(result.new_text, "gmail.send_email", {"to": "ops@x"}) is Action.DENY
    assert decide(result.new_text, "gmail.send_email", {"to": "eve@x"}) is Action.DENY
    assert decide(result.new_text, "gmail.delete_email") is Action.HUMAN_APPROVAL
    # inherit gives the conditional rule its say back.
    back = ok(plan(result.new_text, "gmail.send_email", "inherit"))
    assert back.new_text == CLAUDE
    assert [c.rule.index for c in back.after_view.conditional] == [1]


def test_a_conditional_rule_of_an_earlier_policy_for_the_agent_is_refused() -> None:
    earlier = (
        "a-first.yaml",
        'name: first\nagent: claude\nrules:\n  - tools: [t]\n    action: human_approval\n'
        '    when: [{arg: x, op: starts_with, value: "ok"}]\n',
    )
    text = "name: claude\nagent: claude\nrules: []\n"
    ps = load_policies([PolicySource(*earlier), PolicySource("claude.yaml", text)])
    own = next(p for p in ps.policies if p.name == "claude")
    result = plan_edit(text, policy=own, policy_set=ps, agent="claude", tool="t", action="deny",
                       by="marc", date="2026-07-30")
    result = refused(result, 409)
    assert result.message == (
        "rule 0 of policy 'first' (a-first.yaml:4) is conditional and is evaluated before 'claude': "
        "calls for which its conditions hold would get human_approval, not deny; edit the policies by hand"
    )


def test_new_rule_goes_at_the_end_of_the_own_policy_when_a_shared_policy_decides() -> None:
    result = ok(plan(CLAUDE, "slack.post_message", "allow"))
    assert result.placement is Placement.END_OF_POLICY
    assert result.before.source_file == "shared.yaml"
    assert inserted_only(CLAUDE, result.new_text) == [
        f"  {HEADER}\n",
        '  - tools: ["slack.post_message"]\n',
        "    action: allow\n",
    ]
    assert 'action: human_approval   # keep it that way\n' \
        f'  {HEADER}\n  - tools: ["slack.post_message"]\n    action: allow\n\nschemas:' in result.new_text
    assert (result.before_action, result.after_action, result.rule_index) == (Action.DENY, Action.ALLOW, 3)
    assert decide(result.new_text, "slack.post_message") is Action.ALLOW


def test_end_of_policy_also_when_nothing_decides_today() -> None:
    alone = (("other.yaml", 'name: other\nagent: "bot"\nrules: []\n'),)
    result = ok(plan(CLAUDE, "jira.create_issue", "human_approval", others=alone))
    assert result.placement is Placement.END_OF_POLICY
    assert result.before.policy is None and result.before.action is Action.DENY
    assert result.after_action is Action.HUMAN_APPROVAL


def test_a_policy_with_no_rules_yet() -> None:
    text = "name: claude\nagent: claude\nrules: []   # nothing yet\n"
    result = ok(plan(text, "fs.read_file", "allow"))
    assert result.new_text == (
        "name: claude\nagent: claude\nrules: # nothing yet\n"
        f"  {HEADER}\n"
        '  - tools: ["fs.read_file"]\n'
        "    action: allow\n"
    )
    assert (result.placement, result.rule_index) == (Placement.END_OF_POLICY, 0)
    back = ok(plan(result.new_text, "fs.read_file", "inherit"))
    assert back.new_text == "name: claude\nagent: claude\nrules: [] # nothing yet\n"
    assert decide(back.new_text, "fs.read_file") is Action.DENY


def test_empty_rules_followed_by_other_keys() -> None:
    text = "name: claude\nagent: claude\nrules: [ ]\nschemas: {}\n"
    result = ok(plan(text, "a.b", "deny"))
    assert result.new_text == (
        f'name: claude\nagent: claude\nrules:\n  {HEADER}\n  - tools: ["a.b"]\n    action: deny\n'
        "schemas: {}\n"
    )


# ----------------------------------------------------------------------------- in-place rewrite


def test_a_console_rule_is_rewritten_in_place() -> None:
    first = ok(plan(CLAUDE, "gmail.send_email", "deny"))
    second = ok(plan(first.new_text, "gmail.send_email", "allow", by="eve"))
    assert second.placement is Placement.REWRITE
    a, b = first.new_text.splitlines(), second.new_text.splitlines()
    assert len(a) == len(b)
    changed = [(i + 1, x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    assert changed == [
        (12, f"  {HEADER}", "  # set from console, 2026-07-30 by eve"),
        (14, "    action: deny", "    action: allow"),
    ]
    assert (second.before_action, second.after_action, second.rule_index) == (Action.DENY, Action.ALLOW, 1)


def test_a_hand_written_rule_is_kept_as_written_behind_the_console_rule() -> None:
    text = (
        "name: claude\nagent: claude\nrules:\n"
        "  # why: sends money\n"
        "  - tools:\n"
        "      - 'pay.transfer'   # the only payment tool\n"
        "    action: 'human_approval'   # for now\n"
        '  - tools: ["*"]\n    action: deny\n'
    )
    result = ok(plan(text, "pay.transfer", "allow"))
    assert (result.placement, result.rule_index, result.removed) == (Placement.BEFORE_RULE, 0, ())
    assert result.new_text == (
        "name: claude\nagent: claude\nrules:\n"
        f"  {HEADER}\n"
        '  - tools: ["pay.transfer"]\n'
        "    action: allow\n"
        "  # why: sends money\n"
        "  - tools:\n"
        "      - 'pay.transfer'   # the only payment tool\n"
        "    action: 'human_approval'   # for now\n"
        '  - tools: ["*"]\n    action: deny\n'
    )
    assert decide(result.new_text, "pay.transfer") is Action.ALLOW
    # A second edit rewrites the console rule, never the hand-written one.
    again = ok(plan(result.new_text, "pay.transfer", "deny", by="eve"))
    assert (again.placement, again.rule_index) == (Placement.REWRITE, 0)
    assert "    action: 'human_approval'   # for now\n" in again.new_text
    # inherit removes only what the edits wrote: the hand-written rule decides again.
    back = ok(plan(again.new_text, "pay.transfer", "inherit"))
    assert back.new_text == text
    assert back.after_action is Action.HUMAN_APPROVAL
    assert decide(back.new_text, "pay.transfer") is Action.HUMAN_APPROVAL


def test_a_flow_mapping_rule_is_kept_and_a_console_rule_goes_before_it() -> None:
    text = "name: claude\nagent: claude\nrules:\n  - {tools: [fs.write_file], action: deny}  # no\n"
    result = ok(plan(text, "fs.write_file", "human_approval"))
    assert result.new_text == (
        "name: claude\nagent: claude\nrules:\n"
        f"  {HEADER}\n"
        '  - tools: ["fs.write_file"]\n    action: human_approval\n'
        "  - {tools: [fs.write_file], action: deny}  # no\n"
    )


def test_a_rule_listing_several_tools_is_not_rewritten() -> None:
    text = 'name: claude\nagent: claude\nrules:\n  - tools: [a.x, a.y]\n    action: deny\n'
    result = ok(plan(text, "a.x", "allow"))
    assert result.placement is Placement.BEFORE_RULE
    assert result.new_text == (
        f'name: claude\nagent: claude\nrules:\n  {HEADER}\n  - tools: ["a.x"]\n    action: allow\n'
        "  - tools: [a.x, a.y]\n    action: deny\n"
    )
    assert decide(result.new_text, "a.y") is Action.DENY


def test_a_shadowed_console_rule_moves_before_the_deciding_rule() -> None:
    text = (
        "name: claude\nagent: claude\nrules:\n"
        '  - tools: ["gh.*"]\n    action: deny\n'
        f'  {HEADER}\n  - tools: ["gh.list_repos"]\n    action: allow\n'
    )
    result = ok(plan(text, "gh.list_repos", "allow", by="eve"))
    assert result.placement is Placement.BEFORE_RULE
    assert result.removed == (1,)
    assert result.new_text == (
        "name: claude\nagent: claude\nrules:\n"
        '  # set from console, 2026-07-30 by eve\n  - tools: ["gh.list_repos"]\n    action: allow\n'
        '  - tools: ["gh.*"]\n    action: deny\n'
    )
    assert (result.before_action, result.after_action) == (Action.DENY, Action.ALLOW)


def test_a_shadowed_hand_written_rule_is_left_alone() -> None:
    text = (
        "name: claude\nagent: claude\nrules:\n"
        '  - tools: ["gh.*"]\n    action: deny\n'
        '  - tools: ["gh.list_repos"]\n    action: human_approval\n'
    )
    result = ok(plan(text, "gh.list_repos", "allow"))
    assert (result.placement, result.removed, result.rule_index) == (Placement.BEFORE_RULE, (), 0)
    assert inserted_only(text, result.new_text) == [
        f"  {HEADER}\n", '  - tools: ["gh.list_repos"]\n', "    action: allow\n",
    ]
    assert result.new_text.index("gh.list_repos") < result.new_text.index("gh.*")


def test_setting_the_same_action_again_only_renews_the_header() -> None:
    first = ok(plan(CLAUDE, "x.y", "deny"))
    again = ok(plan(first.new_text, "x.y", "deny"))
    assert again.new_text == first.new_text and not again.changed
    other = ok(plan(first.new_text, "x.y", "deny", by="eve"))
    assert other.changed and other.new_text == first.new_text.replace("by marc", "by eve")


# ----------------------------------------------------------------------------- inherit


def test_inherit_removes_a_console_rule_and_restores_the_text() -> None:
    for tool, action in [("gmail.send_email", "deny"), ("slack.post", "allow"), ("gmail.list_x", "deny")]:
        edited = ok(plan(CLAUDE, tool, action))
        back = ok(plan(edited.new_text, tool, "inherit"))
        assert back.placement is Placement.REMOVE
        assert back.new_text == CLAUDE
        assert back.before_action is Action(action)
        assert back.after_action is edited.before_action


def test_inherit_refuses_a_hand_written_rule() -> None:
    text = "name: claude\nagent: claude\nrules:\n  # mine\n  - tools: [db.drop]\n    action: deny\n"
    result = refused(plan(text, "db.drop", "inherit"), 409)
    assert result.message == (
        "rule 0 of policy 'claude' (claude.yaml:5) names \"db.drop\" and was written by hand: "
        "inherit would leave it deciding the tool; edit it in the file"
    )


@pytest.mark.parametrize(
    ("rules", "line"),
    [
        # named among several patterns: the rule was written for the tool as much as a lone one
        ('  - tools: ["git.git_status", "git.git_log"]\n    action: allow\n', 4),
        # named under conditions: it still decides the calls its conditions hold for
        ("  - tools: [git.git_log]\n    action: deny\n"
         "  - tools: [git.git_status]\n    action: allow\n    when: [{arg: n, op: '<', value: 3}]\n", 6),
    ],
)
def test_inherit_refuses_a_hand_written_rule_that_names_the_tool_among_others(rules: str, line: int) -> None:
    text = f"name: claude\nagent: claude\nrules:\n{rules}"
    result = refused(plan(text, "git.git_status", "inherit"), 409)
    assert f"(claude.yaml:{line}) names \"git.git_status\" and was written by hand" in result.message


def test_inherit_without_a_rule_changes_nothing() -> None:
    # gmail.delete_email is decided by the glob ``gmail.*`` alone: nothing names it, nothing to revert.
    result = ok(plan(CLAUDE, "gmail.delete_email", "inherit"))
    assert (result.placement, result.changed, result.new_text) == (Placement.UNCHANGED, False, CLAUDE)
    assert result.before == result.after


def test_inherit_keeps_a_hand_written_rule_after_the_console_one() -> None:
    text = (
        f"name: claude\nagent: claude\nrules:\n  {HEADER}\n  - tools: [t]\n    action: allow\n"
        "  - tools: [t]\n    action: deny\n"
    )
    result = ok(plan(text, "t", "inherit"))
    assert result.new_text == "name: claude\nagent: claude\nrules:\n  - tools: [t]\n    action: deny\n"
    assert result.after_action is Action.DENY


# ----------------------------------------------------------------------------- layouts


def test_indentation_style_is_copied() -> None:
    indentless = "name: claude\nagent: claude\nrules:\n- tools: [a]\n  action: deny\n"
    assert ok(plan(indentless, "b", "allow")).new_text == indentless + (
        f'{HEADER}\n- tools: ["b"]\n  action: allow\n'
    )
    wide = "name: claude\nagent: claude\nrules:\n    -   tools: [a]\n        action: deny\n"
    assert ok(plan(wide, "a", "allow")).new_text == (
        "name: claude\nagent: claude\nrules:\n"
        f'    {HEADER}\n    -   tools: ["a"]\n        action: allow\n'
        "    -   tools: [a]\n        action: deny\n"
    )
    assert ok(plan(wide, "b", "allow")).new_text == wide + (
        f'    {HEADER}\n    -   tools: ["b"]\n        action: allow\n'
    )


def test_dash_on_its_own_line() -> None:
    text = "name: claude\nagent: claude\nrules:\n  -\n    tools: [a]\n    action: deny\n"
    result = ok(plan(text, "a", "allow"))
    assert result.new_text == (
        f'name: claude\nagent: claude\nrules:\n  {HEADER}\n  - tools: ["a"]\n    action: allow\n'
        "  -\n    tools: [a]\n    action: deny\n"
    )
    assert ok(plan(result.new_text, "a", "inherit")).new_text == text
    console = f"name: claude\nagent: claude\nrules:\n  {HEADER}\n  -\n    tools: [a]\n    action: deny\n"
    assert ok(plan(console, "a", "allow")).new_text == console.replace("deny", "allow")
    assert ok(plan(console, "a", "inherit")).new_text == "name: claude\nagent: claude\nrules: []\n"


def test_crlf_line_endings_and_a_missing_final_newline_are_kept() -> None:
    text = "name: claude\r\nagent: claude\r\nrules:\r\n  - tools: [a]\r\n    action: deny"
    result = ok(plan(text, "b", "allow"))
    assert result.new_text == text + f'\r\n  {HEADER}\r\n  - tools: ["b"]\r\n    action: allow'
    back = ok(plan(result.new_text, "b", "inherit"))
    assert back.new_text == text


def test_document_markers_and_a_rule_s_own_trailing_comment() -> None:
    text = (
        "---\nrules:\n  - tools: [a]\n    action: deny\n    # note on a\n\n"
        "# about the name\nname: claude\nagent: claude\n...\n"
    )
    result = ok(plan(text, "b", "allow"))
    assert result.new_text == text.replace(
        "    # note on a\n", f'    # note on a\n  {HEADER}\n  - tools: ["b"]\n    action: allow\n'
    )
    assert ok(plan(result.new_text, "b", "inherit")).new_text == text


def test_rules_written_as_a_flow_sequence_are_refused() -> None:
    text = "name: claude\nagent: claude\nrules: [{tools: [a], action: deny}]\n"
    result = refused(plan(text, "b", "allow"), 409)
    assert "`rules` is written as a flow sequence" in result.message
    assert result.message.startswith("claude.yaml: cannot edit this file as text:")


def test_a_flow_style_root_is_refused() -> None:
    text = '{name: claude, agent: claude, rules: []}\n'
    assert "flow mapping" in refused(plan(text, "b", "allow"), 409).message


@pytest.mark.parametrize(
    "text",
    [
        "name: claude\r\nagent: claude\rrules: []\n",
        'name: claude\nagent: claude\ndescription: "a\rb"\nrules: []\n',
    ],
)
def test_line_breaks_other_than_lf_and_crlf_are_refused(text: str) -> None:
    assert "carriage return that is not part of a CRLF" in refused(plan(text, "b", "allow"), 409).message


def test_an_edit_that_would_break_an_alias_is_refused_by_the_self_check() -> None:
    text = (
        f"name: claude\nagent: claude\nrules:\n  {HEADER}\n  - tools: &t [t]\n    action: deny\n"
        "  - tools: *t\n    action: allow\n"
    )
    result = refused(plan(text, "t", "inherit"), 409)
    assert result.message.startswith("claude.yaml: the text edit would not load (")
    assert result.error is not None


def test_anchors_and_aliases_elsewhere_survive() -> None:
    result = ok(plan(CLAUDE, "gmail.send_draft", "deny"))
    assert "  gmail.send_email: &mail\n" in result.new_text
    assert "  gmail.send_draft: *mail\n" in result.new_text
    assert set(result.new_policy.schemas) == {"gmail.send_email", "gmail.send_draft"}


# ----------------------------------------------------------------------------- names and inputs


@pytest.mark.parametrize(
    ("tool", "written"),
    [
        ('say "hi"', r'"say \"hi\""'),
        ("caf\u00e9.menu", r'"caf\u00e9.menu"'),
        ("emoji.\U0001f600", r'"emoji.\U0001f600"'),
        ("x: y # z", '"x: y # z"'),
        ("a'b", "\"a'b\""),
    ],
)
def test_tool_names_are_safely_quoted(tool: str, written: str) -> None:
    text = "name: claude\nagent: claude\nrules: []\n"
    result = ok(plan(text, tool, "allow"))
    assert result.new_text.splitlines()[4] == f"  - tools: [{written}]"
    rule = result.new_policy.rules[0]
    assert rule.tools[0].exact_value == tool and rule.action is Action.ALLOW
    assert decide(result.new_text, tool) is Action.ALLOW


def test_glob_characters_are_escaped_and_only_deny_is_written_for_them() -> None:
    text = "name: claude\nagent: claude\nrules: []\n"
    result = ok(plan(text, "files.*", "deny"))
    assert result.new_text.splitlines()[4] == r'  - tools: ["files.\\*"]'
    assert decide(result.new_text, "files.*") is Action.DENY
    assert result.new_policy.rules[0].tools[0].exact_value == "files.*"
    assert not result.new_policy.rules[0].matches_tool("files.read")
    for action in ("allow", "human_approval"):
        assert "glob characters" in refused(plan(text, "files.*", action), 400).message
    # Rewriting and removing it works like any other console rule.
    assert ok(plan(result.new_text, "files.*", "inherit")).new_text == text


@pytest.mark.parametrize(
    ("tool", "action", "by", "needle"),
    [
        ("t", "alow", "m", "unknown action 'alow' (allowed: allow, human_approval, deny, inherit)"),
        ("t", None, "m", "unknown action None"),
        ("", "allow", "m", "the tool name must be a non-empty string"),
        ("t\nx", "allow", "m", "the tool name contains a control character or a line break"),
        ("t", "allow", "", "`by` must be a non-empty string"),
        ("t", "allow", "m\n  - tools: ['*']\n    action: allow", "`by` contains a control character"),
        ("t", "allow", "x" * 201, "`by` is longer than 200 characters"),
        ("t" * 513, "deny", "m", "the tool name is longer than 512 characters"),
    ],
)
def test_bad_requests_are_refused(tool: str, action: object, by: str, needle: str) -> None:
    assert needle in refused(plan(CLAUDE, tool, action, by=by), 400).message


def test_action_values_are_accepted_as_enum_or_text() -> None:
    assert ok(plan(CLAUDE, "t", Action.DENY)).new_text == ok(plan(CLAUDE, "t", "deny")).new_text


def test_no_own_policy_is_404_and_a_glob_policy_is_not_own() -> None:
    text = 'name: claude\nagent: "claude*"\nrules: []\n'
    ps = policy_set(text)
    assert own_policy(ps, "claude") is None
    result = refused(
        plan_edit(text, policy=None, policy_set=ps, agent="claude", tool="t", action="allow", by="m",
                  date="2026-07-30"),
        404,
    )
    assert result.message == (
        'no policy is written for agent "claude" exactly; create one in the policy directory '
        '(name: ..., agent: "claude", rules: []) and try again'
    )


def test_the_draft_for_every_agent_is_edited_as_star() -> None:
    draft = "name: draft\nagent: '*'\nrules:\n  - tools: ['git.git_push']\n    action: human_approval\n"
    other = ("other.yaml", "name: other\nagent: nobody\nrules: []\n")
    ps = policy_set(draft, other)
    star = own_policy(ps, "*")
    assert star is not None and star.name == "draft"
    assert own_policy(ps, "claude") is None  # an agent id still needs a policy of its own
    edited = ok(plan_edit(draft, policy=star, policy_set=ps, agent="*", tool="git.git_push", action="deny",
                          by="marc", date="2026-07-30"))
    assert decide(edited.new_text, "git.git_push", None, other) is Action.DENY


def test_own_policy_is_the_first_exact_one_in_evaluation_order() -> None:
    a = 'name: a\nagent: "claude"\nrules: []\n'
    b = 'name: b\nagent: "claude"\nrules: []\n'
    star = 'name: c\nagent: "cl*"\nrules: []\n'
    ps = load_policies([PolicySource("b.yaml", b), PolicySource("c.yaml", star), PolicySource("a.yaml", a)])
    own = own_policy(ps, "claude")
    assert own is not None and own.name == "a"


def test_a_policy_not_in_the_set_is_a_caller_error() -> None:
    ps = policy_set(CLAUDE)
    stale = policy_set(CLAUDE.replace("gmail.*", "gmail.x*"))
    with pytest.raises(ValueError, match="must hold the policy"):
        plan_edit(CLAUDE, policy=own_policy(stale, "claude"), policy_set=ps, agent="claude", tool="t",
                  action="deny", by="m", date="d")


# ----------------------------------------------------------------------------- property


TOOLS = ["gmail.send_email", "gmail.list_x", "slack.post", "files.*"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(TOOLS), st.sampled_from(["allow", "deny", "human_approval",
                                                                  "inherit"])), max_size=6))
def test_any_sequence_of_edits_keeps_every_original_line_and_decides_as_asked(
    edits: list[tuple[str, str]],
) -> None:
    text = CLAUDE
    set_by_console: set[str] = set()
    for tool, action in edits:
        result = plan(text, tool, action)
        if isinstance(result, EditRefused):
            if action == "inherit":
                # Nothing of the console's to take away, and a hand-written rule names the tool.
                assert result.status == 409 and tool == "gmail.send_email" and tool not in set_by_console
            else:
                assert result.status == 400 and tool == "files.*" and action in ("allow", "human_approval")
            continue
        text = result.new_text
        if action == "inherit":
            set_by_console.discard(tool)
            original = explain(policy_set(CLAUDE), "claude", tool).fallthrough
            assert (result.after.action, result.after.policy) == (original.action, original.policy)
        else:
            set_by_console.add(tool)
            assert result.after_action is Action(action)
            assert decide(text, tool, {"to": "eve@x"}) is Action(action)
    # Everything written by hand is still there, in order; the rest are console rules.
    added = inserted_only(CLAUDE, text)
    assert len(added) == 3 * len(set_by_console)
    for tool in TOOLS:
        if tool not in set_by_console:
            assert decide(text, tool, {"to": "eve@x"}) is decide(CLAUDE, tool, {"to": "eve@x"})
    # Taking every console rule away gives the original file back, byte for byte.
    for tool in sorted(set_by_console):
        text = ok(plan(text, tool, "inherit")).new_text
    assert text == CLAUDE
