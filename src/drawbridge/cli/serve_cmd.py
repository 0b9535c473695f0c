"""``drawbridge serve --config drawbridge.yaml``: several upstreams behind one gateway.

The upstreams named in the configuration (MCP servers as stdio children and streamable-HTTP URLs,
OpenAPI services, CLI binaries) are connected or opened once and shared by every agent; their tools
are served as ``<upstream>.<tool>``. Agents connect over
streamable HTTP at ``/mcp`` (bearer tokens map to agent ids, see docs/configuration.md) or, with
``--stdio``, one agent over this process's stdin and stdout. The control plane (docs/control-plane.md)
is served on a listener of its own (``control``, default 127.0.0.1:8788), apart from ``/mcp``, and
always needs the admin token: the configured one, else the one the gateway keeps in the file beside
its state file (``gateway.runtime.admin_token``). With ``--stdio`` it is served only when the
configuration file has a ``control`` section.
The runtime is the one wrap builds (``drawbridge.gateway.runtime``): policy store, state database,
pins, approval engine, trace and the one call pipeline; ``runtime.serve`` adds the upstreams and the hub.

Invariant: nothing is started before the configuration, the policy and every environment variable the
configuration names have been checked; a problem there is printed as ``file:line: problem`` (or
``file: problem``) on stderr and the exit code is 2, with no child spawned and no port opened. The
listeners are bound next, before the state database, the admin token file or the evidence is made:
a port in use leaves nothing behind.

Exit codes: 0 after a normal shutdown (the stdio agent closed the pipe, or SIGINT/SIGTERM); 2 for a
configuration, policy, listen, state-database, evidence or upstream-start problem.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import click

from drawbridge.cli.log_format import announce, configure_logging, log_format_option, startup_failed
from drawbridge.cli.output import EXIT_INPUT, agent_id
from drawbridge.cli.serve_summary import print_stopping, print_summary
from drawbridge.config import USES_ALL, ConfigError, GatewayConfig, load_config
from drawbridge.config_headers import header_value_problem
from drawbridge.gateway.runtime import control
from drawbridge.gateway.runtime.assembly import Runtime, StartupProblem
from drawbridge.gateway.runtime.serve import ServeParts, StartError, build_serve, open_local_upstreams
from drawbridge.gateway.runtime.settings import RuntimeSettings
from drawbridge.gateway.transports.http_deadlines import ListenerLimits
from drawbridge.gateway.transports.http_listener import bind, serve_http

STARTUP_WAIT_SECONDS: Final = 45.0


class _Startup(Exception):
    """A problem found before serving; printed as is, exit code 2."""


def preflight(config: GatewayConfig, environ: Mapping[str, str], *, openapi: bool = True) -> list[str]:
    """Problems that would only show when an upstream connects: report them before anything starts.
    ``openapi`` False (``discover``, which calls no operation): OpenAPI headers are not needed."""
    problems: list[str] = []
    for upstream in (*config.upstreams, *(config.openapi if openapi else ())):
        for header, env_name in upstream.headers_env.items():
            value = environ.get(env_name)
            if not value:
                problems.append(
                    f"{config.source_file}: upstream {upstream.name!r}: header {header} needs environment "
                    f"variable {env_name}, which is missing or empty"
                )
            elif (problem := header_value_problem(header, env_name, value)) is not None:
                problems.append(f"{config.source_file}: upstream {upstream.name!r}: {problem}")
    return problems


def _bind(host: str, port: int, what: str) -> socket.socket:
    try:
        return bind(host, port)
    except OSError as exc:
        raise _Startup(f"cannot listen on {host}:{port} ({what}): {exc.strerror or exc}") from exc


@click.command(name="serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, metavar="FILE", help="The gateway configuration (YAML).")
@click.option("--stdio", is_flag=True, help="Serve one agent over stdin/stdout instead of HTTP at /mcp.")
@click.option(
    "--agent",
    metavar="ID",
    callback=agent_id,
    help="Agent id of the --stdio client (default: auth.anonymous_agent, else 'anonymous').",
)
@click.option("--verbose", "-v", is_flag=True, help="Log connections, reconnections and incidents to stderr.")
@log_format_option
def command(config_path: str, stdio: bool, agent: str | None, verbose: bool, log_format: str) -> None:
    """Serve the upstreams of a configuration file behind one gateway.

    \b
    Examples:
      drawbridge serve --config drawbridge.yaml                  # HTTP at http://127.0.0.1:8787/mcp
      drawbridge serve --config drawbridge.yaml --stdio --agent claude

    Each tools/call decision is one line on stderr (agent, tool, action, rule, outcome, ms; never an
    argument value); so is each approval asked and resolved and each refused login.
    """
    configure_logging(verbose, log_format)
    if agent is not None and not stdio:
        raise click.UsageError("--agent goes with --stdio; over HTTP the bearer token names the agent")
    try:
        # Over stdin/stdout no agent presents an HTTP token, and the control plane (so its token) is
        # served only when the file has a control section: variables of unused tokens are not asked for.
        config = load_config(config_path, uses=frozenset({"notify"}) if stdio else USES_ALL)
        if stdio and config.control_configured:
            config = load_config(config_path, uses=frozenset({"admin", "notify"}))
    except ConfigError as exc:
        startup_failed(str(exc))
        sys.exit(EXIT_INPUT)
    socks: _Sockets = _Sockets()
    runtime: Runtime | None = None
    try:
        problems = preflight(config, os.environ)
        if problems:
            raise _Startup("\n".join(problems))
        # With --stdio a control plane is served only when the file asks for one, so that an MCP client
        # starting several stdio gateways does not make them fight over the default port.
        control_open = not stdio or config.control_configured
        # The listeners first: a port in use stops the start before any state, token file or evidence is made.
        if not stdio:
            socks.mcp = _bind(config.listen_host, config.listen_port, "listen: the agents' /mcp")
        if control_open:
            socks.control = _bind(config.control_host, config.control_port, "control: the control plane")
        settings = RuntimeSettings.from_config(
            config, control_open=control_open, network_transport="pipe" if stdio else "tcp"
        )
        try:
            runtime = Runtime.build(settings)
        except StartupProblem as exc:
            raise _Startup(str(exc)) from None
        anyio.run(_serve, config, runtime, agent or config.anonymous_agent or "anonymous", socks, stdio)
    except _Startup as exc:
        startup_failed(str(exc) if str(exc).startswith(config.source_file) else f"drawbridge: {exc}")
        sys.exit(EXIT_INPUT)
    except KeyboardInterrupt:
        pass
    finally:
        if runtime is not None:
            runtime.close()
        socks.close()


@dataclass
class _Sockets:
    """The listeners serve opened before it started: the agents' ``/mcp`` and the control plane's."""

    mcp: socket.socket | None = None
    control: socket.socket | None = None

    def close(self) -> None:
        for sock in (self.mcp, self.control):
            if sock is not None:
                sock.close()


async def _serve(config: GatewayConfig, runtime: Runtime, agent: str, socks: _Sockets, stdio: bool) -> None:
    if stdio:
        from drawbridge.gateway.transports.process_stdio import process_stdio

        async with process_stdio() as (client_in, client_out):
            await _run(config, runtime, agent, socks, (client_in, client_out))
    else:
        await _run(config, runtime, agent, socks, None)


async def _run(
    config: GatewayConfig,
    runtime: Runtime,
    agent: str,
    socks: _Sockets,
    pipes: tuple[Any, Any] | None,
) -> None:
    try:
        local = await open_local_upstreams(config)
    except StartError as exc:
        raise _Startup(str(exc)) from None
    try:
        await runtime.prepare()
    except StartupProblem as exc:
        raise _Startup(str(exc)) from None
    parts = build_serve(runtime, config, control_open=socks.control is not None, local=local)
    runtime.metrics.upstreams = parts.upstream_up
    gateway = parts.hub
    failed: list[str] = []
    async with anyio.create_task_group() as tg:
        # Approvals a previous process left pending expire, and the policy watcher runs, before any call.
        await tg.start(runtime.run)
        tg.start_soon(parts.announce_policy_changes, runtime)
        await tg.start(gateway.run)
        tg.start_soon(_stop_on_signal, tg.cancel_scope, runtime)
        await gateway.wait_settled(STARTUP_WAIT_SECONDS)
        failed = gateway.start_errors()
        if failed:
            tg.cancel_scope.cancel()
        else:
            if socks.control is not None:
                limits = ListenerLimits.from_config(config)
                tg.start_soon(_serve_control_plane, parts, runtime, socks.control, limits)
            if pipes is not None:
                from drawbridge.gateway.transports.stdio_session import serve_stdio_session

                print_summary(runtime, None, parts.upstreams, local)

                await serve_stdio_session(
                    gateway, pipes[0], pipes[1], agent=agent, max_message_bytes=config.max_message_bytes,
                    max_depth=config.max_depth,
                )
            else:
                assert socks.mcp is not None
                from drawbridge.gateway.transports.http_auth import Authenticator, resource_for
                from drawbridge.gateway.transports.http_endpoint import build_app, describe_url
                from drawbridge.gateway.transports.http_identity import HttpSettings

                from drawbridge.gateway.runtime.operating import health_routes

                bound = socks.mcp.getsockname()
                settings = HttpSettings.from_config(config, bound[1])
                auth = Authenticator(settings, config.oauth, resource_for(config.oauth, describe_url(*bound[:2])))
                if auth.keys is not None:
                    tg.start_soon(auth.keys.run)
                app = build_app(gateway, settings, health_routes(runtime, parts.upstream_up), auth=auth)

                def ready(host: str, port: int) -> None:
                    url = describe_url(host, port)
                    listening = url.split("://", 1)[1].split("/", 1)[0]
                    host_header = settings.allowed_hosts.host_to_send(listening)
                    print_summary(runtime, url, parts.upstreams, local, host_header)

                await serve_http(app, socks.mcp, ready, ListenerLimits.from_config(config))
            tg.cancel_scope.cancel()
    if failed:
        raise _Startup("\n".join(failed))


async def _serve_control_plane(
    parts: ServeParts, runtime: Runtime, sock: socket.socket, limits: ListenerLimits
) -> None:
    """The control plane on its own listener (never beside ``/mcp``), read under the same limits."""

    def ready(host: str, port: int) -> None:
        control.announce_console(runtime, host, port)
        announce(f"control plane on {control.control_url(host, port)} ({control.credential_note(runtime)})")

    assert parts.services is not None
    await serve_http(control.app(parts.services, runtime), sock, ready, limits)


async def _stop_on_signal(scope: anyio.CancelScope, runtime: Runtime) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for received in signals:
            print_stopping(signal.Signals(received).name, runtime)
            scope.cancel()
            return
