"""``drawbridge serve --config drawbridge.yaml``: several upstream MCP servers behind one gateway.

The upstreams named in the configuration (stdio children and streamable-HTTP URLs) are connected once
and shared by every agent; their tools are served as ``<upstream>.<tool>``. Agents connect over
streamable HTTP at ``/mcp`` (bearer tokens map to agent ids, see docs/configuration.md) or, with
``--stdio``, one agent over this process's stdin and stdout. The control plane (docs/control-plane.md)
is served on the same HTTP listener; with ``--stdio`` it gets a listener of its own only when the
configuration file has a ``listen`` section (no ``/mcp`` there: the stdio agent is the only agent).
The runtime both share (policy store, state database, pins, approval engine, trace) is built by
``drawbridge.gateway.services``.

Invariant: nothing is started before the configuration, the policy and every environment variable the
configuration names have been checked; a problem there is printed as ``file:line: problem`` (or
``file: problem``) on stderr and the exit code is 2, with no child spawned and no port opened.

Exit codes: 0 after a normal shutdown (the stdio agent closed the pipe, or SIGINT/SIGTERM); 2 for a
configuration, policy, listen, state-database, evidence or upstream-start problem.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import Any, Final

import anyio
import click

from drawbridge.cli.output import EXIT_INPUT
from drawbridge.config import ConfigError, GatewayConfig, load_config
from drawbridge.gateway.catalogue import split_namespaced
from drawbridge.gateway.pipeline import PolicyDecider, Recorder, policy_decider
from drawbridge.gateway.truth_key import ALL_NAMES as TRUTH_KEY_NAMES
from drawbridge.gateway.truth_key import TruthKey, TruthKeyError, truth_key_from_env
from drawbridge.gateway.upstream import EnvPolicy
from drawbridge.state.sqlite import StateDB

STARTUP_WAIT_SECONDS: Final = 45.0


class _Startup(Exception):
    """A problem found before serving; printed as is, exit code 2."""


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("drawbridge: %(levelname)s %(message)s"))
    log = logging.getLogger("drawbridge")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    log.propagate = False


def preflight(config: GatewayConfig, environ: Mapping[str, str]) -> list[str]:
    """Problems that would only show when an upstream connects: report them before anything starts."""
    problems: list[str] = []
    for upstream in config.upstreams:
        for header, env_name in upstream.headers_env.items():
            if not environ.get(env_name):
                problems.append(
                    f"{config.source_file}: upstream {upstream.name!r}: header {header} needs environment "
                    f"variable {env_name}, which is missing or empty"
                )
    return problems


def secret_env_names(config: GatewayConfig) -> frozenset[str]:
    """Environment variables that hold the gateway's own credentials: never passed to stdio children
    (``DRAWBRIDGE_*`` never is either, see ``EnvPolicy``)."""
    names = {name for upstream in config.upstreams for name in upstream.headers_env.values()}
    return frozenset(names | set(TRUTH_KEY_NAMES))


def load_decider(config: GatewayConfig) -> PolicyDecider:
    """The native policy engine for ``policy_dir`` or ``policy_file`` (the same decider ``wrap`` uses)."""
    path = config.policy_dir or config.policy_file
    assert path is not None  # the configuration requires one of them
    try:
        return policy_decider(path)
    except (OSError, ValueError) as exc:
        raise _Startup(f"cannot load the policy: {exc}") from exc


def listen_configured(config: GatewayConfig) -> bool:
    """Whether the configuration file has a ``listen`` section (read again: the loaded value has defaults).

    With ``--stdio`` the control plane gets a listener only then, so that an MCP client starting
    several stdio gateways does not make them fight over the default port."""
    from ruamel.yaml import YAML

    try:
        with open(config.source_file, encoding="utf-8") as handle:
            document = YAML(typ="safe").load(handle)
    except (OSError, ValueError) as exc:
        raise _Startup(f"cannot read the configuration again: {exc}") from None
    return isinstance(document, dict) and document.get("listen") is not None


def upstream_of(tool: str) -> str:
    """The surface record's ``server.id`` of a namespaced tool: the upstream's configured name."""
    split = split_namespaced(tool)
    return split[0] if split is not None else "drawbridge"


def load_truth_key(config: GatewayConfig) -> TruthKey | None:
    """The truth producer's key when it is configured; every truth key variable leaves the environment."""
    try:
        if config.tool_decision_truth_out is not None:
            return truth_key_from_env(os.environ)
        for name in TRUTH_KEY_NAMES:
            os.environ.pop(name, None)
        return None
    except TruthKeyError as exc:
        raise _Startup(f"tool-decision truth producer: {exc}") from None


def load_recorder(config: GatewayConfig, decide: PolicyDecider, truth_key: TruthKey | None = None) -> Recorder:
    """The evidence recorder, built as ``wrap`` builds it (``truth_key`` from ``load_truth_key``)."""
    from drawbridge.gateway.recorder import EvidenceRecorder
    from drawbridge.policy.declared import DeclaredContracts

    try:
        return EvidenceRecorder(
            config.evidence_dir,
            route=upstream_of,
            truth_out=config.tool_decision_truth_out,
            truth_key=truth_key,
            declared=DeclaredContracts(lambda: decide.store.current),
            fsync=config.fsync,  # type: ignore[arg-type]
        )
    except (OSError, ValueError) as exc:
        raise _Startup(f"cannot open the evidence output: {exc}") from exc


@click.command(name="serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, metavar="FILE", help="The gateway configuration (YAML).")
@click.option("--stdio", is_flag=True, help="Serve one agent over stdin/stdout instead of HTTP at /mcp.")
@click.option(
    "--agent",
    metavar="ID",
    help="Agent id of the --stdio client (default: auth.anonymous_agent, else 'anonymous').",
)
@click.option("--verbose", "-v", is_flag=True, help="Log connections, reconnections and incidents to stderr.")
def command(config_path: str, stdio: bool, agent: str | None, verbose: bool) -> None:
    """Serve the upstreams of a configuration file behind one gateway.

    \b
    Examples:
      drawbridge serve --config drawbridge.yaml                  # HTTP at http://127.0.0.1:8787/mcp
      drawbridge serve --config drawbridge.yaml --stdio --agent claude
    """
    _configure_logging(verbose)
    if agent is not None and not stdio:
        raise click.UsageError("--agent goes with --stdio; over HTTP the bearer token names the agent")
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_INPUT)
    record: Recorder | None = None
    sock: socket.socket | None = None
    state: StateDB | None = None
    try:
        problems = preflight(config, os.environ)
        if problems:
            raise _Startup("\n".join(problems))
        decide = load_decider(config)
        if not stdio or listen_configured(config):
            from drawbridge.gateway.http_server import bind

            try:
                sock = bind(config.listen_host, config.listen_port)
            except OSError as exc:
                raise _Startup(
                    f"cannot listen on {config.listen_host}:{config.listen_port}: {exc.strerror or exc}"
                ) from exc
        record = load_recorder(config, decide, load_truth_key(config))
        from drawbridge.gateway.services import StartupProblem, open_state

        try:
            state = open_state(config)
        except StartupProblem as exc:
            raise _Startup(str(exc)) from None
        anyio.run(
            _serve, config, decide, record, state, agent or config.anonymous_agent or "anonymous", sock, stdio
        )
    except _Startup as exc:
        click.echo(str(exc) if str(exc).startswith(config.source_file) else f"drawbridge: {exc}", err=True)
        sys.exit(EXIT_INPUT)
    except KeyboardInterrupt:
        pass
    finally:
        close = getattr(record, "close", None)
        if close is not None:
            close()
        if state is not None:
            state.close()
        if sock is not None:
            sock.close()


async def _serve(
    config: GatewayConfig,
    decide: PolicyDecider,
    record: Recorder,
    state: StateDB,
    agent: str,
    sock: socket.socket | None,
    stdio: bool,
) -> None:
    if stdio:
        from drawbridge.gateway.process_stdio import process_stdio

        async with process_stdio() as (client_in, client_out):
            await _run(config, decide, record, state, agent, sock, (client_in, client_out))
    else:
        await _run(config, decide, record, state, agent, sock, None)


async def _run(
    config: GatewayConfig,
    decide: PolicyDecider,
    record: Recorder,
    state: StateDB,
    agent: str,
    sock: socket.socket | None,
    pipes: tuple[Any, Any] | None,
) -> None:
    from drawbridge.gateway.services import build_runtime
    from drawbridge.gateway.upstream_session import UpstreamSession

    denied = secret_env_names(config)
    upstreams = [
        UpstreamSession(u, env_filter=EnvPolicy(extra=dict(u.env), deny_names=denied)) for u in config.upstreams
    ]
    runtime = build_runtime(
        config,
        policy=decide,
        recorder=record,
        state_db=state,
        upstreams=upstreams,
        control_open=sock is not None,
    )
    gateway = runtime.gateway
    failed: list[str] = []
    from drawbridge.policy import watch_policies

    async with anyio.create_task_group() as tg:
        # Edits to the policy take effect on the next call; a broken edit keeps the previous policy.
        tg.start_soon(watch_policies, decide.store)
        tg.start_soon(runtime.announce_policy_changes)
        # Approvals a previous process left pending expire before any call is taken.
        await tg.start(runtime.run_approvals)
        await tg.start(gateway.run)
        tg.start_soon(_stop_on_signal, tg.cancel_scope)
        await gateway.wait_settled(STARTUP_WAIT_SECONDS)
        failed = gateway.start_errors()
        if failed:
            tg.cancel_scope.cancel()
        else:
            for upstream in upstreams:
                if not upstream.ready:
                    click.echo(
                        f"drawbridge: {upstream.unavailable_reason()}; retrying in the background", err=True
                    )
            if pipes is not None:
                from drawbridge.gateway.downstream_stdio import serve_stdio_session

                if sock is not None:
                    tg.start_soon(_serve_control_plane, runtime, sock)
                await serve_stdio_session(
                    gateway, pipes[0], pipes[1], agent=agent, max_message_bytes=config.max_message_bytes
                )
            else:
                assert sock is not None
                from drawbridge.gateway.http_server import HttpSettings, build_app, describe_url, serve_http

                app = build_app(gateway, HttpSettings.from_config(config), routes=runtime.control_routes())

                def ready(host: str, port: int) -> None:
                    click.echo(
                        f"drawbridge: serving {len(upstreams)} upstream(s) on {describe_url(host, port)}", err=True
                    )

                await serve_http(app, sock, ready)
            tg.cancel_scope.cancel()
    if failed:
        raise _Startup("\n".join(failed))


async def _serve_control_plane(runtime: Any, sock: socket.socket) -> None:
    """With ``--stdio``: the control plane alone on the configured listener (no ``/mcp``)."""
    from drawbridge.control import control_app
    from drawbridge.gateway.http_server import serve_http

    app = control_app(runtime.control_services(), admin_token_sha256=runtime.config.admin_token_sha256)

    def ready(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"drawbridge: control plane on http://{shown}:{port}", err=True)

    await serve_http(app, sock, ready)


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return
