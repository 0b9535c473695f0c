"""Per-agent decision tables: provenance, conditional rules, floors, pin statuses, hiding denied tools."""

from __future__ import annotations

import pytest

from drawbridge.catalogue import PinStatus, classify_tool
from drawbridge.catalogue.decisions import (
    CatalogueTool,
    as_catalogue_tool,
    decision_row,
    decision_table,
    is_hidden,
)
from drawbridge.policy import Action, PolicySource, evaluate, load_policies

CLAUDE = """\
name: claude
agent: "claude"
rules:
  - tools: ["gmail.list_*"]
    action: allow
  - tools: ["gmail.send_email"]
    action: allow
    when:
      - {arg: to, op: starts_with, value: "ops@"}
      - {arg: cc, op: "==", value: null, if_missing: true}
  - tools: ["gmail.*"]
    action: human_approval
  - tools: ["db.query"]
    action: deny
    when:
      - {arg: sql, op: matches, value: "(?i)drop .*"}
  - tools: ["db.query"]
    action: allow
  - tools: ["fs.write_file"]
    action: allow
    when:
      - {arg: path, op: starts_with, value: "/tmp/"}
  - tools: ["fs.delete"]
    action: human_approval
    when:
      - {arg: path, op: starts_with, value: "/tmp/"}
schemas:
  gmail.send_email: {type: object, required: [to]}
"""

SHARED = """\
name: shared
agent: "*"
rules:
  - tools: ["gmail.*", "terraform.*"]
    action: allow
  - tools: ["*"]
    action: deny
"""


@pytest.fixture(scope="module")
def policies():
    return load_policies([PolicySource("claude.yaml", CLAUDE), PolicySource("shared.yaml", SHARED)])


def test_row_carries_the_fallthrough_decision_and_its_provenance(policies) -> None:
    send = classify_tool({"name": "gmail.send_email"})
    row = decision_row(policies, "claude", CatalogueTool("gmail.send_email", send))
    assert (row.action, row.policy_action, row.rule, row.source_file, row.rule_index, row.line) == (
        Action.HUMAN_APPROVAL, Action.HUMAN_APPROVAL, "claude", "claude.yaml", 2, 11,
    )
    assert [(c.rule_index, c.line, c.action, c.conditions) for c in row.conditional] == [
        (1, 6, Action.ALLOW, (("to", "starts_with"), ("cc", "=="))),
    ]
    assert not row.hidden and not row.by_floor and row.floor.action is Action.ALLOW
    assert [(s.policy, s.source_file, s.line) for s in row.schemas] == [("claude", "claude.yaml", 28)]
    assert row.as_dict() == {
        "name": "gmail.send_email",
        "classification": {"family": "named", "access": "write", "reasons": ['name verb "send"']},
        "action": "human_approval",
        "policy_action": "human_approval",
        "rule": "claude",
        "source_file": "claude.yaml",
        "rule_index": 2,
        "line": 11,
        "basis": "rule",
        "conditional": [
            {
                "action": "allow",
                "policy_action": "allow",
                "rule": "claude",
                "source_file": "claude.yaml",
                "rule_index": 1,
                "line": 6,
                "field": "to",
                "operator": "starts_with",
                "conditions": [{"field": "to", "operator": "starts_with"}, {"field": "cc", "operator": "=="}],
            }
        ],
        "floor": None,
        "by_floor": False,
        "pin_status": None,
        "dispatcher": False,
        "schemas": [{"policy": "claude", "source_file": "claude.yaml", "line": 28}],
        "hidden": False,
        "to_review": True,
    }


def test_other_agents_fall_to_the_shared_policy_and_the_default(policies) -> None:
    row = decision_row(policies, "cursor", ("gmail.send_email", None, None, False))
    assert (row.action, row.rule, row.source_file, row.rule_index, row.conditional) == (
        Action.ALLOW, "shared", "shared.yaml", 0, (),
    )
    nothing = load_policies([PolicySource("claude.yaml", CLAUDE)])
    row = decision_row(nothing, "cursor", ("slack.post",))
    assert (row.action, row.rule, row.source_file, row.rule_index, row.decision.basis.value) == (
        Action.DENY, None, None, None, "no_rule",
    )
    assert row.hidden


@pytest.mark.parametrize(
    ("status", "floor", "action", "by_floor", "reason"),
    [
        (None, Action.ALLOW, Action.ALLOW, False, None),
        (PinStatus.PINNED, Action.ALLOW, Action.ALLOW, False, None),
        (PinStatus.CHANGED, Action.HUMAN_APPROVAL, Action.HUMAN_APPROVAL, True,
         "pin status changed: the tool changed since its pinned version was accepted"),
        (PinStatus.NEW, Action.DENY, Action.DENY, True,
         "pin status new: the tool appeared after the server's catalogue was pinned"),
    ],
)
def test_pin_statuses_are_floors(policies, status, floor, action, by_floor, reason) -> None:
    row = decision_row(policies, "claude", CatalogueTool("gmail.list_emails", pin_status=status))
    assert row.policy_action is Action.ALLOW
    assert (row.floor.action, row.action, row.by_floor, row.pin_status) == (floor, action, by_floor, status)
    assert row.floor.reasons == ((reason,) if reason else ())
    assert row.as_dict()["pin_status"] == (None if status is None else status.value)
    expected_floor = None if reason is None else {"action": floor.value, "reasons": [reason]}
    assert row.as_dict()["floor"] == expected_floor
    assert row.hidden is (status is PinStatus.NEW)


def test_the_floor_applies_to_conditional_paths_too(policies) -> None:
    row = decision_row(policies, "claude", CatalogueTool("fs.write_file", pin_status=PinStatus.CHANGED))
    assert row.policy_action is Action.DENY and row.action is Action.DENY
    [path] = row.conditional
    assert (path.policy_action, path.action) == (Action.ALLOW, Action.HUMAN_APPROVAL)
    assert row.possible_actions == {Action.DENY, Action.HUMAN_APPROVAL}
    assert not row.hidden


def test_the_dispatcher_floor_is_applied(policies) -> None:
    classification = classify_tool({"name": "terraform.__dispatch"}, source="cli", cli_dispatcher=True)
    tool = CatalogueTool("terraform.__dispatch", classification, dispatcher=True)
    row = decision_row(policies, "claude", tool)
    assert (row.policy_action, row.action, row.by_floor) == (Action.ALLOW, Action.HUMAN_APPROVAL, True)
    assert row.floor.reasons[0].startswith("CLI dispatcher")
    strict = decision_row(
        policies, "claude",
        CatalogueTool("terraform.__dispatch", dispatcher=True, dispatcher_default_action=Action.DENY),
    )
    assert strict.action is Action.DENY and strict.hidden


@pytest.mark.parametrize(
    ("tool", "hidden", "why"),
    [
        ("slack.post", True, "fall-through deny, nothing conditional"),
        ("fs.write_file", False, "a conditional allow before a deny"),
        ("fs.delete", False, "a conditional human_approval before a deny"),
        ("db.query", False, "a conditional deny before an allow does not hide"),
        ("gmail.archive", False, "human_approval"),
        ("gmail.list_labels", False, "allow"),
    ],
)
def test_hidden_only_when_every_path_is_deny(policies, tool: str, hidden: bool, why: str) -> None:
    assert is_hidden(policies, "claude", tool) is hidden, why
    assert decision_row(policies, "claude", (tool,)).hidden is hidden


def test_a_hidden_tool_is_still_evaluated_and_refused(policies) -> None:
    assert is_hidden(policies, "claude", "slack.post")
    decision = evaluate(policies, "claude", "slack.post", {})
    assert (decision.action, decision.source_file, decision.rule_index) == (Action.DENY, "shared.yaml", 1)


def test_visible_tools_keep_the_catalogue_order(policies) -> None:
    tools = [
        ("slack.post", None, None, False),
        CatalogueTool("gmail.list_emails"),
        CatalogueTool("gmail.list_new", pin_status=PinStatus.NEW),
        ("fs.write_file", None, PinStatus.PINNED, False),
        ("db.query",),
        CatalogueTool("terraform.__dispatch", dispatcher=True),
    ]
    catalogue = [as_catalogue_tool(t) for t in tools]
    visible = [t.name for t in catalogue if not is_hidden(policies, "claude", t.name, t.floor)]
    assert visible == ["gmail.list_emails", "fs.write_file", "db.query", "terraform.__dispatch"]
    rows = decision_table(policies, "claude", tools)
    assert [r.name for r in rows] == [t[0] if isinstance(t, tuple) else t.name for t in tools]
    assert [r.name for r in rows if not r.hidden] == visible


def test_to_review_flags_allowed_tools_that_are_not_plain_named_reads(policies) -> None:
    read = classify_tool({"name": "gmail.list_emails"})
    write = classify_tool({"name": "fs.write_file"})
    generic = classify_tool({"name": "db.query", "inputSchema": {"properties": {"sql": {"type": "string"}}}})
    assert not decision_row(policies, "claude", CatalogueTool("gmail.list_emails", read)).to_review
    assert decision_row(policies, "claude", CatalogueTool("gmail.list_emails")).to_review
    assert decision_row(policies, "claude", CatalogueTool("fs.write_file", write)).to_review
    assert decision_row(policies, "claude", CatalogueTool("db.query", generic)).to_review
    assert not decision_row(policies, "claude", CatalogueTool("slack.post", write)).to_review
    assert not decision_row(
        policies, "claude", CatalogueTool("fs.write_file", write, PinStatus.CHANGED)
    ).to_review


def test_bad_catalogue_entries_are_refused(policies) -> None:
    with pytest.raises(ValueError):
        decision_row(policies, "claude", ("",))
    with pytest.raises(ValueError):
        decision_row(policies, "claude", ())  # type: ignore[arg-type]
