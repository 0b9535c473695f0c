"""``drawbridge pins list|show|accept``: tools (and prompts) held back by pinning, what changed, and
accepting them. Every row has a kind (``tool``, or ``prompt`` under ``pin_prompts``); ``--kind
prompt`` names prompts in ``show`` and ``accept`` (a tool and a prompt may share a name).

An accept is bound to what a person reviewed: ``--fingerprint TOOL=sha256:...`` (the current
fingerprint ``pins show TOOL`` or ``pins list`` printed) or ``--reviewed FILE`` (the output of
``pins list --format json``) names the definitions to pin, and the control plane refuses (409,
nothing accepted) when the server offers anything else by then. ``--current`` pins whatever the
server offers at the moment of the accept, reviewed or not, and must be asked for by name.
``accept --server S`` accepts every held-back tool of server S; ``--tools T [T ...]`` the named
tools (as agents see them, e.g. ``github.create_issue``); with neither, the tools the fingerprints
name. Each accepted tool is recorded in the trace chain as ``mesh.pin_accept`` with both
descriptions and the new fingerprint.

Exit codes: 0 done; 1 refused or not found (pinning off, unknown server or tool, not held back,
changed since it was reviewed); 2 usage error or control plane unreachable.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from drawbridge.cli.control_client import Control, ControlError, control_options, default_person
from drawbridge.cli.output import EXIT_FAILED, console, display_text, emit_json, table


UNPINNABLE = "unpinnable"
"""The status of an item the server offers that no pin can hold (listed twice, no fingerprint)."""

KIND_OPTION = click.option(
    "--kind", type=click.Choice(["tool", "prompt"]), default=None,
    help="What the names are: tools (the default) or prompts (pin_prompts).",
)


@click.group(name="pins", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Held-back tools and prompts (new or changed since they were pinned), what changed, accepting them."""


@command.command(name="list")
@click.option("--kind", type=click.Choice(["tool", "prompt"]), default=None,
              help="List only held-back tools, or only prompts (default: both).")
@control_options
def list_pins(ctl: Control, kind: str | None) -> None:
    """Held-back tools (and prompts) with the pinned and the current fingerprint and description."""
    held = ctl.client.get("/tools/pins" if kind is None else f"/tools/pins?kind={kind}")
    if ctl.json:
        emit_json(held)
        return
    rows = []
    for tool in held:
        pinned = tool.get("pinned") or {}
        current = tool.get("current") or {}
        rows.append([
            tool.get("name"), tool.get("kind", "tool"), tool.get("status"), pinned.get("description"),
            tool.get("reason") or current.get("description"), current.get("fingerprint"),
        ])
    columns = ["NAME", "KIND", "STATUS", "PINNED DESCRIPTION", "CURRENT DESCRIPTION", "CURRENT FINGERPRINT"]
    console().print(table(f"{len(held)} held back", columns, rows))
    if held:
        click.echo("see what changed: drawbridge pins show NAME (--kind prompt for a prompt)")


@command.command(name="show")
@click.argument("tool")
@KIND_OPTION
@control_options
def show(ctl: Control, tool: str, kind: str | None) -> None:
    """A held-back tool's (or prompt's) pinned and current definitions, their fingerprints and a diff."""
    held = [t for t in ctl.client.get("/tools/pins")
            if t.get("name") == tool and (kind is None or t.get("kind", "tool") == kind)]
    if not held:
        raise ControlError(f"{display_text(tool)!r} is not held back: nothing to show", EXIT_FAILED)
    if len(held) > 1:
        raise click.UsageError(f"a tool and a prompt are named {display_text(tool)!r}: give --kind tool or --kind prompt")
    row = held[0]
    kind = row.get("kind", "tool")
    if ctl.json:
        emit_json(row)
        return
    pinned, current = row.get("pinned") or {}, row.get("current") or {}
    click.echo(f"{kind}: {display_text(str(row.get('name')))} ({row.get('status')})")
    if row.get("reason"):  # offered as nothing a pin can hold: there is nothing to accept
        click.echo(display_text(str(row["reason"])))
        return
    click.echo(f"pinned fingerprint:  {pinned.get('fingerprint') or f'(none: a new {kind})'}")
    click.echo(f"current fingerprint: {current.get('fingerprint')}")
    if pinned and pinned.get("definition") is None:
        click.echo("the pinned definition predates the store keeping it; its description was:")
        click.echo(_pretty(pinned.get("description")))
    before = _pretty(pinned.get("definition")) if pinned.get("definition") is not None else ""
    now = current.get("definition")
    after = _pretty(now if now is not None else current.get("description"))
    click.echo("--- pinned")
    click.echo("+++ current")
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=3):
        if not line.startswith(("---", "+++")):
            click.echo(line)
    bound = f"{display_text(tool)}={current.get('fingerprint')}"
    flag = "" if kind == "tool" else f"--kind {kind} "
    click.echo(f"accept exactly this: drawbridge pins accept {flag}--fingerprint {bound}")


def _pretty(value: Any) -> str:
    """JSON with every non-ASCII and control character escaped: nothing a server wrote can act on the
    terminal or hide a change (a bidi override, an escape sequence)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True)


@command.command(name="accept")
@click.option("--server", help="Accept every held-back tool this upstream server offers.")
@click.option("--tools", "tools", multiple=True, metavar="TOOL", help="A tool to accept (more may follow).")
@click.argument("more", nargs=-1, metavar="[TOOL]...")
@click.option("--fingerprint", "fingerprints", multiple=True, metavar="TOOL=sha256:...",
              help="The reviewed current fingerprint of a tool (pins show/list print it); repeatable.")
@click.option("--reviewed", "reviewed", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A file holding `pins list --format json` as reviewed: accept those fingerprints.")
@click.option("--current", is_flag=True, help="Pin whatever the server offers now, reviewed or not.")
@click.option("--by", default=None, help="Who accepts (recorded as given; default cli:<login>).")
@KIND_OPTION
@control_options
def accept(
    ctl: Control,
    server: str | None,
    tools: tuple[str, ...],
    more: tuple[str, ...],
    fingerprints: tuple[str, ...],
    reviewed: Path | None,
    current: bool,
    by: str | None,
    kind: str | None,
) -> None:
    """Accept held-back tools (or prompts: --kind prompt) as reviewed: --fingerprint NAME=FP,
    --reviewed FILE, or --current. --server S --current accepts its tools and its prompts."""
    names = [*tools, *more]
    if more and not tools:
        raise click.UsageError("name tools after --tools (e.g. --tools github.create_issue github.get_repo)")
    if server is not None and names:
        raise click.UsageError("give --server S or --tools T [T ...], not both")
    bound = _reviewed_fingerprints(fingerprints, reviewed, server, names, kind)
    if current and bound is not None:
        raise click.UsageError("--current pins what is offered now: give it without --fingerprint, --reviewed")
    if not current and bound is None:
        raise click.UsageError(
            "an accept pins what you reviewed: give --fingerprint TOOL=sha256:... "
            "(see drawbridge pins show TOOL) or --reviewed FILE (from pins list --format json); "
            "--current pins whatever is offered now, unseen"
        )
    if server is None and not names and bound is None:
        raise click.UsageError("give --server S or --tools T [T ...]")
    groups: dict[str | None, dict[str, str] | None] = (
        {kind if server is not None or kind else "tool": None} if bound is None else dict(bound)
    )
    bodies: list[dict[str, object]] = []
    for each, fingerprints_of in groups.items():
        body: dict[str, object] = {"by": by or default_person()}
        if each is not None:
            body["kind"] = each
        if server is not None:
            body["server"] = server
        else:
            body["tools"] = names or list(fingerprints_of or ())
        if fingerprints_of is not None:
            body["fingerprints"] = fingerprints_of
        bodies.append(body)
    if len(bodies) > 1:  # one request per kind: each is checked before any is accepted
        for body in bodies:
            ctl.client.post("/tools/pins/accept", {**body, "dry_run": True})
    accepted: list[Mapping[str, Any]] = []
    results = []
    for body in bodies:
        try:
            results.append(ctl.client.post("/tools/pins/accept", body))
        except ControlError as exc:
            if not accepted:
                raise
            done = ", ".join(f"{a.get('kind', 'tool')} {display_text(str(a.get('name')))}" for a in accepted)
            raise ControlError(
                f"accepted before this refusal (and kept): {done}; then the {body.get('kind', 'tool')}s were "
                f"refused: {exc.message}", exc.exit_code, exc.status,
            ) from None
        accepted += results[-1].get("accepted", [])
    if ctl.json:
        emit_json(results[0] if len(results) == 1 else {"accepted": accepted, "count": len(accepted)})
        return
    if not accepted:
        click.echo("nothing to accept: everything named is already pinned as it is now")
        return
    rows = [
        [
            a.get("name"), a.get("kind", "tool"), "removed" if a.get("removed") else a.get("fingerprint"),
            a.get("previous_description"), a.get("description"),
        ]
        for a in accepted
    ]
    console().print(table(f"{len(accepted)} accepted", ["NAME", "KIND", "FINGERPRINT", "WAS", "NOW"], rows))


def _reviewed_fingerprints(
    given: Sequence[str], reviewed: Path | None, server: str | None, names: Sequence[str], kind: str | None
) -> dict[str | None, dict[str, str]] | None:
    """Kind -> name -> reviewed fingerprint from ``--fingerprint`` (of ``kind``, else tools) and
    ``--reviewed`` (each row of its own kind; only ``kind``'s when given). None when neither.

    From a reviewed listing only the rows this accept covers are taken (the server's, or the names
    given); a name given with ``--tools`` that the listing lacks is a usage error."""
    if not given and reviewed is None:
        return None
    by_kind: dict[str | None, dict[str, str]] = {}
    if reviewed is not None:
        rows = _read_listing(reviewed)
        for row in rows:
            if row.get("status") == UNPINNABLE:
                continue  # listed so a person sees it; nothing of it can be accepted
            name, fingerprint, of = row["name"], row["current"]["fingerprint"], row.get("kind", "tool")
            if (server is None or row.get("server") == server) and (not names or name in names) \
                    and kind in (None, of):
                by_kind.setdefault(of, {})[name] = fingerprint
        found = {name for rows_of in by_kind.values() for name in rows_of}
        missing = [n for n in names if n not in found]
        if missing:
            listed = ", ".join(display_text(n) for n in missing[:5])
            raise click.UsageError(f"{reviewed} does not list {listed}")
    for item in given:
        name, sep, fingerprint = item.rpartition("=")
        if not sep or not name or not fingerprint:
            raise click.UsageError(f"--fingerprint takes TOOL=sha256:<hex> (a prompt's with --kind prompt), "
                                   f"not {display_text(item)!r}")
        by_kind.setdefault(kind or "tool", {})[name] = fingerprint
    if not by_kind:
        raise click.UsageError(f"{reviewed} lists nothing held back that this accept covers")
    return by_kind


def _read_listing(path: Path) -> list[Mapping[str, Any]]:
    """The rows of a saved ``pins list --format json``, each with a name and a current fingerprint."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.UsageError(f"--reviewed {path}: cannot be read as JSON ({type(exc).__name__})") from None
    ok = isinstance(rows, list) and all(
        isinstance(r, Mapping) and isinstance(r.get("name"), str)
        and isinstance(r.get("current"), Mapping)
        and (isinstance(r["current"].get("fingerprint"), str) or r.get("status") == UNPINNABLE)
        for r in rows
    )
    if not ok:
        raise click.UsageError(f"--reviewed {path}: not the output of drawbridge pins list --format json")
    return rows
