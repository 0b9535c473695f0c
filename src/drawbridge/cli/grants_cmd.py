"""``drawbridge grants create|list|revoke``: temporal grants, through the control plane.

A grant lets an agent (glob) run tools (glob) that need a person's approval without asking, for a
while (at most 24 hours). It never lifts ``deny``. Each creation and revocation is recorded in the
trace chain by the gateway.

Exit codes: 0 done; 1 refused or not found (a glob the gateway refuses, unknown or already revoked
id); 2 usage error (including a duration that does not parse or is not within 1 s to 24 h, the
gateway's bound ``state.grants.DEFAULT_MAX_DURATION``, and an id that is not one) or control plane
unreachable.
"""

from __future__ import annotations

from typing import Any

import click

from drawbridge.approval.durations import DurationError, parse_duration
from drawbridge.cli.control_client import Control, control_options, default_person, id_prefix, segment
from drawbridge.cli.output import console, display_text, emit_json, table


@click.group(name="grants", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Temporal grants: create, list, revoke."""


def _remaining(seconds: Any) -> str:
    if not isinstance(seconds, int) or seconds <= 0:
        return "-"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    shown = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return shown + (f"{secs}s" if secs and not hours else "")


def _rows(grants: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            g.get("id"), g.get("agent"), g.get("tools"), g.get("expires_at"),
            _remaining(g.get("remaining_seconds")), g.get("granted_by"), "yes" if g.get("active") else "no",
        ]
        for g in grants
    ]


_COLUMNS = ["ID", "AGENT", "TOOLS", "EXPIRES", "REMAINING", "BY", "ACTIVE"]


@command.command(name="create")
@click.option("--agent", required=True, help="Agent id or glob the grant applies to.")
@click.option("--tools", required=True, help="Tool glob the grant covers (e.g. 'github.*').")
@click.option("--for", "duration", required=True, help="How long: 90s, 30m, 2h, 1h30m (at most 24h).")
@click.option("--by", default=None, help="Who grants (recorded as given; default cli:<login>).")
@control_options
def create(ctl: Control, agent: str, tools: str, duration: str, by: str | None) -> None:
    """Let AGENT run TOOLS without asking, for a while (human_approval becomes allow; deny stays deny)."""
    from drawbridge.state.grants import DEFAULT_MAX_DURATION  # the gateway's bound, which a suggestion fits

    try:  # the spelling and the gateway's own bound are checked here, before any request
        parse_duration(duration, maximum=DEFAULT_MAX_DURATION, suggest_within=DEFAULT_MAX_DURATION)
    except DurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    body = {"agent": agent, "tools": tools, "duration": duration, "by": by or default_person()}
    grant = ctl.client.post("/grants", body)
    if ctl.json:
        emit_json(grant)
        return
    click.echo(display_text(
        f"granted {grant.get('id')}: agent {grant.get('agent')} may run {grant.get('tools')} "
        f"until {grant.get('expires_at')}"
    ))


@command.command(name="list")
@click.option("--all", "everything", is_flag=True, help="Every grant ever made, expired and revoked too.")
@control_options
def list_grants(ctl: Control, everything: bool) -> None:
    """Grants in force now."""
    grants = ctl.client.get("/grants", {"all": "true"} if everything else None)
    if ctl.json:
        emit_json(grants)
        return
    console().print(table(f"{len(grants)} grants", _COLUMNS, _rows(grants)))


@command.command(name="revoke")
@click.argument("grant_id", callback=id_prefix("grant"))
@click.option("--by", default=None, help="Who revokes (recorded as given; default cli:<login>).")
@control_options
def revoke(ctl: Control, grant_id: str, by: str | None) -> None:
    """Revoke a grant (id or a unique prefix of at least 4 characters)."""
    result = ctl.client.delete(f"/grants/{segment(grant_id)}", {"by": by or default_person()})
    if ctl.json:
        emit_json(result)
        return
    click.echo(display_text(f"revoked {result.get('id')}"))
