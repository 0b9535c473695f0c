"""``drawbridge approvals list|show|approve|deny|watch``: the approval queue, through the control plane.

An approval resolved here is recorded with channel ``cli`` (strength ``operator``: the admin token
authenticated the caller) and ``--by`` as given (default ``cli:<login>``). ``show`` and ``watch``
print the waiting call's arguments as the gateway holds them in memory while the approval is pending
(values under secret-like keys masked, long values cut), one value a line
(``approval.shown_arguments.argument_lines``: control and format characters as visible escapes,
lines folded to the terminal under a marker of their own); the state file never has them. ``list``
and ``show`` print every other field as the console does, each control or format character a visible
escape (``\\u202e``). An approval id is checked here as the gateway reads it (``state.ids``), so
a padded id or ``../grants`` is a usage error, never a request to another path.

``watch`` polls the pending approvals every ``--interval`` seconds and asks, for each new one (read
alone, with its arguments), ``[a]pprove / [d]eny / [s]kip ?`` on the terminal; it ends when its
input ends (or after one round with ``--once``).

Exit codes: 0 done; 1 refused or not found (unknown id, already resolved, expired); 2 usage error
or control plane unreachable.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import Any

import click
from rich.text import Text

from drawbridge.approval.notices import rule_named
from drawbridge.approval.shown_arguments import argument_lines
from drawbridge.canonical import escape_unsafe
from drawbridge.cli.control_client import Control, ControlError, control_options, default_person, id_prefix, segment
from drawbridge.cli.output import agent_id, cell_text, console, display_text, emit_json, key_values, table
from drawbridge.cli.seconds import Seconds

STATUSES = ("pending", "approved", "denied", "expired", "all")
ARGUMENTS_ENDED = "not shown once an approval has ended (the gateway lets go of them)"
ARGUMENTS_NOT_HELD = (
    "not held by this gateway process (another gateway on the same state file opened this approval, "
    "or more approvals are pending than it keeps arguments for): deny unless you know the call"
)
ARGUMENTS_ON_REPLICA = (
    "held by gateway {replica}, which asked for this approval, not by gateway {this} answering here: "
    "show it through {replica}'s control plane (--url) to see them, or deny unless you know the call"
)


@click.group(name="approvals", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Calls waiting for a person: list, show, approve, deny, watch."""


def _seconds(value: Any) -> str:
    if not isinstance(value, int) or value < 0:
        return "-"
    minutes, seconds = divmod(value, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _age(created_at: Any) -> str:
    if not isinstance(created_at, str):
        return "-"
    try:
        created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    return _seconds(int((datetime.now(UTC) - created).total_seconds()))


def _status(value: Any) -> Text:
    style = {"approved": "green", "denied": "red", "expired": "dim", "pending": "yellow"}.get(str(value), "")
    return Text(cell_text(str(value)), style=style)


@command.command(name="list")
@click.option("--status", type=click.Choice(STATUSES), default="pending", show_default=True)
@click.option("--tool", default=None, help="Only approvals for tools matching this glob.")
@click.option("--agent", default=None, callback=agent_id, help="Only approvals of this agent (an agent id).")
@control_options
def list_approvals(ctl: Control, status: str, tool: str | None, agent: str | None) -> None:
    """Approvals, most recent first (pending ones by default)."""
    params = {"status": status}
    if tool is not None:
        params["tool"] = tool
    if agent is not None:
        params["agent"] = agent
    approvals = ctl.client.get("/approvals", params)
    if ctl.json:
        emit_json(approvals)
        return
    rows = [
        [
            a.get("short_id"), _age(a.get("created_at")), a.get("agent"), a.get("tool"),
            _status(a.get("status")),
            _seconds(a.get("remaining_seconds")) if a.get("status") == "pending" else a.get("resolved_by"),
            a.get("policy"),
        ]
        for a in approvals
    ]
    columns = ["ID", "AGE", "AGENT", "TOOL", "STATUS", "REMAINING / BY", "RULE"]
    shown = [[_visible(cell) for cell in row] for row in rows]
    console().print(table(f"{len(approvals)} approvals ({status})", columns, shown))


def _visible(value: Any) -> Any:
    """Text as the console shows it: each control or format character a visible escape (``\\u202e``,
    ``\\n``), so a reason or a name reads as what was sent, not as U+FFFD standing for any of them."""
    return escape_unsafe(value) if isinstance(value, str) else value


def _rule(view: dict[str, Any]) -> str:
    """The rule that asked, or, for a call the gateway itself held (a catalogue floor: a changed
    pin), that no rule did: its reason is the ``why`` line."""
    named = rule_named(view.get("policy"), view.get("rule_index"), view.get("source_file"))
    return f"{named}, see why" if view.get("rule_index") is None else named


def _show(view: dict[str, Any]) -> None:
    findings = view.get("injection_findings") or []
    pairs: list[tuple[str, Any]] = [
        ("id", view.get("id")),
        ("agent", view.get("agent")),
        ("tool", view.get("tool")),
        ("status", _status(view.get("status"))),
        ("why", view.get("reason")),
        ("who may approve", "an operator only" if view.get("approver") == "operator" else "anyone asked"),
        ("rule", _rule(view)),
        ("argument shape", f"{view.get('args_shape')}, digest {view.get('args_digest')}"),
        ("remaining", _seconds(view.get("remaining_seconds"))),
    ]
    if view.get("replica"):
        pairs.append(("asked by gateway", view.get("replica")))  # a replica id, or a SQLite sharer's
    if findings:
        warning = "arguments look like injected instructions: " + ", ".join(map(str, findings))
        pairs.append(("WARNING", Text(cell_text(warning), style="bold red")))
    if view.get("status") != "pending":
        pairs += [("resolved by", view.get("resolved_by")), ("channel", view.get("channel")),
                  ("resolution", view.get("resolution_reason"))]
    grants = view.get("active_grants")
    if grants is not None:
        shown = ", ".join(f"{g.get('tools')} ({str(g.get('id', ''))[:8]})" for g in grants)
        pairs.append(("active grants", shown or "-"))
    recent = view.get("recent_calls")
    if recent is not None:
        pairs.append(("recent calls", len(recent)))
    visible = [(key, _visible(value)) for key, value in pairs]
    console().print(key_values(f"approval {view.get('short_id') or view.get('id')}", visible))
    if "arguments" in view:  # a detail view (a list carries none)
        _show_arguments(view)


def _show_arguments(view: dict[str, Any]) -> None:
    shown = view.get("arguments")
    if shown is None:
        why = _not_held(view) if view.get("status") == "pending" else ARGUMENTS_ENDED
        click.echo(display_text(f"arguments: {why}"))
        return
    click.echo("arguments (values under secret-like keys masked):")
    indent = "  "
    for line in argument_lines(shown, console().width - len(indent)):
        click.echo(indent + display_text(line))


def _not_held(view: dict[str, Any]) -> str:
    """Why a pending approval's arguments are not shown: the gateway that holds them (a replica on
    PostgreSQL, another process on a shared SQLite file: ``state.instances``)."""
    replica, this = view.get("replica"), view.get("this_replica")
    if isinstance(replica, str) and replica != this:
        return ARGUMENTS_ON_REPLICA.format(replica=repr(replica), this=repr(this) if this else "(none)")
    return ARGUMENTS_NOT_HELD


_approval_id = id_prefix("approval")


@command.command(name="show")
@click.argument("approval_id", callback=_approval_id)
@control_options
def show(ctl: Control, approval_id: str) -> None:
    """One approval (id or a prefix of at least 4 characters), with the agent's active grants."""
    view = ctl.client.get(f"/approvals/{segment(approval_id)}")
    if ctl.json:
        emit_json(view)
        return
    _show(view)


def _resolve(
    ctl: Control, approval_id: str, decision: str, by: str | None, reason: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"resolved_by": by or default_person(), "channel": "cli"}
    if reason:
        body["reason"] = reason
    result: dict[str, Any] = ctl.client.post(f"/approvals/{segment(approval_id)}/{decision}", body)
    return result


def _resolution_options(func: Any) -> Any:
    func = click.option("--reason", default=None, help="Why (recorded with the resolution).")(func)
    func = click.option("--by", default=None, help="Who decides (recorded as given; default cli:<login>).")(
        func
    )
    return click.argument("approval_id", callback=_approval_id)(func)


def _print_resolution(ctl: Control, result: dict[str, Any]) -> None:
    if ctl.json:
        emit_json(result)
        return
    view = result.get("approval") or {}
    line = f"{result.get('status')} {result.get('id')} ({view.get('agent')} -> {view.get('tool')})"
    click.echo(display_text(line))


@command.command(name="approve")
@_resolution_options
@control_options
def approve(ctl: Control, approval_id: str, by: str | None, reason: str | None) -> None:
    """Approve one waiting call (id or a unique prefix of at least 4 characters)."""
    _print_resolution(ctl, _resolve(ctl, approval_id, "approve", by, reason))


@command.command(name="deny")
@_resolution_options
@control_options
def deny(ctl: Control, approval_id: str, by: str | None, reason: str | None) -> None:
    """Deny one waiting call (id or a unique prefix of at least 4 characters)."""
    _print_resolution(ctl, _resolve(ctl, approval_id, "deny", by, reason))


@command.command(name="watch")
@click.option("--interval", type=Seconds(min=0.2, max=3600), default=2.0, show_default=True,
              help="Seconds between polls (0.2 to 3600).")
@click.option("--once", is_flag=True, help="Ask about the pending approvals once, then exit.")
@click.option("--by", default=None, help="Who decides (recorded as given; default cli:<login>).")
@control_options(formats=False)
def watch(ctl: Control, interval: float, once: bool, by: str | None) -> None:
    """Ask about each new pending approval: [a]pprove / [d]eny / [s]kip."""
    seen: set[str] = set()
    while True:
        pending = ctl.client.get("/approvals", {"status": "pending"})
        for view in reversed(pending):  # oldest first
            approval_id = view.get("id")
            if not isinstance(approval_id, str) or approval_id in seen:
                continue
            seen.add(approval_id)
            try:
                view = ctl.client.get(f"/approvals/{segment(approval_id)}")
            except ControlError as exc:
                if exc.status == 404:  # gone meanwhile
                    continue
                raise
            if view.get("status") != "pending":
                continue  # resolved or expired meanwhile
            _show(view)
            click.echo("[a]pprove / [d]eny / [s]kip ? ", nl=False)
            line = sys.stdin.readline()
            if not line:
                click.echo("\ninput closed; stopped watching")
                return
            answer = line.strip().lower()
            decision = {"a": "approve", "approve": "approve", "d": "deny", "deny": "deny"}.get(answer)
            if decision is None:
                click.echo("skipped")
                continue
            try:
                result = _resolve(ctl, approval_id, decision, by, None)
            except ControlError as exc:
                if exc.status in (404, 409):  # resolved or expired meanwhile: say so, keep watching
                    click.echo(exc.message, err=True)
                    continue
                raise
            _print_resolution(ctl, result)
        if once:
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return

