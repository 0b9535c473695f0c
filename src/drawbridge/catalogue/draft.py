"""A draft native policy written from a classified catalogue: strict by default, one rule per tool.

Invariant: the draft allows a tool only when it is a named tool that reads, and only through a
rule that cannot match any other tool; every other tool gets ``human_approval``; a final
``tools: ["*"]`` rule denies whatever the catalogue did not list. The text loads with
``drawbridge.policy`` unchanged (docs/policy-format.md), and each rule is preceded by a comment
carrying the tool's classification and reasons, so the person reviewing it sees why.

Theory of operation. Tools are grouped by origin (``MCP server "github"``, ``CLI tool
"terraform"``, ``OpenAPI``) in the order the origins first appear; within an origin the allowed
reads come first, then the rest, each in catalogue order. A header comment opens each run of
rules of one kind (``reads through a named tool`` / ``writes, generic tools, or no signal``).
Since every rule names one tool, the order changes nothing but readability.

A name the gateway never decides on (``catalogue.names.tool_name_problem``: a control or format
character, edge whitespace; ``discover`` does not list such tools) gets no rule, since the loader
refuses such a glob in ``tools``: a comment says why and the final deny covers it.

Tool names are written as YAML double-quoted strings in which every character outside printable
ASCII is escaped, and glob metacharacters (``* ? [ \\``) are escaped with ``\\`` so that a rule
matches its tool literally. The policy engine also matches a pattern equal to the value, so an
escaped pattern (``foo\\*``) matches a second, oddly named tool (literally ``foo\\*``) as well:
such a rule is never an ``allow``, and a named read whose name needs escaping gets
``human_approval`` with a note saying so. A rule that catches another tool can therefore only
make it stricter. Comments show names and reasons in printable ASCII only, so no upstream text
can end a comment line or smuggle in a rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from drawbridge.catalogue.classify import Classification, Source
from drawbridge.catalogue.names import tool_name_problem
from drawbridge.policy.globs import GLOB_METACHARACTERS, escape_glob
from drawbridge.policy.model import Action
from drawbridge.policy.yaml_text import comment_text, quoted

READS_HEADER: Final = "reads through a named tool"
OTHERS_HEADER: Final = "writes, generic tools, or no signal"
GLOB_NOTE: Final = "name has glob characters, so the draft does not allow it"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._:/@+-]+")


@dataclass(frozen=True, slots=True)
class DraftTool:
    """One catalogue entry: the name the agent calls, its classification, where it comes from."""

    name: str
    classification: Classification
    origin: str = ""


def origin_label(source: Source, server: str | None = None) -> str:
    """``MCP server "github"``, ``CLI tool "terraform"``, ``OpenAPI`` (the labels of the comments)."""
    if source == "mcp":
        return f"MCP server {quoted(server or '')}"
    if source == "cli":
        return f"CLI tool {quoted(server or '')}"
    if source == "openapi":
        return "OpenAPI" if server is None else f"OpenAPI {quoted(server)}"
    raise ValueError(f"unknown tool source {source!r}")


def draft_action(classification: Classification) -> Action:
    """Named reads allow; writes, generic tools and tools with no signal need a human."""
    return Action.ALLOW if classification.is_named_read else Action.HUMAN_APPROVAL


def _shown_name(name: str) -> str:
    return name if _PLAIN_NAME.fullmatch(name) else quoted(name)


@dataclass(frozen=True, slots=True)
class _Rule:
    tool: DraftTool
    action: Action
    glob_note: bool


NOT_SERVED_NOTE: Final = "not drafted: the gateway never serves this name"


def _rule(tool: DraftTool) -> _Rule:
    action = draft_action(tool.classification)
    needs_escape = any(char in GLOB_METACHARACTERS for char in tool.name)
    if action is Action.ALLOW and needs_escape:
        return _Rule(tool, Action.HUMAN_APPROVAL, True)
    return _Rule(tool, action, False)


def generate_draft(
    tools: Iterable[DraftTool],
    *,
    policy_name: str = "draft",
    agent: str = "*",
    description: str | None = None,
) -> str:
    """The draft policy file as text. Raises ``ValueError`` for an empty or repeated tool name."""
    entries = list(tools)
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry.name, str) or not entry.name:
            raise ValueError("a tool in the draft needs a non-empty name")
        if entry.name in seen:
            raise ValueError(f"tool {quoted(entry.name)} appears twice in the catalogue")
        seen.add(entry.name)
    if not policy_name or not agent:
        raise ValueError("the draft policy needs a name and an agent glob")

    origins: dict[str, list[_Rule]] = {}
    for entry in entries:
        origins.setdefault(entry.origin, []).append(_rule(entry))

    lines = [
        "# Draft policy from `drawbridge discover --generate-policy`. Review every rule before use.",
        "# The classification in each comment is advice read from what the upstream declares about",
        "# the tool; nothing in it is verified. Named tools that read are allowed; writes, generic",
        "# tools and tools with no signal need a human's approval; anything else is denied.",
        f"name: {quoted(policy_name)}",
        f"agent: {quoted(agent)}",
    ]
    if description is not None:
        lines.append(f"description: {quoted(description)}")
    lines.append("rules:")
    for origin, rules in origins.items():
        allowed = [r for r in rules if r.action is Action.ALLOW]
        ordered = allowed + [r for r in rules if r.action is not Action.ALLOW]
        header: str | None = None
        for rule in ordered:
            kind = READS_HEADER if rule.action is Action.ALLOW else OTHERS_HEADER
            if kind != header:
                header = kind
                prefix = f"{comment_text(origin)}: " if origin else ""
                lines.append(f"  # {prefix}{kind}")
            note = f"; {GLOB_NOTE}" if rule.glob_note else ""
            summary = comment_text(rule.tool.classification.summary())
            problem = tool_name_problem(rule.tool.name)
            if problem is not None:
                shown = comment_text(_shown_name(rule.tool.name))
                lines.append(f"  #   {shown} {NOT_SERVED_NOTE} ({problem})")
                continue
            lines.append(f"  #   {comment_text(_shown_name(rule.tool.name))} {summary}{note}")
            lines.append(f"  - tools: [{quoted(escape_glob(rule.tool.name))}]")
            lines.append(f"    action: {rule.action.value}")
    lines += [
        "  # every tool not listed above",
        '  - tools: ["*"]',
        "    action: deny",
    ]
    return "\n".join(lines) + "\n"
