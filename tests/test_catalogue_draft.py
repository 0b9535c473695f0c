"""The draft policy: it loads with the policy loader, and decides each tool as its classification says."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from drawbridge.catalogue import (
    Access,
    Classification,
    DraftTool,
    Family,
    Reason,
    ReasonCode,
    classify_tool,
    draft_action,
    escape_glob,
    generate_draft,
    origin_label,
)
from drawbridge.catalogue.draft import NOT_SERVED_NOTE
from drawbridge.catalogue.names import tool_name_problem
from drawbridge.policy import Action, evaluate, load_policy_text

DISPATCH = {
    "name": "terraform.__dispatch",
    "inputSchema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "args": {"type": "array"}, "flags": {"type": "object"},
                       "stdin": {"type": "string"}},
        "required": ["command"],
    },
}


def catalogue() -> list[DraftTool]:
    gmail = origin_label("mcp", "gmail")
    return [
        DraftTool("gmail.gmail_list_emails", classify_tool({"name": "gmail_list_emails"}), gmail),
        DraftTool("gmail.gmail_send_email", classify_tool({"name": "gmail_send_email"}), gmail),
        DraftTool("gmail.gmail_read_email", classify_tool({"name": "gmail_read_email"}), gmail),
        DraftTool("terraform.__dispatch", classify_tool(DISPATCH, source="cli", cli_dispatcher=True),
                  origin_label("cli", "terraform")),
        DraftTool("terraform.plan", classify_tool({"name": "terraform.plan"}, source="cli"),
                  origin_label("cli", "terraform")),
        DraftTool("list_pets", classify_tool({"name": "list_pets"}, source="openapi", openapi_method="GET"),
                  origin_label("openapi")),
        DraftTool("create_pet",
                  classify_tool({"name": "create_pet"}, source="openapi", openapi_method="POST"),
                  origin_label("openapi")),
    ]


EXPECTED_TEXT = '''\
# Draft policy from `drawbridge discover --generate-policy`. Review every rule before use.
# The classification in each comment is advice read from what the upstream declares about
# the tool; nothing in it is verified. Named tools that read are allowed; writes, generic
# tools and tools with no signal need a human's approval; anything else is denied.
name: "draft"
agent: "*"
rules:
  # MCP server "gmail": reads through a named tool
  #   gmail.gmail_list_emails [named, read] name verb "list"
  - tools: ["gmail.gmail_list_emails"]
    action: allow
  #   gmail.gmail_read_email [named, read] name verb "read"
  - tools: ["gmail.gmail_read_email"]
    action: allow
  # MCP server "gmail": writes, generic tools, or no signal
  #   gmail.gmail_send_email [named, write] name verb "send"
  - tools: ["gmail.gmail_send_email"]
    action: human_approval
  # CLI tool "terraform": writes, generic tools, or no signal
  #   terraform.__dispatch [generic, unknown] CLI dispatcher; string argument "command"
  - tools: ["terraform.__dispatch"]
    action: human_approval
  #   terraform.plan [named, unknown] no signal
  - tools: ["terraform.plan"]
    action: human_approval
  # OpenAPI: reads through a named tool
  #   list_pets [named, read] HTTP method GET; name verb "list"
  - tools: ["list_pets"]
    action: allow
  # OpenAPI: writes, generic tools, or no signal
  #   create_pet [named, write] HTTP method POST; name verb "create"
  - tools: ["create_pet"]
    action: human_approval
  # every tool not listed above
  - tools: ["*"]
    action: deny
'''


def test_draft_text() -> None:
    assert generate_draft(catalogue()) == EXPECTED_TEXT


def test_draft_loads_and_decides_as_classified() -> None:
    policies = load_policy_text(generate_draft(catalogue()), "draft.yaml")
    expected = {
        "gmail.gmail_list_emails": Action.ALLOW,
        "gmail.gmail_read_email": Action.ALLOW,
        "gmail.gmail_send_email": Action.HUMAN_APPROVAL,
        "terraform.__dispatch": Action.HUMAN_APPROVAL,
        "terraform.plan": Action.HUMAN_APPROVAL,
        "list_pets": Action.ALLOW,
        "create_pet": Action.HUMAN_APPROVAL,
    }
    for name, action in expected.items():
        decision = evaluate(policies, "some-agent", name, {})
        assert decision.action is action, name
        assert decision.policy == "draft" and decision.source_file == "draft.yaml"
    for stranger in ("gmail.gmail_delete_email", "terraform.destroy", "gmail.*", ""):
        decision = evaluate(policies, "some-agent", stranger, {})
        assert decision.action is Action.DENY
        assert decision.rule_index == len(expected)


def test_draft_action_table() -> None:
    read = Reason(ReasonCode.NAME_VERB_READ, 'name verb "get"', "get")
    write = Reason(ReasonCode.NAME_VERB_WRITE, 'name verb "send"', "send")
    generic = Reason(ReasonCode.GENERIC_ARGUMENT, 'string argument "sql"', "sql")
    assert draft_action(Classification.from_reasons([read])) is Action.ALLOW
    assert draft_action(Classification.from_reasons([write])) is Action.HUMAN_APPROVAL
    assert draft_action(Classification.from_reasons([read, write])) is Action.HUMAN_APPROVAL
    assert draft_action(Classification.from_reasons([generic, read])) is Action.HUMAN_APPROVAL
    assert draft_action(Classification.from_reasons([])) is Action.HUMAN_APPROVAL


def test_empty_catalogue_is_only_the_final_deny() -> None:
    text = generate_draft([], policy_name="nothing", agent="ci-*")
    policies = load_policy_text(text, "nothing.yaml")
    assert evaluate(policies, "ci-bot", "anything", {}).action is Action.DENY
    assert evaluate(policies, "ci-bot", "anything", {}).rule_index == 0


def test_repeated_or_empty_names_are_refused() -> None:
    c = classify_tool({"name": "get_x"})
    with pytest.raises(ValueError, match="twice"):
        generate_draft([DraftTool("s.get_x", c), DraftTool("s.get_x", c)])
    with pytest.raises(ValueError, match="non-empty"):
        generate_draft([DraftTool("", c)])


READ = classify_tool({"name": "get_thing"})
WRITE = classify_tool({"name": "delete_thing"})


def test_a_read_with_glob_characters_is_not_allowed_and_its_rule_matches_only_itself() -> None:
    tools = [
        DraftTool("files.read*", READ),
        DraftTool("files.readme", WRITE),
        DraftTool("files.get_[x]", READ),
    ]
    text = generate_draft(tools)
    assert '- tools: ["files.read\\\\*"]' in text
    assert "name has glob characters, so the draft does not allow it" in text
    policies = load_policy_text(text, "draft.yaml")
    assert evaluate(policies, "a", "files.read*", {}).action is Action.HUMAN_APPROVAL
    assert evaluate(policies, "a", "files.readme", {}).action is Action.HUMAN_APPROVAL
    assert evaluate(policies, "a", "files.readable", {}).action is Action.DENY
    assert evaluate(policies, "a", "files.get_[x]", {}).action is Action.HUMAN_APPROVAL
    assert evaluate(policies, "a", "files.get_x", {}).action is Action.DENY


def test_hostile_names_cannot_add_rules_or_comments() -> None:
    hostile = 'x"]\n    action: allow\n  - tools: ["*"]\n    action: allow\n#'
    tools = [
        DraftTool(hostile, WRITE, 'MCP server "evil\nname: other"'),
        DraftTool("caf\u00e9.get_menu", READ),
        DraftTool("\U0001f600.get", READ),
        DraftTool("line\u2028sep.get", READ),
        DraftTool("nel\x85.get", READ),
        DraftTool("nul\x00.get", READ),
        DraftTool("lone\ud800.get", READ),
    ]
    text = generate_draft(tools)
    assert text.isascii()
    body = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    # The names the gateway never serves (a control, format or separator character) get no rule, since
    # the loader refuses such a glob; a comment says so, and the final deny covers them.
    assert sum(1 for line in body if line.startswith("  - tools:")) == 2 + 1
    assert text.count(NOT_SERVED_NOTE) == 5
    policies = load_policy_text(text, "draft.yaml")
    assert evaluate(policies, "a", "caf\u00e9.get_menu", {}).action is Action.ALLOW
    assert evaluate(policies, "a", "\U0001f600.get", {}).action is Action.ALLOW
    for never_served in (hostile, "line\u2028sep.get", "nel\x85.get", "nul\x00.get", "lone\ud800.get"):
        assert evaluate(policies, "a", never_served, {}).action is Action.DENY
    assert evaluate(policies, "a", "x", {}).action is Action.DENY


def test_escape_glob() -> None:
    assert escape_glob("a*b?c[d]e\\f") == "a\\*b\\?c\\[d]e\\\\f"
    assert escape_glob("plain.name") == "plain.name"


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=120, deadline=None)
@given(
    entries=st.lists(st.tuples(names, st.sampled_from(["read", "write", "generic", "none"])), max_size=8,
                     unique_by=lambda e: e[0]),
    stranger=names,
)
def test_any_catalogue_drafts_a_policy_that_decides_each_tool_as_drafted(
    entries: list[tuple[str, str]], stranger: str
) -> None:
    by_kind: dict[str, Any] = {
        "read": READ,
        "write": WRITE,
        "generic": classify_tool({"name": "x", "inputSchema": {"properties": {"code": {}}}}),
        "none": classify_tool({"name": "x"}),
    }
    tools = [
        DraftTool(name, by_kind[kind], f"origin {index % 2}") for index, (name, kind) in enumerate(entries)
    ]
    text = generate_draft(tools)
    policies = load_policy_text(text, "draft.yaml")
    for tool in tools:
        plain = not any(char in "*?[\\" for char in tool.name)
        expected = Action.ALLOW if tool.classification.is_named_read and plain else Action.HUMAN_APPROVAL
        if tool_name_problem(tool.name) is not None:
            expected = Action.DENY  # never served, so not drafted: the final deny
        assert evaluate(policies, "agent", tool.name, {}).action is expected
    assume(stranger not in {t.name for t in tools} and stranger not in {escape_glob(t.name) for t in tools})
    assert evaluate(policies, "agent", stranger, {}).action is Action.DENY


def test_classification_of_draft_kinds_is_what_the_page_says() -> None:
    assert (READ.family, READ.access) == (Family.NAMED, Access.READ)
    assert (WRITE.family, WRITE.access) == (Family.NAMED, Access.WRITE)
