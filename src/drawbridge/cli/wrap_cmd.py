"""``drawbridge wrap``: run an MCP server behind the gateway, over stdio.

An MCP client launches ``drawbridge wrap [options] -- <server command...>`` in place of the server.
The gateway spawns the server as its child, relays every message unchanged, and decides each
``tools/call`` before it reaches the server.

Invariant: with no ``--policy`` and no ``--allow-all``, every tools/call is refused (fail closed);
``--allow-all`` is the only way to forward without a policy, and it must be asked for. A policy is
watched while the gateway runs: a valid edit applies to the next call, an invalid one is reported on
stderr and the previous policy stays.

Human approval (``human_approval`` rules; ``gateway.approvals``). The queue, grants and approval
memory live in the SQLite file ``--state`` (default: ``drawbridge.db`` next to ``--evidence-dir``, in
its parent directory, as ``drawbridge serve`` keeps ``./drawbridge.db`` beside ``./evidence``; without
either option, a private temporary file removed at exit, so nothing outlives the run). A person is
reached in-band when the client supports elicitation, and through the control plane when
``--control-port`` serves it on 127.0.0.1 (for ``drawbridge approvals approve`` and ``drawbridge
grants create``; if ``DRAWBRIDGE_ADMIN_TOKEN`` is set, that token is required, else loopback callers
are served). A ``--state`` file shared with another gateway counts as a channel too: that gateway's
control plane resolves what this one waits for. With no channel at all, a call that needs approval is
refused at once (after grants and memory).

Exit codes: 0 when the client closed the connection; 2 for a usage error or an upstream command that
cannot be started (message on stderr; nothing is ever written to stdout but protocol lines).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import click

from drawbridge.cli.output import EXIT_INPUT, InputError
from drawbridge.gateway.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES
from drawbridge.gateway.pipeline import (
    Decider,
    PolicyDecider,
    Recorder,
    allow_all,
    deny_all,
    null_recorder,
    policy_decider,
)
from drawbridge.gateway.stdio_relay import RelayConfig, serve_stdio
from drawbridge.gateway.truth_key import ALL_NAMES as TRUTH_KEY_NAMES
from drawbridge.gateway.truth_key import TruthKeyError, truth_key_from_env
from drawbridge.gateway.upstream import EnvPolicy, UpstreamStartError


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("drawbridge: %(levelname)s %(message)s"))
    log = logging.getLogger("drawbridge")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    log.propagate = False


def _decider(policy: str | None, allow_everything: bool) -> Decider:
    if policy is not None and allow_everything:
        raise click.UsageError("--policy and --allow-all exclude each other")
    if allow_everything:
        return allow_all
    if policy is None:
        click.echo("drawbridge: no --policy given: every tools/call will be refused", err=True)
        return deny_all
    try:
        return policy_decider(policy)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load policy {policy}: {exc}") from exc


def _recorder(
    decide: Decider,
    evidence_dir: str | None,
    truth_out: str | None,
    fsync: str,
    server_id: str,
    allow_everything: bool,
) -> Recorder:
    """The evidence recorder; key material is read (and removed from the environment) first."""
    # The truth producer's key never reaches the upstream, whether or not the producer is on.
    truth_key = None
    try:
        if truth_out is not None:
            truth_key = truth_key_from_env(os.environ)
        else:
            for name in TRUTH_KEY_NAMES:
                os.environ.pop(name, None)
    except TruthKeyError as exc:
        raise InputError(f"tool-decision truth producer: {exc}") from None
    if evidence_dir is None and truth_out is None:
        return null_recorder
    from drawbridge.gateway.recorder import EvidenceRecorder
    from drawbridge.policy.declared import DeclaredContracts, fixed_contract

    if isinstance(decide, PolicyDecider):
        declared: Callable[[str], Mapping[str, Any]] = DeclaredContracts(lambda: decide.store.current)
    else:
        contract = fixed_contract(allow_everything)
        declared = lambda agent: contract  # noqa: E731 -- one constant contract
    try:
        return EvidenceRecorder(
            evidence_dir,
            route=lambda tool: server_id,
            truth_out=truth_out,
            truth_key=truth_key,
            declared=declared,
            fsync=fsync,  # type: ignore[arg-type]
        )
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot open evidence output: {exc}") from exc


@click.command(
    name="wrap",
    context_settings={"help_option_names": ["-h", "--help"], "allow_interspersed_args": False},
)
@click.option("--policy", type=click.Path(exists=True), help="Policy file or directory that decides each tools/call.")
@click.option("--agent", default="anonymous", show_default=True, help="Agent id the policy is evaluated for.")
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
    "before each answer; every 64 records and within 1 second; or when the OS decides.",
)
@click.option(
    "--server-id",
    help="The upstream's id in surface records (default: the server command's file name).",
)
@click.option("--allow-all", "allow_everything", is_flag=True, help="Forward every tools/call (no policy).")
@click.option(
    "--call-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds a forwarded tools/call may take before the agent gets a timeout error.",
)
@click.option(
    "--max-message-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    help="Largest message accepted from the agent.",
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
    type=click.FloatRange(min=0, min_open=True, max=7 * 24 * 3600),
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
    default=3,
    show_default=True,
    help="Approve automatically after this many approvals (and no denial) of the same tool and argument "
    "shape; 0 switches approval memory off.",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False),
    help="SQLite file for approvals, grants and approval memory (default: drawbridge.db next to "
    "--evidence-dir).",
)
@click.option(
    "--control-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve the control plane (approvals, grants) on 127.0.0.1 at this port (0: any free port).",
)
@click.option("--verbose", "-v", is_flag=True, help="Also log informational events (policy reloads, shutdown).")
@click.argument("server_command", nargs=-1, required=True, type=click.UNPROCESSED)
def command(
    policy: str | None,
    agent: str,
    evidence_dir: str | None,
    tool_decision_truth_out: str | None,
    fsync: str,
    server_id: str | None,
    allow_everything: bool,
    call_timeout: float,
    max_message_bytes: int,
    max_upstream_message_bytes: int,
    approval_timeout: float,
    non_blocking_approvals: bool,
    no_elicitation: bool,
    approval_memory: int,
    state_path: str | None,
    control_port: int | None,
    verbose: bool,
    server_command: tuple[str, ...],
) -> None:
    """Run SERVER_COMMAND as a stdio MCP server behind the gateway.

    \b
    Example (in an MCP client's configuration):
      drawbridge wrap --policy policies/ --agent claude -- npx -y @modelcontextprotocol/server-github
    """
    _configure_logging(verbose)
    decide = _decider(policy, allow_everything)
    if control_port is not None and not isinstance(decide, PolicyDecider):
        raise click.UsageError("--control-port needs --policy (approvals come from human_approval rules)")
    label = server_id or os.path.basename(server_command[0]) or "upstream"
    admin_token = os.environ.pop(ADMIN_TOKEN_ENV, None) or None  # never passed on to the server
    record = _recorder(decide, evidence_dir, tool_decision_truth_out, fsync, label, allow_everything)
    config = RelayConfig(
        agent=agent,
        max_message_bytes=max_message_bytes,
        max_upstream_message_bytes=max_upstream_message_bytes,
        call_timeout=call_timeout,
    )
    approvals: _Approvals | None = None
    try:
        if isinstance(decide, PolicyDecider):
            from drawbridge.approval.memory import MemoryConfig
            from drawbridge.gateway.approvals import ApprovalSettings

            settings = ApprovalSettings(
                timeout_seconds=approval_timeout,
                non_blocking=non_blocking_approvals,
                elicitation=not no_elicitation,
                memory=MemoryConfig(enabled=approval_memory > 0, min_approvals=max(approval_memory, 1)),
            )
            approvals = _approvals(
                decide, record, settings, state_path, evidence_dir, control_port, admin_token
            )
        gate: Decider = approvals.gate if approvals is not None else decide
        problem = anyio.run(_serve, list(server_command), decide, gate, record, config, approvals)
    except KeyboardInterrupt:
        return
    finally:
        if approvals is not None:
            approvals.close()
        close = getattr(record, "close", None)
        if close is not None:
            close()
    if problem is not None:
        click.echo(f"drawbridge: {problem}", err=True)
        sys.exit(EXIT_INPUT)


ADMIN_TOKEN_ENV = "DRAWBRIDGE_ADMIN_TOKEN"
STATE_FILE = "drawbridge.db"


@dataclass
class _Approvals:
    """The approval engine of this wrap, its state file, and the control plane's socket (if any)."""

    gate: Any
    db: Any
    temp_dir: str | None
    sock: socket.socket | None
    admin_token_sha256: str | None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.db.close()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _approvals(
    decide: PolicyDecider,
    record: Recorder,
    settings: Any,
    state_path: str | None,
    evidence_dir: str | None,
    control_port: int | None,
    admin_token: str | None,
) -> _Approvals:
    """Open the state, build the engine and its gate, and bind the control port (before anything runs)."""
    from drawbridge.gateway.approvals import ApprovalGate, build_approval_engine, trace_appender
    from drawbridge.state.sqlite import StateDB, StateError

    temp_dir = None
    if state_path is not None:
        path = Path(state_path)
    elif evidence_dir is not None:
        path = Path(evidence_dir).absolute().parent / STATE_FILE
    else:
        temp_dir = tempfile.mkdtemp(prefix="drawbridge-wrap-")
        path = Path(temp_dir) / STATE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = StateDB.open(path)
    except (OSError, StateError) as exc:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise InputError(f"cannot open the approval state {path}: {exc}") from exc
    sock = None
    try:
        engine = build_approval_engine(settings, db, trace_appender(record))
        if control_port is not None:
            from drawbridge.gateway.http_server import bind

            try:
                sock = bind("127.0.0.1", control_port)
            except OSError as exc:
                raise InputError(f"cannot listen on 127.0.0.1:{control_port}: {exc.strerror or exc}") from exc
    except BaseException:
        db.close()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    # A person outside the client: this wrap's control plane, or a gateway sharing the state file.
    operator_channel = control_port is not None or state_path is not None
    gate = ApprovalGate(decide, engine, elicitation=settings.elicitation, operator_channel=operator_channel)
    digest = hashlib.sha256(admin_token.encode("utf-8")).hexdigest() if admin_token else None
    return _Approvals(gate, db, temp_dir, sock, digest)


async def _serve(
    argv: list[str],
    policy: Decider,
    decide: Decider,
    record: Recorder,
    config: RelayConfig,
    approvals: _Approvals | None = None,
) -> str | None:
    """Serve until the client closes; returns why the upstream could not start, if it could not."""
    async with anyio.create_task_group() as tg:
        if isinstance(policy, PolicyDecider):
            from drawbridge.policy import watch_policies

            # Edits to the policy take effect on the next call; a broken edit keeps the previous policy.
            tg.start_soon(watch_policies, policy.store)
        if approvals is not None:
            from drawbridge.gateway.approvals import run_approvals

            # Before any call: what a previous run left pending is expired, never approved.
            await tg.start(run_approvals, approvals.gate.engine)
            if approvals.sock is not None:
                from drawbridge.control import RecentCallRing
                from drawbridge.gateway.services import RecordingTap

                # The approval view shows the agent's recent calls: the recorder feeds them.
                recent = RecentCallRing()
                tg.start_soon(_control_plane, policy, approvals, record, recent)  # the trace: the recorder's own
                record = RecordingTap(record, recent)
        try:
            env_filter = EnvPolicy(deny_names=frozenset(TRUTH_KEY_NAMES))
            await serve_stdio(argv, decide=decide, record=record, config=config, env_filter=env_filter)
        except UpstreamStartError as exc:
            return str(exc)
        finally:
            tg.cancel_scope.cancel()
    return None


async def _control_plane(policy: Decider, approvals: _Approvals, record: Recorder, recent: Any) -> None:
    """The control plane's routes on the bound loopback socket (approvals, grants, policies)."""
    from drawbridge.control import ControlServices, control_app
    from drawbridge.gateway.approvals import trace_appender
    from drawbridge.gateway.http_server import serve_http

    assert isinstance(policy, PolicyDecider) and approvals.sock is not None
    services = ControlServices(
        policy_store=policy.store,
        catalogue=lambda: [],  # the relay keeps no catalogue; tools are the server's own
        approvals=approvals.gate.engine,
        trace_append=trace_appender(record),
        recent_calls=recent,
    )
    app = control_app(services, admin_token_sha256=approvals.admin_token_sha256)

    def ready(host: str, port: int) -> None:
        click.echo(f"drawbridge: control plane on http://{host}:{port}", err=True)

    await serve_http(app, approvals.sock, ready)
