"""``drawbridge policy set|list|shadow``: change one tool's action for one agent, show the policies in
force, or what the shadow policy would have decided (``GET /shadow``);
``check``, ``explain`` and ``test`` work offline, without a gateway (``policy_offline``).

``set`` goes through the control plane (``PUT /policies/{agent}/tools/{tool}``), which edits the
agent's policy file as text (comments stay), keeps ``<file>.bak``, reloads, and records the edit in
the trace chain as ``mesh.policy_edit``. ``--by`` is recorded as given.

Exit codes: 0 done; 1 refused (no policy for the agent, a tool the gateway does not serve without
``--unserved``, a hand-written rule for ``inherit``, a policy set that would not load, no shadow policy
for ``shadow``); 2 usage error (a name with a control character or a line break included) or control
plane unreachable.
"""

from __future__ import annotations

import click

from drawbridge.catalogue.names import shown_name, tool_name_problem
from drawbridge.cli.control_client import DOT_SEGMENTS, Control, control_options, segment
from drawbridge.config_reader import AGENT_GLOB, AGENT_ID_CHARS
from drawbridge.cli.output import console, display_text, emit_json, key_values, table
from drawbridge.cli.policy_offline import check, explain, test
from drawbridge.policy.edit import conditional_text

ACTIONS = ("allow", "deny", "human_approval", "inherit")


@click.group(name="policy", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Per-tool policy edits and the policies in force."""


@command.command(name="set")
@click.argument("agent")
@click.argument("tool")
@click.argument("action", type=click.Choice(ACTIONS))
@click.option("--by", required=True, help="Who makes the change (recorded as given, in the file and trace).")
@click.option("--unserved", is_flag=True,
              help="TOOL is not served by the gateway (yet): write the rule anyway.")
@control_options
def set_action(ctl: Control, agent: str, tool: str, action: str, by: str, unserved: bool) -> None:
    """Set TOOL's ACTION for AGENT, for every call (inherit removes a rule set this way)."""
    problem = _agent_problem(agent) or _tool_problem(tool)
    if problem is not None:
        raise click.UsageError(problem)
    body: dict[str, object] = {"action": action, "by": by}
    if unserved:
        body["unserved"] = True
    result = ctl.client.put(f"/policies/{segment(agent)}/tools/{segment(tool)}", body)
    if ctl.json:
        emit_json(result)
        return
    before, after = result.get("action_before"), result.get("action_after")
    summary = f"{before} -> {after}" if result.get("changed") else f"{after} (unchanged)"
    rows = [
        ("action", summary),
        ("file", result.get("source_file")),
        ("rule", result.get("rule_index")),
        ("placement", result.get("placement")),
        ("backup", result.get("backup")),
        ("by", result.get("by")),
    ]
    conditional = conditional_text(result.get("after"))
    if conditional is not None:
        rows.insert(1, ("before that", conditional))
    console().print(key_values(f"{agent} / {tool}", rows))


def _agent_problem(agent: str) -> str | None:
    """An AGENT no policy edit can take, refused here before any request: an agent id as serve and wrap
    take them (``config_reader.AGENT_ID``), or a glob over such ids as a policy writes it (``*``); never
    ``.`` or ``..``, which would be sent as another path."""
    if agent in DOT_SEGMENTS or not AGENT_GLOB.fullmatch(agent):
        return f"AGENT {shown_name(agent)!r} is not an agent id (ids use only {AGENT_ID_CHARS}) or a glob over them"
    return None


def _tool_problem(tool: str) -> str | None:
    """A TOOL no policy edit can take, refused here as the gateway refuses the name of a call."""
    problem = tool_name_problem(tool)
    if problem is None and tool in DOT_SEGMENTS:
        problem = "tool name is a dot segment ('.' or '..'), which names no tool"
    return f"TOOL: {problem}" if problem is not None else None


@command.command(name="list")
@control_options
def list_policies(ctl: Control) -> None:
    """The policies in force, in evaluation order."""
    policies = ctl.client.get("/policies")
    if ctl.json:
        emit_json(policies)
        return
    rows = []
    for policy in policies:
        for rule in policy.get("rules", []):
            conditions = " and ".join(f"{c['field']} {c['operator']}" for c in rule.get("conditions", []))
            rows.append([
                policy.get("name"), policy.get("agent"), rule.get("index"), ", ".join(rule.get("tools", [])),
                rule.get("action"), conditions or "-", policy.get("source_file"),
            ])
    columns = ["POLICY", "AGENT", "#", "TOOLS", "ACTION", "WHEN", "FILE"]
    console().print(table(f"{len(policies)} policies", columns, rows))


@command.command(name="shadow")
@control_options
def shadow(ctl: Control) -> None:
    """What the shadow policy would have decided of the calls so far, beside what was enforced."""
    report = ctl.client.get("/shadow")
    if ctl.json:
        emit_json(report)
        return
    policy = report.get("shadow_policy") or {}
    rows = [
        [row.get("agent"), row.get("tool"), row.get("action"), row.get("shadow_action"),
         "yes" if row.get("differs") else "no", row.get("calls")]
        if not row.get("overflow") else
        ["(other)", "(other)", "-", "-", f"{row.get('differing')} of them", row.get("calls")]
        for row in report.get("rows", [])
    ]
    title = (f"shadow policy {policy.get('path')} (generation {policy.get('generation')}): "
             f"{report.get('calls')} calls, {report.get('differing')} differing")
    console().print(table(title, ["AGENT", "TOOL", "ENFORCED", "SHADOW", "DIFFERS", "CALLS"], rows))
    if policy.get("last_error"):
        click.echo(display_text(f"the shadow policy's last reload failed: {policy['last_error']}"), err=True)


for _offline in (check, explain, test):
    command.add_command(_offline)
