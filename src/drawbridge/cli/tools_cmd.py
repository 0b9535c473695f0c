"""``drawbridge tools list|decisions``: the served catalogue and what the policy decides per agent.

Exit codes: 0 done; 1 refused or not found; 2 usage error or control plane unreachable
(``drawbridge.cli.control_client``).
"""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from drawbridge.cli.control_client import Control, control_options
from drawbridge.cli.output import console, emit_json, plain, table


@click.group(name="tools", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """The tools the gateway serves, their classification, and per-agent decisions."""


def _reasons(classification: Any) -> str:
    if not isinstance(classification, dict):
        return "-"
    return "; ".join(str(r) for r in classification.get("reasons", []))


@command.command(name="list")
@control_options
def list_tools(ctl: Control) -> None:
    """Every served tool with its classification (family, access, reasons), pin status, and upstream
    (its kind -- mcp, openapi, cli -- and name)."""
    tools = ctl.client.get("/tools")
    if ctl.json:
        emit_json(tools)
        return
    rows = []
    for tool in tools:
        c = tool.get("classification") or {}
        rows.append([
            tool.get("name"), c.get("family"), c.get("access"), tool.get("pin_status"), _reasons(c),
            f"{tool.get('source')} {tool.get('server')}",
        ])
    console().print(table(f"{len(tools)} tools", ["TOOL", "FAMILY", "ACCESS", "PIN", "REASONS", "UPSTREAM"], rows))


def _action(value: Any) -> Text:
    style = {"allow": "green", "deny": "red", "human_approval": "yellow"}.get(str(value), "")
    return Text(str(value), style=style) if value is not None else plain(None)


def _where(row: dict[str, Any]) -> str:
    if row.get("rule") is None:
        return "default deny"
    return f"{row['rule']} #{row.get('rule_index')} ({row.get('source_file')})"


def _conditional(row: dict[str, Any]) -> str:
    parts = []
    for c in row.get("conditional") or []:
        where = f"{c.get('rule')} #{c.get('rule_index')}"
        parts.append(f"{c.get('action')} if {c.get('field')} {c.get('operator')} ({where})")
    return "; ".join(parts) or "-"


@command.command(name="decisions")
@click.option("--agent", required=True, help="The agent id to evaluate the policy for.")
@control_options
def decisions(ctl: Control, agent: str) -> None:
    """What the policy decides for AGENT on every tool, before any call (floors applied, grants not)."""
    rows = ctl.client.get("/tools/decisions", {"agent": agent})
    if ctl.json:
        emit_json(rows)
        return
    out = []
    for row in rows:
        floor = row.get("floor") or {}
        review = Text("review", style="bold yellow") if row.get("to_review") else plain("")
        out.append([
            row.get("name"),
            _action(row.get("action")),
            _where(row),
            _conditional(row),
            floor.get("action") if row.get("by_floor") else "-",
            row.get("pin_status"),
            "hidden" if row.get("hidden") else "-",
            review,
        ])
    title = f"decisions for agent {agent!r}"
    # HIDDEN: every path denies, so hide_denied_tools leaves it out of the agent's list.
    # REVIEW: some call could be allowed and the tool is not a plainly named read.
    columns = ["TOOL", "ACTION", "RULE", "CONDITIONAL", "FLOOR", "PIN", "HIDDEN", "REVIEW"]
    console().print(table(title, columns, out))
