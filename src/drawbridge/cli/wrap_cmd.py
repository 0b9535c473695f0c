"""``drawbridge wrap``: run an MCP server behind the gateway, over stdio.

An MCP client launches ``drawbridge wrap [options] -- <server command...>`` in place of the server.
The gateway spawns the server as its child, relays every message unchanged, and decides each
``tools/call`` before it reaches the server.

Invariant: with no ``--policy`` and no ``--allow-all``, every tools/call is refused (fail closed);
``--allow-all`` is the only way to forward without a policy, and it must be asked for. A policy is
watched while the gateway runs: a valid edit applies to the next call, an invalid one is reported on
stderr and the previous policy stays. ``--shadow-policy`` (with ``--policy`` only) is decided beside it on
every call and only reported, never enforced (``gateway.pipeline.shadow``).

The runtime is the one serve builds (``gateway.runtime``): the same pipeline decides every call, with
the same floors and the same fail-closed rules. Calls are resolved in the server's own tool
catalogue, which the gateway lists itself: a name the server does not list is refused. With
``--pin-tools`` that catalogue is pinned in the state file (trust on first use), and a tool that
changed needs a person, a new one is denied, as under ``serve``'s ``pin_tools``; the agent's
``tools/list`` shows a changed tool as pinned and a new one not at all. ``--pin-prompts`` does the same
for the server's prompts (``prompts/list`` shows only accepted definitions, and ``prompts/get`` of a
changed or new prompt is refused), separately from ``--pin-tools``.

Human approval (``human_approval`` rules; ``gateway.pipeline.approvals``). The queue, grants and approval
memory live in the SQLite file ``--state`` (default: ``drawbridge.db`` inside ``--evidence-dir``, so
that it is never the ``./drawbridge.db`` of a ``drawbridge serve`` started beside it; without either
option, a private temporary file removed at exit, so nothing outlives the run). A person is
reached in-band when the client supports elicitation, and through the control plane when
``--control-port`` serves it on 127.0.0.1 (for ``drawbridge approvals approve`` and ``drawbridge
grants create``; it needs the admin token: ``DRAWBRIDGE_ADMIN_TOKEN`` if set, else the one the gateway
keeps in ``<state>.admin-token`` beside the state file, whose path it prints). A ``--state`` file shared with another gateway counts as a channel too: that gateway's
control plane resolves what this one waits for. With no channel at all, a call that needs approval is
refused at once (after grants and memory). ``--notify-url-env NAME`` posts each question this gateway opens to a
webhook (``approvals.notify``, serve's ``approval.notify``); the variable never reaches the server.

Start-up order: the server is started as soon as the command line is read, and the gateway imports
and builds its runtime while the server starts (a few tenths of a second each, which would otherwise
add up). The server hears nothing before the gateway is up; if the gateway then cannot start (a policy
that does not load, an evidence directory in use), the server is stopped without having been sent a
line. What can be seen to fail without the gateway's imports (the truth producer's key or sink) is
not started early: the gateway reports it as before, and the server is never started.

Exit codes: 0 when the client closed the connection, or after SIGINT or SIGTERM (calls in flight
recorded, the run sealed: ``runtime.wrap``); 2 for a usage error or an upstream command that
cannot be started (message on stderr; nothing is ever written to stdout but protocol lines).
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import click
from click.core import ParameterSource

from drawbridge.cli.log_format import announce, configure_logging, log_format_option, startup_failed
from drawbridge.cli.output import EXIT_INPUT, agent_id
from drawbridge.cli.seconds import Seconds
from drawbridge.config_guards import load_result_guards
from drawbridge.config_reader import ConfigError
from drawbridge.config_secrets import TOKEN_RULE, is_token
from drawbridge.gateway.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES
from drawbridge.gateway.recording.cadence import EVERY_LINES, EVERY_SECONDS
from drawbridge.gateway.recording.durability import BATCH_LINES, BATCH_SECONDS
from drawbridge.gateway.recording.truth_key import ALL_NAMES as TRUTH_KEY_NAMES
from drawbridge.gateway.recording.truth_key import TruthKeyError, truth_key_from_env
from drawbridge.gateway.upstreams.child_spawn import EnvPolicy, SpawnedChild, Upstream, UpstreamStartError, spawn_child

if TYPE_CHECKING:
    from drawbridge.config_notify import NotifyTarget
    from drawbridge.gateway.runtime.assembly import Runtime
    from drawbridge.gateway.transports.relay_requests import RelayConfig

# Only what the command line needs is imported above: the gateway itself (parser, pipeline, recorder,
# runtime) is imported in ``command``, after the server has been started.


def _service_name(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """``--service-name`` held to serve's ``telemetry.service_name`` rule (imported here: the config
    readers are not needed to start the server)."""
    from drawbridge.config_evidence import service_name_problem

    if (problem := service_name_problem(value)) is not None:
        raise click.BadParameter(problem)
    return value


MAX_SERVER_ID_CHARS = 128


def _server_id(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--server-id`` is written into every surface record and decision line: a line break, an escape
    sequence or a blank in it would make a record read as something else, so only a printable word
    of bounded length is taken."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter("the server id is empty")
    if len(value) > MAX_SERVER_ID_CHARS:
        raise click.BadParameter(f"the server id is longer than {MAX_SERVER_ID_CHARS} characters")
    if not value.isprintable() or any(char.isspace() for char in value):
        raise click.BadParameter("the server id holds whitespace, a line break or a control or format character")
    return value


@click.command(
    name="wrap",
    context_settings={"help_option_names": ["-h", "--help"], "allow_interspersed_args": False},
)
@click.option("--policy", type=click.Path(exists=True), help="Policy file or directory that decides each tools/call.")
@click.option("--shadow-policy", type=click.Path(exists=True),
              help="Policy file or directory decided beside --policy on each tools/call and only reported "
              "(the decision line, /shadow, /metrics), never enforced.")
@click.option("--agent", default="anonymous", show_default=True, callback=agent_id,
              help="Agent id the policy is evaluated for.")
@click.option("--evidence-dir", type=click.Path(file_okay=False), help="Directory for the trace and evidence.")
@click.option(
    "--tool-decision-truth-out",
    type=click.Path(dir_okay=False),
    help="File to write tool-decision truth carriers to.",
)
@click.option(
    "--fsync",
    type=click.Choice(["always", "batch", "never"]),
    default="batch",
    show_default=True,
    help="When evidence reaches the disk (it always reaches the OS before the call is answered): "
    f"before each answer; every {BATCH_LINES} records and within {BATCH_SECONDS:g} second; or when the OS decides.",
)
@click.option(
    "--server-id",
    callback=_server_id,
    help="The upstream's id in surface records (default: the server command's file name); printable, "
    f"without whitespace, at most {MAX_SERVER_ID_CHARS} characters.",
)
@click.option("--allow-all", "allow_everything", is_flag=True, help="Forward every tools/call (no policy).")
@click.option(
    "--call-timeout",
    type=Seconds(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds a forwarded request (a tools/call or any other but initialize) may wait for the server's answer before "
    "the agent gets a timeout error (-32001).",
)
@click.option(
    "--max-message-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    help="Largest message accepted from the agent.",
)
@click.option(
    "--max-depth",
    type=click.IntRange(min=2, max=512),
    default=64,
    show_default=True,
    help="How deep a message from the agent may nest arrays and objects.",
)
@click.option(
    "--max-upstream-message-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
    show_default=True,
    help="Largest message accepted from the server.",
)
@click.option(
    "--approval-timeout",
    type=Seconds(min=0, min_open=True, max=7 * 24 * 3600),
    default=300.0,
    show_default=True,
    help="Seconds a person has to approve a call before it is denied.",
)
@click.option(
    "--non-blocking-approvals",
    is_flag=True,
    help="When the client cannot be asked in-band, answer at once with the approval id; the retried "
    "call runs once approved.",
)
@click.option("--no-elicitation", is_flag=True, help="Never ask for approval in-band, even if the client can.")
@click.option(
    "--approval-memory",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Approve automatically after this many operator approvals (and no denial) of the same tool and "
    "argument shape; never for generic tools, changed pins or `approval: operator` rules; 0: off.",
)
@click.option(
    "--notify-url-env",
    "notify_url_envs",
    multiple=True,
    metavar="NAME",
    help="Post each pending approval (never an argument value) to the webhook whose URL the environment "
    "variable NAME holds: https, http only to a loopback host. Repeatable.",
)
@click.option(
    "--notify-format",
    type=click.Choice(["json", "slack"]),
    default="json",
    show_default=True,
    help="What --notify-url-env posts: a JSON object, or Slack's {\"text\": ...}.",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False),
    help="SQLite file for approvals, grants and approval memory (default: drawbridge.db inside "
    "--evidence-dir, else a private temporary file removed at exit).",
)
@click.option(
    "--control-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve the control plane (approvals, grants, the server's tools and their decisions) on "
    "127.0.0.1 at this port (0: any free port).",
)
@click.option(
    "--pin-tools",
    is_flag=True,
    help="Pin the server's tool catalogue in the state file (trust on first use): a changed tool needs a "
    "person and is listed as pinned, a new one is denied and not listed, until the change is accepted "
    "(drawbridge pins accept).",
)
@click.option(
    "--result-guards",
    "result_guards_file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A YAML file holding a result_guards list (docs/configuration.md): secrets redacted from tool "
    "results, and results held to a size.",
)
@click.option(
    "--pin-prompts",
    is_flag=True,
    help="Pin the server's prompts in the state file (trust on first use): a changed prompt is listed as "
    "pinned and a new one is not listed, and getting either is refused, until the change is accepted "
    "(drawbridge pins accept --kind prompt).",
)
@click.option(
    "--checkpoint-every-lines",
    type=click.IntRange(min=1),
    default=EVERY_LINES,
    show_default=True,
    help="Sign a checkpoint of the trace once this many lines wait for one (with --evidence-dir).",
)
@click.option(
    "--checkpoint-every-seconds",
    type=Seconds(min=0, min_open=True, max=86400),
    default=EVERY_SECONDS,
    show_default=True,
    help="Sign a checkpoint at most this many seconds after a trace line was written.",
)
@click.option(
    "--keys-dir",
    type=click.Path(file_okay=False),
    help="Where the evidence signing keys live (made at first start; default: keys inside --evidence-dir).",
)
@click.option("--otlp-endpoint", metavar="URL", help="Send live telemetry (spans, metrics, checkpoints) over OTLP to this "
              "collector (http://host:4318 for http/protobuf, http://host:4317 for grpc).")
@click.option("--otlp-protocol", type=click.Choice(["http/protobuf", "grpc"]), default="http/protobuf", show_default=True,
              help="The OTLP transport.")
@click.option("--otlp-header", "otlp_headers", multiple=True, metavar="NAME=ENV_VAR",
              help="A header sent to the collector, its value read from the environment variable ENV_VAR. Repeatable.")
@click.option("--service-name", default="drawbridge", show_default=True, callback=_service_name,
              help="The telemetry's service.name.")
@click.option("--verbose", "-v", is_flag=True,
              help="Also log informational events: one line per decision, policy reloads, shutdown.")
@log_format_option
@click.argument("server_command", nargs=-1, required=True, type=click.UNPROCESSED)
def command(
    policy: str | None,
    shadow_policy: str | None,
    agent: str,
    evidence_dir: str | None,
    tool_decision_truth_out: str | None,
    fsync: str,
    server_id: str | None,
    allow_everything: bool,
    call_timeout: float,
    max_message_bytes: int,
    max_depth: int,
    max_upstream_message_bytes: int,
    approval_timeout: float,
    non_blocking_approvals: bool,
    no_elicitation: bool,
    approval_memory: int,
    notify_url_envs: tuple[str, ...],
    notify_format: str,
    state_path: str | None,
    control_port: int | None,
    pin_tools: bool,
    result_guards_file: str | None,
    pin_prompts: bool,
    checkpoint_every_lines: int,
    checkpoint_every_seconds: float,
    keys_dir: str | None,
    otlp_endpoint: str | None,
    otlp_protocol: str,
    otlp_headers: tuple[str, ...],
    service_name: str,
    verbose: bool,
    log_format: str,
    server_command: tuple[str, ...],
) -> None:
    """Run SERVER_COMMAND as a stdio MCP server behind the gateway.

    \b
    Example (in an MCP client's configuration):
      drawbridge wrap --policy policies/ --agent claude -- npx -y @modelcontextprotocol/server-github
    """
    configure_logging(verbose, log_format, quiet_activity=True)
    if policy is not None and allow_everything:
        raise click.UsageError("--policy and --allow-all exclude each other")
    if shadow_policy is not None and (allow_everything or policy is None):
        what = "and --allow-all exclude each other" if allow_everything else "needs --policy"
        raise click.UsageError(f"--shadow-policy {what}: the shadow is decided beside an enforced policy")
    approval_only = {
        "--control-port": control_port is not None, "--non-blocking-approvals": non_blocking_approvals,
        "--approval-memory": approval_memory > 0, "--notify-url-env": bool(notify_url_envs),
    }
    if policy is None and (given := [name for name, used in approval_only.items() if used]):
        raise click.UsageError(f"{given[0]} needs --policy (approvals come from human_approval rules)")
    format_given = click.get_current_context().get_parameter_source("notify_format") is not ParameterSource.DEFAULT
    if format_given and not notify_url_envs:
        raise click.UsageError("--notify-format needs --notify-url-env (the webhook it says what to post to)")
    if policy is None and not allow_everything:
        click.echo("drawbridge: no --policy given: every tools/call will be refused", err=True)
    result_guards = None
    if result_guards_file is not None:
        try:
            result_guards = load_result_guards(result_guards_file)
        except ConfigError as exc:
            startup_failed(f"drawbridge: {exc}")
            sys.exit(EXIT_INPUT)
    label = server_id or os.path.basename(server_command[0]) or "upstream"
    header_names = _telemetry_header_names(otlp_endpoint, otlp_headers)
    notify = _notify_targets(notify_url_envs, notify_format)
    withheld = frozenset(TRUTH_KEY_NAMES) | frozenset(target.url_env for target in notify)
    admin_token = os.environ.pop(ADMIN_TOKEN_ENV, None) or None  # never passed on to the server
    if control_port is not None and admin_token is not None and not is_token(admin_token):
        startup_failed(f"drawbridge: environment variable {ADMIN_TOKEN_ENV} does not hold a token ({TOKEN_RULE})")
        sys.exit(EXIT_INPUT)
    # The gateway's credentials stay its own: the truth producer's key, the collector's headers, the webhooks.
    env_filter = EnvPolicy(deny_names=withheld | frozenset(header_names.values()))
    server: SpawnedChild | str | None = None
    if _may_start_early(tool_decision_truth_out):
        try:
            server = spawn_child(list(server_command), env_filter=env_filter)
        except UpstreamStartError as exc:
            server = str(exc)  # reported once the runtime is up, as it always was
    try:
        # The gateway is imported and built while the server starts.
        from drawbridge.gateway.recording.checkpoints import CheckpointSettings
        from drawbridge.gateway.recording.telemetry import TelemetrySettings
        from drawbridge.gateway.runtime.assembly import Runtime, StartupProblem
        from drawbridge.gateway.runtime.settings import RuntimeSettings
        from drawbridge.gateway.transports.relay_requests import RelayConfig

        telemetry = None
        if otlp_endpoint is not None:
            telemetry = TelemetrySettings(otlp_endpoint, otlp_protocol, header_names, service_name,
                                          withheld_env=withheld)
        settings = RuntimeSettings.for_wrap(
            policy=policy,
            shadow_policy=shadow_policy,
            allow_all=allow_everything,
            evidence_dir=evidence_dir,
            truth_out=tool_decision_truth_out,
            fsync=fsync,
            state_path=state_path,
            call_timeout=call_timeout,
            approval_timeout=approval_timeout,
            non_blocking=non_blocking_approvals,
            elicitation=not no_elicitation,
            approval_memory=approval_memory,
            notify=notify,
            control_open=control_port is not None,
            pin_tools=pin_tools,
            pin_prompts=pin_prompts,
            admin_token_sha256=hashlib.sha256(admin_token.encode("utf-8")).hexdigest() if admin_token else None,
            server_id=label,
            checkpoints=CheckpointSettings(checkpoint_every_lines, checkpoint_every_seconds),
            keys_dir=keys_dir,
            telemetry=telemetry,
            result_guards=result_guards,
        )
        config = RelayConfig(
            agent=agent,
            max_message_bytes=max_message_bytes,
            max_upstream_message_bytes=max_upstream_message_bytes,
            max_depth=max_depth,
            server_id=label,
        )
        sock: socket.socket | None = None
        runtime: Runtime | None = None
        try:
            runtime = Runtime.build(settings)
            if control_port is not None:
                from drawbridge.gateway.transports.http_listener import bind  # the web stack, only when served

                try:
                    sock = bind("127.0.0.1", control_port)
                except OSError as exc:
                    raise StartupProblem(f"cannot listen on 127.0.0.1:{control_port}: {exc.strerror or exc}") from exc
            problem = anyio.run(_serve, runtime, Upstream(list(server_command), env_filter, server), config, sock)
        except StartupProblem as exc:
            problem = str(exc)
        except KeyboardInterrupt:
            return
        finally:
            if sock is not None:
                sock.close()
            if runtime is not None:
                runtime.close()
    finally:
        if isinstance(server, SpawnedChild):
            server.stop()  # the server of a gateway that did not start (the relay stops its own)
    if problem is not None:
        startup_failed(f"drawbridge: {problem}")
        sys.exit(EXIT_INPUT)


ADMIN_TOKEN_ENV = "DRAWBRIDGE_ADMIN_TOKEN"


def _may_start_early(truth_out: str | None) -> bool:
    """False when a check the runtime makes is already seen to fail: the truth producer's key (read from
    a copy of the environment) or its sink (a directory, or in a directory that does not exist)."""
    if truth_out is None:
        return True
    try:
        truth_key_from_env(dict(os.environ))
    except TruthKeyError:
        return False
    path = Path(truth_out)
    return not path.is_dir() and path.parent.is_dir()


def _telemetry_header_names(endpoint: str | None, headers: tuple[str, ...]) -> dict[str, str]:
    """The collector's header names and the variables that hold their values (checked)."""
    if endpoint is None:
        if headers:
            raise click.UsageError("--otlp-header goes with --otlp-endpoint")
        return {}
    from drawbridge.config_evidence import otlp_endpoint_problem, telemetry_header_problem

    if (problem := otlp_endpoint_problem(endpoint)) is not None:
        raise click.BadParameter(problem, param_hint="--otlp-endpoint")
    names: dict[str, str] = {}
    for item in headers:
        name, separator, variable = item.partition("=")
        if not separator:
            # Not repeated: ``Authorization: Bearer ...`` is the credential itself, written in place.
            raise click.BadParameter(
                "the value given is not NAME=ENV_VAR (a header name, '=', and the environment variable that "
                "holds the header's value, never the value itself)", param_hint="--otlp-header",
            )
        # serve's check of its telemetry headers: the value is read here, checked, never shown.
        if (problem := telemetry_header_problem(name, variable, os.environ)) is not None:
            startup_failed(f"drawbridge: --otlp-header: {problem}")
            sys.exit(EXIT_INPUT)
        names[name] = variable
    return names


def _notify_targets(names: tuple[str, ...], form: str) -> tuple[NotifyTarget, ...]:
    """``--notify-url-env``: serve's ``approval.notify`` targets, each variable held to its rule; a
    problem stops the start in one line naming the variable, never its value."""
    from drawbridge.config_notify import NotifyTarget, url_env_problem

    for name in names:
        if (problem := url_env_problem(name, os.environ, subject="the value given")) is not None:
            startup_failed(f"drawbridge: --notify-url-env: {problem}")
            sys.exit(EXIT_INPUT)
    return tuple(NotifyTarget(name, os.environ[name], form) for name in dict.fromkeys(names))


async def _serve(runtime: Runtime, server: Upstream, config: RelayConfig, sock: socket.socket | None) -> str | None:
    def ready(host: str, port: int) -> None:
        from drawbridge.gateway.runtime.control import control_url, credential_note

        announce(f"control plane on {control_url(host, port)} ({credential_note(runtime)})")

    from drawbridge.gateway.runtime.wrap import run_wrap

    return await run_wrap(runtime, server, config, control=sock, on_control_ready=ready)
