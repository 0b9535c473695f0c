"""``drawbridge discover --config drawbridge.yaml [--generate-policy]``: what the upstreams declare.

Connects to every upstream of the configuration the way ``serve`` does (same sessions, same child
environment: the gateway's own credentials never reach a child), reads each one's ``tools/list``,
and disconnects, without starting the gateway: no port is opened, no policy is loaded, nothing is
recorded. It prints the catalogue with the classification of each tool (family, access, reasons;
advice read from what the upstream declares, never verified), or, with ``--generate-policy``, a
draft native policy (``catalogue.draft``): named reads allow, everything else ``human_approval``, a
final deny on ``*``, each rule under a comment with the tool's classification and reasons. The
draft is a policy file ``drawbridge serve`` loads as it is; review it before use.

Names are the names agents see under ``serve``: ``<upstream>.<tool>``. Tools ``serve`` would not
serve (names that cannot be routed safely, duplicates) are not listed; they are named on stderr.

Exit codes: 0 every upstream answered; 1 some upstream could not be reached (the output covers the
others, and stderr says which and why); 2 the configuration is invalid or an environment variable it
names is missing.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
import click

from drawbridge.catalogue.classify import Classification, classify_tool
from drawbridge.catalogue.draft import DraftTool, generate_draft, origin_label
from drawbridge.cli.output import EXIT_FAILED, EXIT_INPUT, console, emit_json, format_option, table
from drawbridge.config import ConfigError, GatewayConfig, load_config

DEFAULT_TIMEOUT_SECONDS: Final = 30.0


@dataclass(frozen=True, slots=True)
class DiscoveredTool:
    server: str
    upstream_name: str
    name: str
    """The name agents see under ``serve``: ``server.tool``."""
    classification: Classification

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server": self.server,
            "upstream_name": self.upstream_name,
            "classification": self.classification.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class Discovery:
    tools: tuple[DiscoveredTool, ...]
    unavailable: tuple[str, ...]
    """Why each upstream that did not answer could not be read."""
    not_served: tuple[str, ...]
    """Listed items ``serve`` would refuse to serve, and why."""

    def draft(self, agent: str = "*", policy_name: str = "draft") -> str:
        return generate_draft(
            [DraftTool(t.name, t.classification, origin_label("mcp", t.server)) for t in self.tools],
            policy_name=policy_name,
            agent=agent,
        )


def classify_catalogue(sources: Sequence[tuple[str, Sequence[Any]]]) -> tuple[list[DiscoveredTool], list[str]]:
    """Namespace and classify ``(server, tools)`` pairs exactly as ``serve`` would serve them."""
    from drawbridge.catalogue.merged import build_catalogue

    catalogue = build_catalogue(list(sources), "tool")
    tools = []
    for entry in catalogue.entries:
        own = dict(entry.item)
        own["name"] = entry.upstream_name
        tools.append(DiscoveredTool(entry.server, entry.upstream_name, entry.name, classify_tool(own)))
    return tools, [problem.describe() for problem in catalogue.problems]


def _why_not(upstream: Any, timeout: float) -> str:
    if upstream.start_error is not None:
        return f"upstream {upstream.name!r} could not be started: {upstream.start_error}"
    if upstream.last_error is not None:
        return f"upstream {upstream.name!r} could not be read: {upstream.last_error}"
    return f"upstream {upstream.name!r} did not answer within {timeout:g} seconds"


async def discover(config: GatewayConfig, timeout: float) -> Discovery:
    """Connect to every upstream, read its tools, disconnect."""
    from drawbridge.gateway.runtime.serve import secret_env_names
    from drawbridge.gateway.upstreams.child_process import EnvPolicy
    from drawbridge.gateway.upstreams.session import UpstreamSession

    denied = secret_env_names(config)
    upstreams = [
        UpstreamSession(u, env_filter=EnvPolicy(extra=dict(u.env), deny_names=denied)) for u in config.upstreams
    ]
    async with anyio.create_task_group() as tg:
        for upstream in upstreams:
            tg.start_soon(upstream.run)
        with anyio.move_on_after(timeout):
            for upstream in upstreams:
                await upstream.wait_settled()
        sources = [(u.name, list(u.tools)) for u in upstreams if u.ready]
        unavailable = [_why_not(u, timeout) for u in upstreams if not u.ready]
        for upstream in upstreams:
            await upstream.close()
        tg.cancel_scope.cancel()
    tools, problems = classify_catalogue(sources)
    return Discovery(tuple(tools), tuple(unavailable), tuple(problems))


def _render_table(found: Discovery) -> None:
    rows = [
        [t.server, t.name, t.classification.family.value, t.classification.access.value,
         "; ".join(t.classification.reason_texts)]
        for t in found.tools
    ]
    title = f"{len(found.tools)} tools (classification: what each tool declares; nothing is verified)"
    console().print(table(title, ["SERVER", "TOOL", "FAMILY", "ACCESS", "REASONS"], rows))


@click.command(name="discover", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, metavar="FILE", help="The gateway configuration (YAML).")
@click.option(
    "--generate-policy", is_flag=True, help="Print a draft policy (one rule per tool) instead of the table."
)
@click.option("--agent", default="*", show_default=True, help="The agent glob the draft policy is written for.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=600),
    default=DEFAULT_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds to wait for the upstreams to answer.",
)
@format_option
def command(config_path: str, generate_policy: bool, agent: str, timeout: float, output_format: str) -> None:
    """Connect to the upstreams of a configuration and show their classified tools.

    \b
    Examples:
      drawbridge discover --config drawbridge.yaml
      drawbridge discover --config drawbridge.yaml --generate-policy > policies/draft.yaml
      drawbridge discover --config drawbridge.yaml --format json
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("drawbridge: %(levelname)s %(message)s"))
    log = logging.getLogger("drawbridge")
    log.handlers[:] = [handler]
    log.setLevel(logging.ERROR)
    log.propagate = False
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_INPUT)
    from drawbridge.cli.serve_cmd import preflight

    problems = preflight(config, os.environ)
    if problems:
        click.echo("\n".join(problems), err=True)
        sys.exit(EXIT_INPUT)
    found = anyio.run(discover, config, timeout)
    for problem in found.not_served:
        click.echo(f"drawbridge: not served: {problem}", err=True)
    for reason in found.unavailable:
        click.echo(f"drawbridge: {reason}; its tools are not listed", err=True)
    draft = found.draft(agent) if generate_policy else None
    if output_format == "json":
        report: dict[str, Any] = {
            "tools": [t.as_dict() for t in found.tools],
            "unavailable": list(found.unavailable),
            "not_served": list(found.not_served),
        }
        if draft is not None:
            report["policy"] = draft
        emit_json(report)
    elif draft is not None:
        click.echo(draft, nl=False)
    else:
        _render_table(found)
    if found.unavailable:
        sys.exit(EXIT_FAILED)


__all__ = ["DiscoveredTool", "Discovery", "classify_catalogue", "command", "discover"]
