"""``drawbridge discover --config drawbridge.yaml [--openapi FILE|URL] [--generate-policy]``: what the
upstreams declare.

Reads every upstream of the configuration the way ``serve`` does -- MCP servers connected with the
same sessions and the same child environment (the gateway's own credentials never reach a child),
OpenAPI specs read and CLI entries opened by the same code (``runtime.serve.open_local_upstreams``),
no CLI command run -- and stops, without starting the gateway: no port is opened, no policy is
loaded, nothing is recorded. ``--openapi`` adds a spec of its own, served as ``openapi.<operation>``
(``--backend`` names its backend when the spec's first server is not the one; ``--allow-private``
lets the SSRF guard through to a private or loopback address). It prints the catalogue with the classification of each tool (family, access, reasons;
advice read from what the upstream declares, never verified), or, with ``--generate-policy``, a
draft native policy (``catalogue.draft``): named reads allow, everything else ``human_approval``, a
final deny on ``*``, each rule under a comment with the tool's classification and reasons. The
draft is a policy file ``drawbridge serve`` loads as it is; review it before use.

Names are the names agents see under ``serve``: ``<upstream>.<tool>``. Tools ``serve`` would not
serve (names that cannot be routed safely, duplicates, operations it cannot call) are not listed;
they are named on stderr. Each tool says its ``source`` (``mcp``, ``openapi``, ``cli``); an OpenAPI
operation is classified by its HTTP method as well, a CLI dispatcher and a CLI command without
``allowed_args`` (its flags carry the effect) as generic.

Exit codes: 0 every upstream answered; 1 some upstream could not be reached (the output covers the
others, and stderr says which and why); 2 the configuration is invalid or an environment variable it
names is missing.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import anyio
import click

from drawbridge.catalogue.classify import Classification, Family, Source, classify_tool
from drawbridge.catalogue.draft import DraftTool, generate_draft, origin_label
from drawbridge.cli.log_format import configure_logging
from drawbridge.cli.output import EXIT_FAILED, EXIT_INPUT, console, emit_json, format_option, table
from drawbridge.cli.seconds import Seconds
from drawbridge.config import (
    ALLOW_PRIVATE_ADVICE,
    CliToolConfig,
    ConfigError,
    GatewayConfig,
    OpenApiConfig,
    load_config,
    parse_config,
)
from drawbridge.config_reader import AGENT_GLOB, AGENT_ID_CHARS
from drawbridge.policy.globs import GlobError
from drawbridge.policy.load import agent_glob

if TYPE_CHECKING:
    from drawbridge.gateway.pipeline.floors import Route
    from drawbridge.gateway.upstreams.local import LocalUpstream

DEFAULT_TIMEOUT_SECONDS: Final = 30.0


AD_HOC_NAME: Final = "openapi"
"""The namespace of the spec given with ``--openapi``."""


@dataclass(frozen=True, slots=True)
class DiscoveredTool:
    server: str
    upstream_name: str
    name: str
    """The name agents see under ``serve``: ``server.tool``."""
    classification: Classification
    source: Source = "mcp"
    item: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The tool as its upstream lists it (its own name): what a pin's fingerprint covers."""
    route: Route | None = field(default=None, compare=False, repr=False)
    """Where serve routes its calls, with the CLI dispatcher facts the floors read."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server": self.server,
            "upstream_name": self.upstream_name,
            "source": self.source,
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
            [DraftTool(t.name, t.classification, origin_label(t.source, t.server)) for t in self.tools],
            policy_name=policy_name,
            agent=agent,
        )


def classify_catalogue(
    sources: Sequence[tuple[str, Sequence[Any]]], local: Mapping[str, LocalUpstream] | None = None
) -> tuple[list[DiscoveredTool], list[str]]:
    """Namespace and classify ``(server, tools)`` pairs exactly as ``serve`` would serve them; ``local``
    names the upstreams that are OpenAPI services or CLI binaries (their tools' facts classify them)."""
    from drawbridge.catalogue.merged import build_catalogue
    from drawbridge.gateway.pipeline.floors import Route

    catalogue = build_catalogue(list(sources), "tool")
    tools = []
    for entry in catalogue.entries:
        own = dict(entry.item)
        own["name"] = entry.upstream_name
        kind = (local or {}).get(entry.server)
        facts = kind.tool(entry.upstream_name) if kind is not None else None
        if kind is None or facts is None:
            classified = classify_tool(own)
            route = Route(entry.server, entry.upstream_name, generic=classified.family is Family.GENERIC)
            tools.append(DiscoveredTool(
                entry.server, entry.upstream_name, entry.name, classified, item=own, route=route,
            ))
            continue
        classification = classify_tool(
            own, source=kind.source, openapi_method=facts.openapi_method, cli_dispatcher=facts.dispatcher,
            cli_free_arguments=facts.free_arguments,
        )
        tools.append(DiscoveredTool(
            entry.server, entry.upstream_name, entry.name, classification, kind.source, item=own,
            route=kind.route(entry.upstream_name),
        ))
    problems = [problem.describe() for problem in catalogue.problems]
    for kind in (local or {}).values():
        problems += [f"upstream {kind.name!r}: {problem}" for problem in kind.not_served]
    return tools, problems


def _why_not(upstream: Any, timeout: float) -> str:
    if upstream.start_error is not None:
        return f"upstream {upstream.name!r} could not be started: {upstream.start_error}"
    if upstream.last_error is not None:
        return f"upstream {upstream.name!r} could not be read: {upstream.last_error}"
    return f"upstream {upstream.name!r} did not answer within {timeout:g} seconds"


async def _open_local(
    config: GatewayConfig | None, ad_hoc: OpenApiConfig | None
) -> tuple[list[LocalUpstream], list[str]]:
    """The OpenAPI and CLI upstreams that can be opened, and why each other one cannot."""
    from drawbridge.gateway.runtime.serve import StartError, open_local_upstreams

    opened: list[LocalUpstream] = []
    unavailable: list[str] = []
    entries: list[Any] = [*(config.openapi if config else ()), *(config.cli_tools if config else ())]
    if ad_hoc is not None:
        entries.append(ad_hoc)
    timeout = config.call_timeout_seconds if config is not None else 120.0
    for entry in entries:
        one = GatewayConfig(
            source_file="", upstreams=(), call_timeout_seconds=timeout,
            openapi=(entry,) if isinstance(entry, OpenApiConfig) else (),
            cli_tools=(entry,) if isinstance(entry, CliToolConfig) else (),
        )
        try:
            opened += await open_local_upstreams(one, calls=False)
        except StartError as exc:
            unavailable.append(_in_flags(str(exc)) if entry is ad_hoc else str(exc))
    return opened, unavailable


async def discover(
    config: GatewayConfig | None,
    timeout: float,
    ad_hoc: OpenApiConfig | None = None,
    progress: Callable[[str], None] | None = None,
) -> Discovery:
    """Connect to every upstream, read its tools, disconnect; open the OpenAPI and CLI upstreams
    (``ad_hoc``: the spec of ``--openapi``) without calling them. ``progress`` is told of each
    upstream as it answers (or not)."""
    from drawbridge.gateway.runtime.serve import secret_env_names
    from drawbridge.gateway.upstreams.child_spawn import EnvPolicy
    from drawbridge.gateway.upstreams.session import UpstreamSession

    local, local_unavailable = await _open_local(config, ad_hoc)
    denied = secret_env_names(config) if config is not None else frozenset()
    upstreams = [
        UpstreamSession(u, env_filter=EnvPolicy(extra=dict(u.env), deny_names=denied))
        for u in (config.upstreams if config is not None else ())
    ]
    async with anyio.create_task_group() as tg:
        for upstream in upstreams:
            tg.start_soon(upstream.run)
        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as waiting:
                for upstream in upstreams:
                    waiting.start_soon(_settled, upstream, progress)
        sources = [(u.name, list(u.tools)) for u in upstreams if u.ready]
        unavailable = [_why_not(u, timeout) for u in upstreams if not u.ready]
        for upstream in upstreams:
            await upstream.close()
        tg.cancel_scope.cancel()
    for kind in local:
        await kind.close()
    sources += [(kind.name, kind.tools) for kind in local]
    tools, problems = classify_catalogue(sources, {kind.name: kind for kind in local})
    return Discovery(tuple(tools), tuple(unavailable + local_unavailable), tuple(problems))


async def _settled(upstream: Any, progress: Callable[[str], None] | None) -> None:
    began = time.monotonic()
    await upstream.wait_settled()
    if progress is not None:
        took = time.monotonic() - began
        if upstream.ready:
            progress(f"discover: {upstream.name}: {len(upstream.tools)} tools ({took:.1f} s)")
        else:
            progress(f"discover: {upstream.name}: not read ({upstream.last_error or upstream.start_error})")


def _render_table(found: Discovery) -> None:
    rows = [
        [t.server, t.name, t.classification.family.value, t.classification.access.value,
         "; ".join(t.classification.reason_texts), t.source]
        for t in found.tools
    ]
    title = f"{len(found.tools)} tools (classification: what each tool declares; nothing is verified)"
    console().print(table(title, ["UPSTREAM", "TOOL", "FAMILY", "ACCESS", "REASONS", "SOURCE"], rows))


@click.command(name="discover", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", metavar="FILE", help="The gateway configuration (YAML).")
@click.option("--openapi", "openapi", metavar="FILE|URL", help="An OpenAPI 3.0/3.1 spec to read as well (tools openapi.*).")
@click.option("--backend", metavar="URL", help="The backend of the --openapi spec (default: the spec's first server).")
@click.option(
    "--allow-private", is_flag=True, help="Let the --openapi spec and backend be on a loopback or private address."
)
@click.option(
    "--generate-policy", is_flag=True, help="Print a draft policy (one rule per tool) instead of the table."
)
@click.option("--agent", default="*", show_default=True, help="The agent glob the draft policy is written for.")
@click.option(
    "--timeout",
    type=Seconds(min=0.1, max=600),
    default=DEFAULT_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds to wait for the upstreams to answer.",
)
@format_option
def command(
    config_path: str | None,
    openapi: str | None,
    backend: str | None,
    allow_private: bool,
    generate_policy: bool,
    agent: str,
    timeout: float,
    output_format: str,
) -> None:
    """Read the upstreams of a configuration (MCP servers, OpenAPI specs, CLI tools) and show their
    classified tools.

    \b
    Examples:
      drawbridge discover --config drawbridge.yaml
      drawbridge discover --config drawbridge.yaml --generate-policy > policies/draft.yaml
      drawbridge discover --openapi ./petstore.yaml --backend https://api.example.com/v1
      drawbridge discover --config drawbridge.yaml --format json
    """
    configure_logging(False, level=logging.ERROR)
    if config_path is None and openapi is None:
        raise click.UsageError("give --config FILE, --openapi FILE|URL, or both")
    if backend is not None and openapi is None:
        raise click.UsageError("--backend goes with --openapi")
    try:
        agent_glob(agent)  # the loader's own rule for `agent`: a draft that would not load is never written
        if not AGENT_GLOB.fullmatch(agent):  # and one that could match no agent id serve or wrap takes
            raise GlobError(f"use only the characters of an agent id {AGENT_ID_CHARS} and the glob characters")
    except GlobError as exc:
        click.echo(f"drawbridge: --agent {agent!r} is not an agent glob a policy accepts: {exc}", err=True)
        sys.exit(EXIT_INPUT)
    config = None
    if config_path is not None:
        try:
            config = load_config(config_path, uses=frozenset())  # discover serves no agent, opens no control plane
        except ConfigError as exc:
            click.echo(str(exc), err=True)
            sys.exit(EXIT_INPUT)
        from drawbridge.cli.serve_cmd import preflight

        problems = preflight(config, os.environ, openapi=False)  # no operation is called: no header read
        if problems:
            click.echo("\n".join(problems), err=True)
            sys.exit(EXIT_INPUT)
        if openapi is not None and AD_HOC_NAME in config.upstream_names:
            click.echo(f"drawbridge: the configuration already has an upstream named {AD_HOC_NAME!r}", err=True)
            sys.exit(EXIT_INPUT)
    ad_hoc = _ad_hoc(openapi, backend, allow_private) if openapi is not None else None
    progress = (lambda line: click.echo(line, err=True)) if sys.stderr.isatty() else None
    found = anyio.run(discover, config, timeout, ad_hoc, progress)
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


def _ad_hoc(spec: str, backend: str | None, allow_private: bool) -> OpenApiConfig:
    """The ``--openapi`` spec as an ``openapi:`` entry, checked like one (exit 2 when it is refused)."""
    import json

    entry: dict[str, Any] = {"name": AD_HOC_NAME, "allow_private": allow_private}
    entry["url" if spec.startswith(("http://", "https://")) else "file"] = (
        spec if spec.startswith(("http://", "https://")) else os.path.abspath(spec)
    )
    if backend is not None:
        entry["backend_url"] = backend
    try:
        config = parse_config(json.dumps({"openapi": [entry], "policy_dir": "."}), "--openapi")
    except ConfigError as exc:
        problem = str(exc).removeprefix("--openapi:1: ").replace("openapi 'openapi': ", "--openapi: ")
        click.echo(_in_flags(problem), err=True)
        sys.exit(EXIT_INPUT)
    return config.openapi[0]


def _in_flags(problem: str) -> str:
    """A problem with the ``--openapi`` spec, advising the command line's flags, not the keys of an
    ``openapi:`` entry the user never wrote."""
    return (
        problem.replace(ALLOW_PRIVATE_ADVICE, "give --allow-private to allow it")
        .replace("set backend_url", "give --backend")
        .replace("backend_url is refused", "--backend is refused")
    )


__all__ = ["AD_HOC_NAME", "DiscoveredTool", "Discovery", "classify_catalogue", "command", "discover"]
