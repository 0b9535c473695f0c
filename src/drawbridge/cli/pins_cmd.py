"""``drawbridge pins list|accept``: tools held back by pinning, and accepting their current definitions.

``accept --server S`` accepts everything server S offers now; ``accept --tools T [T ...]`` accepts the
named tools (as agents see them, e.g. ``github.create_issue``). Each accepted tool is recorded in the
trace chain as ``mesh.pin_accept`` with both descriptions and the new fingerprint.

Exit codes: 0 done; 1 refused or not found (pinning off, unknown server or tool); 2 usage error or
control plane unreachable.
"""

from __future__ import annotations

import click

from drawbridge.cli.control_client import Control, control_options, default_person
from drawbridge.cli.output import console, emit_json, table


@click.group(name="pins", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Held-back tools (new or changed since their catalogue was pinned) and accepting them."""


@command.command(name="list")
@control_options
def list_pins(ctl: Control) -> None:
    """Held-back tools with the pinned and the current description."""
    held = ctl.client.get("/tools/pins")
    if ctl.json:
        emit_json(held)
        return
    rows = []
    for tool in held:
        pinned = tool.get("pinned") or {}
        current = tool.get("current") or {}
        row = [tool.get("name"), tool.get("status"), pinned.get("description"), current.get("description")]
        rows.append(row)
    columns = ["TOOL", "STATUS", "PINNED DESCRIPTION", "CURRENT DESCRIPTION"]
    console().print(table(f"{len(held)} held back", columns, rows))


@command.command(name="accept")
@click.option("--server", help="Accept every tool this upstream server offers now.")
@click.option("--tools", "tools", multiple=True, metavar="TOOL", help="A tool to accept (more may follow).")
@click.argument("more", nargs=-1, metavar="[TOOL]...")
@click.option("--by", default=None, help="Who accepts (recorded as given; default cli:<login>).")
@control_options
def accept(
    ctl: Control, server: str | None, tools: tuple[str, ...], more: tuple[str, ...], by: str | None
) -> None:
    """Accept held-back tools: --server S, or --tools T [T ...]."""
    names = [*tools, *more]
    if more and not tools:
        raise click.UsageError("name tools after --tools (e.g. --tools github.create_issue github.get_repo)")
    if (server is None) == (not names):
        raise click.UsageError("give --server S or --tools T [T ...], exactly one of the two")
    body: dict[str, object] = {"by": by or default_person()}
    if server is not None:
        body["server"] = server
    else:
        body["tools"] = names
    result = ctl.client.post("/tools/pins/accept", body)
    if ctl.json:
        emit_json(result)
        return
    accepted = result.get("accepted", [])
    if not accepted:
        click.echo("nothing to accept: every tool named is already pinned as it is now")
        return
    rows = [
        [
            a.get("name"), "removed" if a.get("removed") else a.get("fingerprint"),
            a.get("previous_description"), a.get("description"),
        ]
        for a in accepted
    ]
    console().print(table(f"{len(accepted)} accepted", ["TOOL", "FINGERPRINT", "WAS", "NOW"], rows))

